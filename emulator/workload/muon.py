"""Megatron-Core's Muon optimizer (``training.optimizer`` muon or dist_muon): which weights it orthogonalises, its
state, and the cost of its Newton–Schulz iterations. Pure functions of the specs and the GPU.

Sources (Megatron-LM @ d98e8a64dd, NVIDIA-NeMo/Emerging-Optimizers @ fd77292):

- **Which parameters.** Muon takes every 2-D weight that is no embedding or output layer; the rest (embeddings, the
  output layer, norms, biases: any parameter that is not 2-D) go to the scalar optimizer, Adam by default
  (megatron/core/optimizer/emerging_optimizers.py ``_is_nonlinear_or_embedding``, ``_is_muon_excluded``;
  optimizer_config.py ``muon_scalar_optimizer = 'adam'``). So each attention projection, MLP fc1 (one
  matrix, the gated halves together) and fc2, the router, the shared experts and every routed expert's fc1 and fc2
  (Transformer Engine's grouped linear keeps one 2-D weight per expert) are orthogonalised one by one; MLA's four
  projections each. With ``muon_split_qkv`` (default true) a fused QKV weight is split into its Q, K and V
  (and gate) blocks, each orthogonalised on its own (``TensorParallelMuon.orthogonalize``).
- **State.** The momentum buffer, ``torch.zeros_like(p)`` of the fp32 main parameter (emerging_optimizers
  orthogonalized_optimizer.py ``_init_group``): 4 B; and the fp32 main copy that Megatron's
  ``Float16OptimizerWithFloat16Params`` keeps of each bf16 weight (optimizer/__init__.py wraps the Muon
  optimizer in it under bf16; layer_wise_optimizer.py does so after sharding, "so master weights are only
  created for the local shard"): 4 B. 8 B a Muon parameter, against Adam's 12.
- **dist_muon** (``LayerWiseDistributedOptimizer``, layer_wise_optimizer.py): whole parameters are dealt out
  to the data-parallel ranks (dense weights over dp·cp, experts over the expert-data-parallel group); each rank
  keeps the states of and steps only its own, then the updated bf16 weights are all-gathered over those groups.
  Megatron-Core has two paths for it, and the emulator takes the one each front end takes:

  - ``training.optimizer: dist_muon``, Megatron-Bridge's name (recipes/utils/optimizer_utils.py
    ``distributed_muon_with_cosine_annealing``, optim.py: ``layer_wise_distributed_optimizer="dist" in
    optimizer``), with ``ddp.use_distributed_optimizer = False`` as its Kimi K2 recipe sets: no parameter layout,
    so the legacy path. DDP keeps full gradients and all-reduces them; ``_shard_params_ping_pong`` deals the
    parameters out sorted by size, ping-pong; ``allgather_params`` gathers them; Adam's parameters are dealt out
    with the rest.
  - ``training.optimizer: muon`` at ``parallel.zero: 1``, Megatron-LM's ``--optimizer muon
    --use-distributed-optimizer`` (arguments.py: "dist_muon is deprecated. Use --optimizer muon
    --use-distributed-optimizer instead"). ``use_layer_wise_param_layout`` is on by default, so
    ``wrap_model_chunks_with_ddp`` (training.py) "forces ``ddp_config.use_distributed_optimizer=True`` (... needed
    for reduce-scatter)": the gradients are reduce-scattered into shard-aligned buckets
    (``_compute_per_buffer_param_layout``: whole parameters, balanced by Newton–Schulz cost), the weights all-
    gathered by DDP's ``start_param_sync``, and Adam's parameters go to a DistributedOptimizer of their own
    (optimizer/__init__.py). The same states and the same step as dist_muon; half its gradient traffic.
- **Tensor parallelism** (``muon_tp_mode``, default duplicated): duplicated all-gathers a TP-split matrix's
  momentum (fp32) over TP and every TP rank orthogonalises the whole matrix (muon_utils.py ``newton_schulz_tp``);
  blockwise orthogonalises each rank's shard, no communication. Replicated weights (MLA's down projections, the
  router) are whole on every rank already.
- **Newton–Schulz** (muon_utils.py ``newton_schulz``, ``newton_schulz_step``): X is the m×n matrix with m ≤ n
  (transposed if need be), normalised, then ``muon_num_ns_steps`` (5) quintic steps of A = X·Xᵀ (2m²n FLOPs),
  B = b·A + c·A·A (2m³), X = a·X + B·X (2m²n): 4m²n + 2m³ FLOPs a step, three GEMMs, costed by devices/compute.py
  ``gemm_cost`` in the type ``muon_fp32_matmul_prec`` sets (Emerging-Optimizers ``utils.fp32_matmul_precision``
  sets torch's float32 matmul precision around it): medium, the default, casts X to bf16 and runs bf16 GEMMs
  ("PyTorch doesn't really have FP32 I/O BF16 compute kernels for precision medium. We explicitly convert to BF16
  and back"); high runs fp32 GEMMs on TF32 tensor cores; highest runs them in full FP32 (cuBLAS SGEMM on the CUDA
  cores: its cuBLAS 12.9 BF16x9 emulation is opt-in, an ASSUMPTION that it is off). Megatron-Bridge's DeepSeek-V4-
  Flash Muon recipe sets highest.
- **Which matrices, by model** (``layer_matrices``): multi-head, grouped-query and multi-latent attention; DSA's
  indexer (Megatron-Core dsa.py ``DSAIndexer``: linear_wq_b, linear_wk, linear_weights_proj, on the layers that
  compute their own top-k); DeepSeek-V4's hybrid attention (models.py ``dsv4_attention_params``, HF transformers
  5.25 DeepseekV4Attention: q_a, q_b, kv_proj, the grouped o_a as one 2-D weight of g·r_o rows and a·D/g columns,
  as its ``nn.Linear``, o_b; a compressor's kv_proj and gate_proj and its 2-D position bias; at ratio 4 the
  indexer's compressor, q_b and weights_proj); mHC's mapping_proj, two a layer (Megatron-Core hyper_connection.py
  ``nn.Linear``); an MTP module's layer and its eh_proj (``mtp_matrices``). Hybrid (Mamba) layers are refused.

- **A rank's share** under the layer-wise optimizer: whole parameters, dealt as Megatron-Core deals them
  (workload/layer_wise.py: the legacy ping-pong by size under dist_muon, the layout path's LPT by Newton–Schulz cost
  under muon at ZeRO 1). The step is costed on the rank that draws the most Newton–Schulz seconds, as the weights'
  all-gather after it waits for the slowest rank. ASSUMPTION: the heaviest dense share and the heaviest expert share
  fall on one rank (an upper bound; exact where either group is 1 or deals evenly). The legacy deal takes Adam's
  parameters too: the 1-D ones ahead of the matrices (smaller than any, they shift the loop: the layers' norms, two
  a layer, MLA's q and kv norms, twice with LayerNorm's shift, the linear biases and the final norm), and the
  embeddings and the output layer, dealt whole (the largest, they go last; their 12 B of Adam state land on one
  rank: ``dealt_state_bytes``). ASSUMPTION: the other 1-D parameters (DeepSeek-V4's sinks and compressor norms,
  DSA's k_norm, mHC's scalars) are left out, and the step's elementwise stream is the mean share's.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from emulator.devices import compute
from emulator.errors import ScenarioError
from emulator.scenario.spec import GpuSpec, ModelSpec, ParallelSpec, TrainingSpec
from emulator.scenario.stages import head_apart
from emulator.workload import layer_wise as LW
from emulator.workload import models as M

MUON_OPTIMIZERS = ("muon", "dist_muon")
# muon_fp32_matmul_prec → the Newton–Schulz GEMMs' type (module docstring)
NS_DTYPE = {"medium": "bf16", "high": "tf32", "highest": "fp32"}
CAST_BYTES = 12  # medium's cast of X to bf16 and back (4 + 2, 2 + 4), part of MUON_STEP_BYTES
MUON_STATE_BYTES = 8  # fp32 main weight 4 + fp32 momentum buffer 4 (module docstring)
MOMENTUM_GATHER_BYTES = 4  # duplicated TP mode gathers the fp32 momentum
# The step's stream per Muon parameter (unfused PyTorch ops; ASSUMPTION: each reads and writes its operands once):
# clip_grad_norm reads the gradient 4; momentum lerp_ (read m, g; write m) 12; Nesterov's lerp (Megatron-Bridge's
# distributed_muon_with_cosine_annealing sets muon_use_nesterov=True) 12; the Frobenius normalisation (a read for
# the norm, a read and a write to divide) 12; the cast to bf16 and back (4 + 2, 2 + 4) 12; the scale factor 8; the
# decoupled weight decay (p.mul_) 8; p.add_ (read p and the update, write p) 12; the fp32 main weight copied to
# the bf16 weight (4 + 2) 6.
MUON_STEP_BYTES = 4 + 12 + 12 + 12 + 12 + 8 + 8 + 12 + 6
# and its elementwise FLOPs: two lerps 3 + 3, the norm 2 and the division 1, the scale 1, the decay 1, the add 2
MUON_FLOPS_PER_PARAM = 13.0


@dataclass(frozen=True)
class Matrix:
    """``count`` weight matrices one GPU orthogonalises, each ``rows`` × ``cols`` as Newton–Schulz sees it (the
    whole matrix under duplicated TP, the shard under blockwise); ``split``: the ranks it is split over (its
    shard is 1/split of it: the momentum all-gathered over them under duplicated); ``expert``: a routed expert's."""

    rows: int
    cols: int
    count: float = 1.0
    split: int = 1
    expert: bool = False
    dim: int = 0  # the dimension ``split`` cuts (0: rows, column-parallel; 1: cols, row-parallel)
    blocks: tuple[int, ...] = ()  # rows of the blocks Newton–Schulz takes one by one (muon_split_qkv); (): whole

    @property
    def local(self) -> float:
        """Parameters of these matrices held on one GPU."""
        return self.rows * self.cols * self.count / self.split

    @property
    def stored(self) -> tuple[int, int]:
        """One matrix's shape as the GPU stores it (its TP shard)."""
        return (self.rows // self.split, self.cols) if self.dim == 0 else (self.rows, self.cols // self.split)

    @property
    def ns_shapes(self) -> tuple[tuple[int, int], ...]:
        """The (rows, cols) of each matrix Newton–Schulz orthogonalises for one of these."""
        return tuple((b, self.cols) for b in self.blocks) if self.blocks else ((self.rows, self.cols),)


@dataclass(frozen=True)
class Chunk:
    """The Muon matrices of one model chunk of a rank (a virtual pipeline stage), in model order; the number of
    Adam's 1-D parameters the legacy deal counts ahead of them (``vectors`` dense, ``expert_vectors`` experts'); and
    the sizes of Adam's embeddings and output layer (:func:`adam_params`)."""

    matrices: tuple[Matrix, ...]
    vectors: int = 0
    expert_vectors: int = 0
    adam: tuple[int, ...] = ()  # Adam's embeddings and output layer, dealt whole with the rest by the legacy path


def is_muon(tr: TrainingSpec) -> bool:
    """Whether the scenario runs Megatron-Core's Muon (``training.optimizer`` muon or dist_muon)."""
    return tr.optimizer in MUON_OPTIMIZERS


def all_reduces(tr: TrainingSpec, par: ParallelSpec) -> bool:
    """Whether DDP all-reduces whole gradients: at ZeRO 0, and under dist_muon (the legacy layer-wise path);
    muon at ZeRO 1 reduce-scatters them into shard-aligned buckets, as Adam's distributed optimizer (module
    docstring)."""
    return par.zero == 0 or tr.optimizer == "dist_muon"


def layer_wise(tr: TrainingSpec, par: ParallelSpec) -> bool:
    """Megatron-Core's LayerWiseDistributedOptimizer deals whole parameters out over DP: dist_muon, or muon with the
    distributed optimizer (parallel.zero 1), which Megatron-LM turns into it (arguments.py @ d98e8a64dd: "dist_muon is
    deprecated. Use --optimizer muon --use-distributed-optimizer instead")."""
    return tr.optimizer == "dist_muon" or (tr.optimizer == "muon" and par.zero == 1)


def ns_step_flops(rows: int, cols: int) -> float:
    """One Newton–Schulz step of an m×n matrix, m = min(rows, cols), n the other: 4m²n + 2m³."""
    m, n = min(rows, cols), max(rows, cols)
    return 4.0 * m * m * n + 2.0 * m ** 3


def ns_dtype(tr: TrainingSpec) -> str:
    """The Newton–Schulz GEMMs' type: bf16, tf32 or fp32 by ``muon_fp32_matmul_prec`` (module docstring)."""
    return NS_DTYPE[tr.muon_fp32_matmul_prec]


@lru_cache(maxsize=4096)
def ns_cost(rows: int, cols: int, steps: int, gpu: GpuSpec, dtype: str = "bf16"
            ) -> tuple[float, float, tuple[float, float, float]]:
    """(seconds, FLOPs, seconds by source: measured, interpolated, roofline) of ``steps`` Newton–Schulz steps of one
    ``rows`` × ``cols`` matrix on ``gpu``: per step the ``dtype`` GEMMs (m×n)(n×m), (m×m)(m×m) and (m×m)(m×n)."""
    from emulator.devices.kernels import SOURCES

    m, n = min(rows, cols), max(rows, cols)
    by = dict.fromkeys(SOURCES, 0.0)
    for dims in ((m, m, n), (m, m, m), (m, n, m)):
        t, src = compute.gemm_cost(*dims, gpu, dtype)
        by[src] += t * steps
    costed = (by[SOURCES[0]], by[SOURCES[1]], by[SOURCES[2]])
    return sum(costed), steps * ns_step_flops(rows, cols), costed


def _sharded(rows: int, cols: int, dim: int, t: int, mode: str, expert: bool = False) -> Matrix:
    """A weight split over ``t`` TP ranks along ``dim`` (0: column-parallel, rows; 1: row-parallel, cols)."""
    if t <= 1:
        return Matrix(rows, cols, expert=expert)
    if mode == "blockwise":
        return Matrix(rows // t if dim == 0 else rows, cols // t if dim == 1 else cols, expert=expert)
    return Matrix(rows, cols, split=t, expert=expert, dim=dim)


def _attention(r: ModelSpec, t: int, mode: str, split_qkv: bool) -> list[Matrix]:
    """The attention's weight matrices (MLA's four projections and the output; or QKV and the output)."""
    h, a = r.hidden, r.heads
    if M.is_mla(r):
        d_qk, d_v = M.head_dims(r)
        d_n = d_qk - r.qk_rope_head_dim
        q = [Matrix(r.q_lora_rank, h), _sharded(a * d_qk, r.q_lora_rank, 0, t, mode)] if r.q_lora_rank \
            else [_sharded(a * d_qk, h, 0, t, mode)]
        kv = [Matrix(r.kv_lora_rank + r.qk_rope_head_dim, h), _sharded(a * (d_n + d_v), r.kv_lora_rank, 0, t, mode)]
        return q + kv + [_sharded(h, a * d_v, 1, t, mode)]
    d = M.head_dim(r)
    blocks = [a * d] + ([a * d] if r.attention_output_gate else []) + [r.kv_heads * d] * 2
    qkv = _sharded(sum(blocks), h, 0, t, mode)
    if split_qkv:  # one parameter, orthogonalised block by block (each block's rows cut as the whole's)
        qkv = replace(qkv, blocks=tuple(b * qkv.rows // sum(blocks) for b in blocks))
    return [qkv, _sharded(h, a * d, 1, t, mode)]


def _dsv4_attention(r: ModelSpec, ratio: int, t: int, mode: str) -> list[Matrix]:
    """DeepSeek-V4's hybrid attention at compression ratio ``ratio`` (the module docstring; the 2-D terms of
    models.py ``dsv4_attention_params``): q_b, the grouped o_a and o_b split by heads over TP, the rest whole."""
    h, a, D, rq = r.hidden, r.heads, M.head_dim(r), r.q_lora_rank
    g, ro = r.o_groups, r.o_lora_rank
    out = [Matrix(rq, h), _sharded(a * D, rq, 0, t, mode), Matrix(D, h),
           _sharded(g * ro, a * D // g, 0, t, mode), _sharded(h, g * ro, 1, t, mode)]
    if ratio:
        w = 2 * D if ratio == 4 else D
        out += [Matrix(w, h), Matrix(w, h), Matrix(ratio, w)]
    if ratio == 4:
        H, DI = r.dsa_indexer_n_heads, r.dsa_indexer_head_dim
        out += [Matrix(2 * DI, h), Matrix(2 * DI, h), Matrix(4, 2 * DI), Matrix(H * DI, rq), Matrix(H, h)]
    return out


def _dsa_indexer(r: ModelSpec, layer: int) -> list[Matrix]:
    """DSA's lightning indexer (models.py ``indexer_linear``), whole on every TP rank; none on a layer that reuses
    an earlier layer's top-k, or without DSA."""
    if not M.is_dsa(r) or M.dsa_skips(r, layer):
        return []
    H, D, h = r.dsa_indexer_n_heads, r.dsa_indexer_head_dim, r.hidden
    return [Matrix(H * D, r.q_lora_rank or h), Matrix(D, h), Matrix(H, h)]


def _mhc(r: ModelSpec) -> list[Matrix]:
    """mHC's two mapping_proj weights a layer, n·h → n² + 2n, whole on every TP rank (models.py ``mhc_params``)."""
    if not r.enable_mhc_connections:
        return []
    n = r.mhc_num_residual_streams
    return [Matrix(n * n + 2 * n, n * r.hidden, 2.0)]


def _mlp(width: int, h: int, gated: bool, t: int, mode: str, expert: bool = False) -> list[Matrix]:
    """An MLP's fc1 (both gated halves in one matrix) and fc2."""
    return [_sharded((2 if gated else 1) * width, h, 0, t, mode, expert), _sharded(h, width, 1, t, mode, expert)]


def layer_matrices(m: ModelSpec, layer: int, par: ParallelSpec, tr: TrainingSpec) -> tuple[Matrix, ...]:
    """The matrices one GPU's Muon orthogonalises of decoder layer ``layer`` (before dist_muon deals them out):
    its attention, and its dense MLP, or its router, shared experts, latent projections and local routed experts."""
    r = M.resolve(m)
    t, mode = par.tp, tr.muon_tp_mode
    if M.is_dsv4(r):
        out = _dsv4_attention(r, M.compress_ratio(r, layer), t, mode)
    else:
        out = _attention(r, t, mode, tr.muon_split_qkv) + _dsa_indexer(r, layer)
    out += _mhc(r)
    if not M.is_moe_layer(r, layer):
        return tuple(out + _mlp(r.ffn_hidden, r.hidden, r.swiglu, t, mode))
    out.append(Matrix(r.experts, r.hidden))  # the router: replicated over TP
    if r.shared_experts:
        out += _mlp(M.shared_ffn(r), r.hidden, r.swiglu, t, mode)
    width = r.moe_latent_size or r.hidden
    if r.moe_latent_size:  # fc1_latent_proj and fc2_latent_proj, whole on every rank
        out += [Matrix(r.moe_latent_size, r.hidden), Matrix(r.hidden, r.moe_latent_size)]
    local = r.experts / par.ep
    out += [replace(x, count=x.count * local) for x in _mlp(M.expert_ffn(r), width, r.swiglu, par.etp or t, mode, True)]
    return tuple(out)


def mtp_matrices(m: ModelSpec, par: ParallelSpec, tr: TrainingSpec, modules: int) -> tuple[Matrix, ...]:
    """The matrices of ``modules`` MTP modules (one with ``mtp_use_repeated_layer``, whose modules share their
    weights): each its transformer layer (index layers + 1 + d, plan.py's) and eh_proj, 2h → h, column-parallel
    (Megatron-Core multi_token_prediction.py)."""
    out: list[Matrix] = []
    for d in range(modules):
        out += layer_matrices(m, m.layers + 1 + d, par, tr)
        out.append(_sharded(m.hidden, 2 * m.hidden, 0, par.tp, tr.muon_tp_mode))
    return tuple(out)


def muon_params(matrices: tuple[Matrix, ...]) -> tuple[float, float]:
    """(dense, expert) parameters of ``matrices`` held on one GPU: the ones Muon steps."""
    return (sum(x.local for x in matrices if not x.expert), sum(x.local for x in matrices if x.expert))


@dataclass(frozen=True)
class NsCost:
    """A rank's Newton–Schulz work in one step: seconds, FLOPs, seconds by kernel source, and the bytes of the
    momenta it all-gathers over TP (duplicated mode) for the dense and the expert matrices."""

    seconds: float = 0.0
    flops: float = 0.0
    costed: tuple[float, float, float] = (0.0, 0.0, 0.0)
    tp_gather: float = 0.0
    etp_gather: float = 0.0

    def __add__(self, o: NsCost) -> NsCost:
        return NsCost(self.seconds + o.seconds, self.flops + o.flops,
                      (self.costed[0] + o.costed[0], self.costed[1] + o.costed[1], self.costed[2] + o.costed[2]),
                      self.tp_gather + o.tp_gather, self.etp_gather + o.etp_gather)


def layer_vectors(m: ModelSpec, layer: int, par: ParallelSpec) -> tuple[int, int]:
    """(dense, expert) 1-D parameters of decoder layer ``layer`` on one GPU that the legacy deal counts (module
    docstring): the input and pre-MLP norms, MLA's q and kv norms (each with its shift under LayerNorm) and, with
    linear biases, the QKV and projection biases, the dense MLP's or the shared experts' two, and each local
    expert's two."""
    r = M.resolve(m)
    norms = 2 + ((2 if r.q_lora_rank else 1) if M.is_mla(r) else 0)
    dense = norms * (2 if M.has_norm_shift(r) else 1)
    if not M.has_biases(r):
        return dense, 0
    moe = M.is_moe_layer(r, layer)
    dense += 2 + (2 if not moe or r.shared_experts else 0)
    return dense, (2 * r.experts // par.ep if moe else 0)


def layout_bucket(par: ParallelSpec, grad_bytes: int) -> int | None:
    """The layout path's soft bucket minimum in elements: ``grad_bucket`` bytes of ``grad_bytes`` gradients, as the
    emulator's own buckets; None (one bucket) without ``overlap_grad_reduce``, as Megatron-LM's
    ``resolve_ddp_bucket_size``."""
    return int(par.grad_bucket // grad_bytes) if par.overlap_grad_reduce else None


def _expand(matrices: tuple[Matrix, ...]) -> list[Matrix]:
    """One Matrix a parameter, in order (a count of k: k parameters alike)."""
    return [replace(x, count=1.0) for x in matrices for _ in range(round(x.count))]


def _ns(x: Matrix, tr: TrainingSpec, gpu: GpuSpec, dtype: str) -> NsCost:
    """The Newton–Schulz work of one parameter ``x`` (count 1) on one GPU, with its TP momentum gather."""
    secs, flops, costed = 0.0, 0.0, (0.0, 0.0, 0.0)
    for rows, cols in x.ns_shapes:
        sec, f, by = ns_cost(rows, cols, tr.muon_num_ns_steps, gpu, dtype)
        secs, flops, costed = secs + sec, flops + f, (costed[0] + by[0], costed[1] + by[1], costed[2] + by[2])
    gather = x.rows * x.cols * MOMENTUM_GATHER_BYTES * x.count if x.split > 1 else 0.0
    return NsCost(secs, flops, costed, 0.0 if x.expert else gather, gather if x.expert else 0.0)


def adam_params(m: ModelSpec, par: ParallelSpec, embedding: bool, output: bool) -> tuple[int, ...]:
    """The sizes of the Adam parameters of a chunk that holds the ``embedding`` (the word embedding V·h/t and
    GPT's learned positions s·h, whole on every TP rank) or the ``output`` layer's own weight (V·h/t), ``m``'s
    vocabulary as the caller pads it."""
    r, t = M.resolve(m), par.tp
    word = (r.vocab * r.hidden // t,)
    return ((word + ((r.seq_len * r.hidden,) if M.learned_positions(r) else ())) if embedding else ()) + \
        (word if output else ())


def head_vectors(m: ModelSpec) -> int:
    """The final norm's 1-D parameters: its gain, and its shift under LayerNorm."""
    return 2 if M.has_norm_shift(M.resolve(m)) else 1


def chunk(m: ModelSpec, par: ParallelSpec, tr: TrainingSpec, layers: list[int], mtp: int = 0,
          embedding: bool = False, head: bool = False) -> Chunk:
    """The Chunk of a model chunk that holds decoder ``layers`` (in order), ``mtp`` MTP modules' own weights, and
    the ``embedding`` or the ``head`` (its final norm, and its output layer where the weight is its own: untied,
    or a tied copy on another rank than the embedding's, scenario/stages.py ``head_apart``)."""
    mats = {i: layer_matrices(m, i, par, tr) for i in set(layers)}
    vec = {i: layer_vectors(m, i, par) for i in set(layers)}
    output = head and (not m.tied_embeddings or head_apart(par.pp, par.schedule))
    return Chunk(tuple(x for i in layers for x in mats[i]) + mtp_matrices(m, par, tr, mtp),
                 sum(vec[i][0] for i in layers) + (head_vectors(m) if head else 0), sum(vec[i][1] for i in layers),
                 adam_params(m, par, embedding, output))


def _deal(chunks: tuple[Chunk, ...], expert: bool, d: int, legacy: bool, bucket: int | None
          ) -> tuple[list[tuple[Matrix, int]], list[tuple[int, int]]]:
    """Each dense (or ``expert``) matrix of ``chunks`` with the rank of ``d`` it is dealt to, and (legacy, dense)
    each of Adam's embeddings and output layer with its rank: the legacy ping-pong over all of them, after the
    chunks' 1-D parameters, or the layout path's LPT chunk by chunk."""
    per = [[x for x in _expand(c.matrices) if x.expert == expert] for c in chunks]
    if d <= 1:
        return [(x, 0) for xs in per for x in xs], []
    if legacy:
        items = [x for xs in per for x in xs]
        pad = sum(c.expert_vectors if expert else c.vectors for c in chunks)
        adam = [] if expert else [n for c in chunks for n in c.adam]
        deal = LW.ping_pong(tuple([0] * pad + [round(x.local) for x in items] + adam), d)
        return list(zip(items, deal[pad:])), list(zip(adam, deal[pad + len(items):]))
    out: list[tuple[Matrix, int]] = []
    for xs in per:
        out += zip(xs, LW.lpt_layout(tuple(round(x.local) for x in xs), tuple(LW.ns_cost_key(*x.stored) for x in xs),
                                     d, bucket))
    return out, []


def _groups(tr: TrainingSpec, par: ParallelSpec, d_dense: int, d_expert: int) -> tuple[tuple[bool, int], ...]:
    """(expert, the ranks its parameters are dealt over) for the dense and the expert parameters: 1 (all on every
    rank) unless the layer-wise optimizer deals them."""
    lw = layer_wise(tr, par)
    return (False, max(1, d_dense) if lw else 1), (True, max(1, d_expert) if lw else 1)


def legacy(tr: TrainingSpec) -> bool:
    """Whether the layer-wise optimizer takes its legacy path (dist_muon), which deals Adam's parameters too."""
    return tr.optimizer == "dist_muon"


def dealt_state_bytes(chunks: tuple[Chunk, ...], tr: TrainingSpec, par: ParallelSpec, d_dense: int, d_expert: int,
                      adam_bytes: float, bucket: int | None = None) -> float:
    """Optimizer-state bytes of the parameters a rank is dealt whole, on the rank that holds the most (the
    heaviest dense share and the heaviest expert share, the module's ASSUMPTION): Muon's matrices at
    MUON_STATE_BYTES, and under the legacy path Adam's embeddings and output layer at ``adam_bytes``; all of the
    matrices unless the layer-wise optimizer deals them."""
    out = 0.0
    for expert, d in _groups(tr, par, d_dense, d_expert):
        mats, adam = _deal(chunks, expert, d, legacy(tr), bucket)
        total = [0.0] * d
        for x, r in mats:
            total[r] += MUON_STATE_BYTES * x.local
        for n, r in adam:
            total[r] += adam_bytes * n
        out += max(total)
    return out


def mean_ns_seconds(chunks: tuple[Chunk, ...], tr: TrainingSpec, par: ParallelSpec, gpu: GpuSpec, d_dense: int,
                    d_expert: int) -> float:
    """Newton–Schulz seconds of the mean share of ``chunks``' matrices: the dense over ``d_dense`` ranks, the
    experts' over ``d_expert`` (all of them unless the layer-wise optimizer deals them), what a rank would run were
    the parameters split evenly."""
    dtype = ns_dtype(tr)
    return sum(sum(_ns(x, tr, gpu, dtype).seconds for c in chunks for x in _expand(c.matrices) if x.expert == expert)
               / d for expert, d in _groups(tr, par, d_dense, d_expert))


def rank_ns(chunks: tuple[Chunk, ...], tr: TrainingSpec, par: ParallelSpec, gpu: GpuSpec, d_dense: int,
            d_expert: int, bucket: int | None = None) -> NsCost:
    """One rank's Newton–Schulz work on the matrices of its model ``chunks``: all of them under muon at ZeRO 0;
    under the layer-wise optimizer the heaviest rank's share of the dense matrices over ``d_dense`` ranks and of the
    experts' over ``d_expert`` (module docstring; ``bucket``: the layout path's soft bucket minimum in elements,
    :func:`layout_bucket`). A ScenarioError (key training.muon_fp32_matmul_prec) where the GPU's catalog entry has no
    rate for its GEMMs' type."""
    dtype = ns_dtype(tr)
    if dtype != "bf16" and gpu.peak_at(dtype) <= 0:
        raise ScenarioError(f"muon_fp32_matmul_prec {tr.muon_fp32_matmul_prec} runs the Newton-Schulz GEMMs in "
                            f"{dtype}, but GPU {gpu.name} has no {dtype} rate in its catalog entry (peak_flops_"
                            f"{dtype}): give it, or use medium (bf16)", key="training.muon_fp32_matmul_prec")
    out = NsCost()
    for expert, d in _groups(tr, par, d_dense, d_expert):
        dealt, _ = _deal(chunks, expert, d, legacy(tr), bucket)
        cost = {x: _ns(x, tr, gpu, dtype) for x, _ in dealt}
        top = LW.heaviest(tuple(r for _, r in dealt), tuple(cost[x].seconds for x, _ in dealt), d)
        out = sum((cost[x] for x, r in dealt if r == top), out)
    return out


def step_bytes_and_flops(adam_params: float, muon: float, adam_bytes: float, adam_flops: float,
                         tr: TrainingSpec) -> tuple[float, float]:
    """(bytes, FLOPs) of the step's elementwise stream over ``adam_params`` scalar-optimizer (Adam) parameters at
    ``adam_bytes`` and ``adam_flops`` each and ``muon`` Muon parameters (MUON_STEP_BYTES, MUON_FLOPS_PER_PARAM; the
    cast to bf16 and back only at ``muon_fp32_matmul_prec`` medium)."""
    per = MUON_STEP_BYTES - (0 if ns_dtype(tr) == "bf16" else CAST_BYTES)
    return adam_params * adam_bytes + muon * per, adam_params * adam_flops + muon * MUON_FLOPS_PER_PARAM
