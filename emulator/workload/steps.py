"""A layer pass's vocabulary: its steps (:class:`Kernel`, :class:`Comm`), the per-GPU shape of the layer they
are made for (:class:`LayerShape`), and the constructors of its GEMM, element-wise and fused-attention kernels.

layer.py builds the passes of a layer from them; userbuffers.py rewrites the TP linear layers' steps as
Transformer Engine's Userbuffers run them; the builder and kernel_cost.py read them.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from emulator.devices import compute

FWD, BWD, RECOMPUTE = "fwd", "bwd", "recompute"


@dataclass(frozen=True)
class Kernel:
    """One compute kernel. kind: gemm | elementwise | flash | cast (an FP8 cast, memory-bound) | copy (a token copy
    or transpose, memory-bound) | scan (a Mamba-2 chunked scan: mixer.py; a gated delta rule: delta_net.py) | sparse
    (DeepSeek Sparse Attention's indexer and core: sparse_attention.py) | host."""

    name: str
    kind: str
    flops: float
    bytes: float
    category: str = FWD
    m: int = 0
    n: int = 0
    k: int = 0
    batch: int = 1
    causal: bool = False  # flash
    backward: bool = False  # flash
    head_dim: int = 0  # flash
    dtype: int = 2  # bytes per element of a gemm's or flash kernel's operands (training.precision)
    grouped: bool = False  # an MoE grouped GEMM (its ``batch`` = the local experts)
    fa2: bool = False  # flash: FlashAttention-2's kernel instead of cuDNN's (training.attention: fa2)
    slow: float = 1.0  # its time × this: fewer SMs while DeepEP's kernels (dispatch.py) or Userbuffers hold some
    seconds: float = 0.0  # kind host: a fixed host-side stall of the stream (MoE host sync)
    quant: str = ""  # a quantised GEMM's (dtype 1) precision: fp8 | mxfp8 | nvfp4; "": fp8; flash: FP8 attention's


@dataclass(frozen=True)
class Comm:
    """A communication inside a layer pass.

    group: tp | cp | ep | etp (the experts' own tensor parallelism). collective: all_reduce |
    all_gather | reduce_scatter | all_to_all | ring (a CP ring step: send to the next CP rank,
    receive from the previous).
    ``bytes`` is the nccl-tests buffer size S. ``overlap`` is the number of following
    kernels that run concurrently with it (0: the next kernel waits for it).
    """

    name: str
    group: str
    collective: str
    bytes: float
    overlap: int = 0
    category: str = FWD


Step = Kernel | Comm


@dataclass(frozen=True)
class LayerShape:
    """Everything one GPU's share of one layer's cost depends on."""

    b: int  # micro-batch
    s: int  # tokens of the sequence on this CP rank (seq_len / cp)
    s_kv: int  # full sequence length (keys attended to)
    h: int
    heads: int
    kv_heads: int
    ffn: int
    swiglu: bool
    biases: bool
    dropout: bool
    t: int = 1
    sp: bool = False
    cp: int = 1
    experts: int = 0
    top_k: int = 0
    ep: int = 1
    dtype: int = 2
    flash: bool = False
    causal: bool = True
    activation: str = "gelu"  # gelu | swiglu | squared_relu (the element-wise op between the MLP GEMMs)
    expert_ffn: int = 0  # one routed expert's width; 0: ffn
    shared_ffn: int = 0  # the shared experts' summed width; 0: none
    imbalance: float = 1.0  # tokens of the busiest expert / the mean
    load: float = 0.0  # the busiest EP rank's routed tokens / the mean, from a measured distribution; 0: imbalance
    q_rank: int = 0  # MLA query rank (0: a full query projection)
    kv_rank: int = 0  # MLA key/value rank; 0: standard attention
    rope_dim: int = 0  # MLA decoupled rope dims per head
    qk_head: int = 0  # MLA query/key dims per head (d_n + d_r); 0: d
    v_head: int = 0  # MLA value dims per head; 0: d
    fp8: bool = False  # Transformer Engine quantised GEMMs (fp8, mxfp8, nvfp4): the linear layers', with their casts
    recipe: str = ""  # with fp8: delayed | tensorwise | blockwise | mxfp8 | nvfp4 (recipe_of); "": delayed
    non_tn: bool = False  # the GPU's FP8 GEMMs take every layout (Blackwell): per-tensor FP8 makes no transposes
    fp8_weight_bytes: float = 0.0  # bytes per weight element per micro-batch of the step's weight cast
    fa2: bool = False  # fused attention by FlashAttention-2's kernels (training.attention: fa2), not cuDNN's
    fp8_dpa: bool = False  # training.fp8_dot_product_attention: cuDNN's fused attention in FP8, with TE's casts
    fp8_head: bool = False  # training.fp8_output_proj: the LM head's GEMMs in MXFP8 (TELMHeadColumnParallelLinear)
    fused_mlp: bool = False  # model.use_transformer_engine_op_fuser on sm_100 in MXFP8/NVFP4: TE's CuTe DSL grouped MLP
    head: int = 0  # dims per head (model.head_dim); 0: h / heads
    etp: int = 0  # expert tensor-parallel size when it is not t (MoE parallel folding); 0: the experts use t
    dispatcher: str = "alltoall"  # parallel.moe_token_dispatcher_type (workload/dispatch.py)
    backend: str = "deepep"  # parallel.moe_flex_dispatcher_backend
    sm_slow: float = 1.0  # compute under the flex kernels: sm_count / (sm_count − moe_flex_dispatcher_num_sms)
    shared_overlap: bool = False  # parallel.moe_shared_expert_overlap
    router_bytes: int = 0  # bytes per element of the router GEMM and its probabilities (moe_router_dtype); 0: dtype
    groups: int = 0  # moe_router_num_groups
    router_fusion: bool = False  # moe_router_fusion: TE's fused routing and aux-loss kernels
    permute_fusion: bool = True  # moe_permute_fusion: TE's fused permute and unpermute (else PyTorch ops)
    permute_into_hybridep: bool = False  # moe_permute_fusion_into_hybridep: HybridEP's dispatch permutes
    group_topk: int = 0  # moe_router_group_topk
    a2a_scale: float = 1.0  # the copies each rank sends over the mean: the capacity factor when padded
    drop_pad: bool = False  # Megatron-Core's drop and pad (routing.padded): static splits, no count exchange nor sync
    static_ep: bool = False  # HybridEP under moe_expert_rank_capacity_factor: a static receive buffer, no host sync
    # the alltoall dispatcher with token dropping or router padding (not drop and pad): the output's size is dynamic,
    # so the host syncs before the first permutation, not before the all-to-all (token_dispatch.py)
    early_sync: bool = False
    # quantised experts' row alignment (layer.py "Quantised experts' alignment"): the extra rows a local expert runs,
    # and whether the experts pad and unpad them themselves (TE's Fp8Padding and Fp8Unpadding copies)
    pad_rows: float = 0.0
    pad_copies: bool = False
    window: int = 0  # sliding-window attention: keys per query (model.sliding_window); 0: none
    window_share: float = 0.0  # the fraction of layers that attend through the window (models.window_share)
    sinks: bool = False  # a softmax with an extra logit per head (model.softmax_type off-by-one or learnable)
    ub_slow: float = 0.0  # tp_comm_overlap (Userbuffers) on: its pipelined and bulk GEMMs' time × this; 0: off
    # tp_comm_overlap_cfg: (TE's GEMM name, method, its time × this, chunks) of each GEMM the configuration names
    ub_cfg: tuple[tuple[str, str, float, int], ...] = ()
    cp_a2a: bool = False  # parallel.cp_comm_type a2a (with cp > 1): Ulysses all-to-alls instead of the K/V ring
    cp_hier: int = 0  # cp_comm_type a2a+p2p: the all-to-all level's size (the ring runs over cp / it); 0: none
    cp_ag: bool = False  # cp_comm_type all_gather (with cp > 1): K and V all-gathered, dK and dV reduce-scattered
    positions: str = ""  # models.position_embedding: learned_absolute | rope | none; "": rope without biases
    # a hybrid model's layer (workload/hybrid.py): the parts it runs, "" a whole transformer layer (attention and its
    # MLP); its Mamba-2 mixer's heads H, head dim P, groups G and state N (whole, before TP; 0: no mixer)
    parts: str = ""
    latent: int = 0  # model.moe_latent_size: the width of the rows the dispatcher moves and the experts take; 0: h
    m_heads: int = 0
    m_head_dim: int = 0
    m_groups: int = 0
    m_state: int = 0
    # DeepSeek Sparse Attention (workload/sparse_attention.py): the indexer's heads and head dim, the keys a query
    # attends (0: dense attention), and the indexer's loss: 0 none, 1 over the top-k keys, 2 over every key
    dsa_heads: int = 0
    dsa_dim: int = 0
    dsa_topk: int = 0
    dsa_loss: int = 0
    dsa_skip: bool = False  # the layer reuses an earlier one's top-k (dsa_indexer_topk_freq): no indexer of its own
    # a hybrid model's gated delta net (workload/delta_net.py): key and value heads (whole), their dims, the taps
    g_key_heads: int = 0
    g_value_heads: int = 0
    g_key_dim: int = 0
    g_value_dim: int = 0
    g_conv: int = 0
    out_gate: bool = False  # model.attention_output_gate: the QKV GEMM also gives a gate of a_l·d
    # DeepSeek-V4's hybrid attention (workload/compressed_attention.py): whether the layer has it, its compression
    # ratio (0, 4 or 128), its window, and its grouped output projection's groups and width a group (whole)
    dsv4: bool = False
    csa: int = 0
    csa_window: int = 0
    o_groups: int = 0
    o_rank: int = 0
    # mHC (workload/hyper_connection.py): the residual streams (0: none), the Sinkhorn iterations, fused kernels
    hc: int = 0
    hc_iters: int = 0
    hc_fused: bool = False

    @property
    def attended(self) -> float:
        """The (query, key) pairs a fused kernel computes, over the full causal square's, averaged over
        the layer pattern. A window of W keys over s_kv = S tokens: S·W − W²/2 pairs (query i attends
        min(i + 1, W) keys), against S²/2 for the causal square (the same continuous count, so W = S
        gives 1). Every layer is costed at the pattern's mean: exact for a stage of whole periods (GPT-OSS,
        alternating: an even number of layers)."""
        S, W = self.s_kv, self.window
        if not W or W >= S or not self.causal or not self.window_share:
            return 1.0
        windowed = (S * W - W * W / 2) / (S * S / 2)
        return self.window_share * windowed + (1.0 - self.window_share)

    @property
    def rope(self) -> bool:
        """Rotary embeddings on q and k."""
        return self.positions == "rope" or (not self.positions and not self.biases)

    @property
    def hx(self) -> int:
        """The width of an MoE layer's routed rows: the latent size (model.moe_latent_size), else h."""
        return self.latent or self.h

    @property
    def T(self) -> int:
        return self.b * self.s

    @property
    def Te(self) -> int:
        """Tokens of the elementwise work: sharded by t with sequence parallelism."""
        return self.T // self.t if self.sp else self.T

    @property
    def d(self) -> int:
        return self.head or self.h // self.heads

    @property
    def d_qk(self) -> int:
        return self.qk_head or self.d

    @property
    def d_v(self) -> int:
        return self.v_head or self.d

    @property
    def mla(self) -> bool:
        return self.kv_rank > 0

    @property
    def folded(self) -> bool:
        """The expert layers on a grid of their own (parallel.etp other than tp): :func:`_folded_moe_forward`."""
        return bool(self.experts) and self.etp > 0 and self.etp != self.t

    @property
    def fe_l(self) -> int:
        """One routed expert's width on this GPU."""
        return (self.expert_ffn or self.ffn) // (self.etp if self.folded else self.t)

    @property
    def rank_load(self) -> float:
        """Routed tokens of the busiest EP rank over the mean: (f + local − 1)/local with EP, else 1; or
        models.moe_rank_load of a measured distribution (``load``)."""
        if self.load:
            return self.load
        if self.ep <= 1 or self.imbalance == 1.0:
            return 1.0
        local = max(1, self.experts // self.ep)
        return (self.imbalance + local - 1) / local

    @property
    def a_l(self) -> int:
        return self.heads // self.t

    @property
    def kv_l(self) -> int:
        return max(1, self.kv_heads // self.t)

    @property
    def qkv_n(self) -> int:
        """The QKV GEMM's outputs on this rank: the query, key and value heads, and the output gate's a_l·d."""
        return (self.a_l + 2 * self.kv_l + (self.a_l if self.out_gate else 0)) * self.d

    @property
    def f_l(self) -> int:
        return self.ffn // self.t

    @property
    def up_n(self) -> int:
        return 2 * self.f_l if self.swiglu else self.f_l

    @property
    def fused_attention(self) -> bool:
        return self.flash or self.cp > 1


# Bytes per element of the quantised copies (Transformer Engine, transformer_engine/common/recipe/__init__.py
# and pytorch/tensor/{mxfp8,nvfp4}_tensor.py @ d0067d0): MXFP8 one E8M0 scale byte per 32 elements of each
# copy; NVFP4 two values per byte and one E4M3 scale per 16 elements (1-D blocks: activations and
# gradients), or per 16×16 block (2-D: weights).
MXFP8_COPY = 1.0 + 1.0 / 32
NVFP4_COPY = 0.5 + 1.0 / 16
NVFP4_WEIGHT_COPY = 0.5 + 1.0 / 256
# Float8BlockScaling (fp8_recipe blockwise; transformer_engine/common/recipe/__init__.py @ d0067d0): one FP8 byte an
# element and an fp32 scale per 1x128 block (activations, gradients) or per 128x128 block (weights)
BLOCK_COPY = 1.0 + 4.0 / 128
BLOCK_WEIGHT_COPY = 1.0 + 4.0 / (128 * 128)

# GEMMs that stay in BF16 under FP8: the core attention's, the router's, the output layer's (layer.py, FP8), DSA's
# absorbed MLA einsums (sparse_attention.py) and DeepSeek-V4's grouped o_a (a torch.bmm in HF's model; an ASSUMPTION
# for Megatron-Core's dev branch)
BF16_GEMMS = ("attn.", "moe.router", "lm_head", "q_absorb", "v_up", "o_a")


def gemm(name: str, m: int, n: int, k: int, L: LayerShape, batch: int = 1, cat: str = FWD) -> Kernel:
    """A GEMM; one of a quantised run's linear layers has dtype 1 and its recipe's precision (``quant``), its
    operands read at the quantised size (MXFP8 and NVFP4 with their block scales)."""
    if L.fp8 and (not name.startswith(BF16_GEMMS) or (L.fp8_head and name.startswith("lm_head"))):
        quant = L.recipe if L.recipe in ("mxfp8", "nvfp4") else "fp8"
        per = {"mxfp8": MXFP8_COPY, "nvfp4": NVFP4_COPY}.get(quant, 1.0)
        nbytes = float((m * k + k * n) * batch) * per + float(m * n * batch) * 2.0
        if quant == "fp8":
            nbytes = compute.gemm_bytes(m, n, k, 1, batch)
        return Kernel(name, "gemm", compute.gemm_flops(m, n, k, batch), nbytes, cat, m, n, k, batch, dtype=1,
                      quant=quant)
    return Kernel(name, "gemm", compute.gemm_flops(m, n, k, batch), compute.gemm_bytes(m, n, k, L.dtype, batch),
                  cat, m, n, k, batch, dtype=L.dtype)


def grouped_gemm(name: str, m: int, n: int, k: int, L: LayerShape, groups: int, cat: str = FWD) -> Kernel:
    """The local experts' GEMMs as one grouped GEMM: ``groups`` GEMMs of m×n×k."""
    return replace(gemm(name, m, n, k, L, groups, cat), grouped=True)


def elementwise(name: str, elements: float, passes: float, L: LayerShape, flops_per: float = 1.0,
                cat: str = FWD) -> Kernel:
    return Kernel(name, "elementwise", flops_per * elements, passes * elements * L.dtype, cat)


def flash(name: str, L: LayerShape, sk: int, backward: bool, cat: str) -> Kernel:
    """MLA (d_qk ≠ d_v) is costed at the mean head dim (d_qk + d_v)/2: exact in FLOPs, 2·s·sk·(d_qk + d_v)."""
    bh = L.b * L.a_l
    d = L.d if L.d_qk == L.d_v == L.d else (L.d_qk + L.d_v) / 2
    # sliding-window layers (LayerShape.attended): the FLOPs of the pairs computed, as a causal kernel of
    # that many fewer keys (the key count a measured table is looked up at)
    r = L.attended
    flops = 4.0 * bh * L.s * sk * d * (2.5 if backward else 1.0) * (0.5 if L.causal else 1.0) * r
    if r != 1.0:
        sk = max(1, round(sk * r))
    nbytes = (2 if backward else 1) * bh * (2 * L.s + 2 * sk) * d * L.dtype
    return Kernel(name, "flash", flops, nbytes, cat, L.s, sk, int(d), bh, L.causal, backward, int(d), dtype=L.dtype,
                  fa2=L.fa2, quant=("mxfp8" if L.recipe == "mxfp8" else "fp8") if L.fp8_dpa else "")


def linear_backward(L: LayerShape, name: str, m: int, n_out: int, k_in: int, batch: int = 1) -> list[Step]:
    """A linear layer's backward with no communication: dgrad (m×n_out)·(n_out×k_in) then wgrad (k_in×m)·(m×n_out)."""
    return [gemm(f"{name}.dgrad", m, k_in, n_out, L, batch, BWD), gemm(f"{name}.wgrad", k_in, n_out, m, L, batch, BWD)]


def kernels(steps: list[Step]) -> list[Kernel]:
    return [st for st in steps if isinstance(st, Kernel)]


def comms(steps: list[Step]) -> list[Comm]:
    return [st for st in steps if isinstance(st, Comm)]
