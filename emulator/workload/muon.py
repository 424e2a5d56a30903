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

ASSUMPTION: the matrices of a rank's layer-wise share are 1/d of the stage's (d: dp·cp or the expert-DP size);
Megatron-Core balances the shards by size (the legacy ping-pong) or by Newton–Schulz cost within each bucket (the
layout path), and a rank may hold a few more.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from emulator.devices import compute
from emulator.errors import ScenarioError
from emulator.scenario.spec import GpuSpec, ModelSpec, ParallelSpec, TrainingSpec
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

    @property
    def local(self) -> float:
        """Parameters of these matrices held on one GPU."""
        return self.rows * self.cols * self.count / self.split


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
    return Matrix(rows, cols, split=t, expert=expert)


def _times(mx: Matrix, count: float) -> Matrix:
    return Matrix(mx.rows, mx.cols, mx.count * count, mx.split, mx.expert)


def times(matrices: tuple[Matrix, ...], count: float) -> tuple[Matrix, ...]:
    """``matrices`` of ``count`` layers alike."""
    return tuple(_times(x, count) for x in matrices) if count else ()


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
    qkv = [_sharded(b, h, 0, t, mode) for b in blocks] if split_qkv else [_sharded(sum(blocks), h, 0, t, mode)]
    return qkv + [_sharded(h, a * d, 1, t, mode)]


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
    out += [_times(x, local) for x in _mlp(M.expert_ffn(r), width, r.swiglu, par.etp or t, mode, True)]
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


def rank_ns(matrices: tuple[Matrix, ...], tr: TrainingSpec, par: ParallelSpec, gpu: GpuSpec, d_dense: int,
            d_expert: int) -> NsCost:
    """One rank's share of the Newton–Schulz work of ``matrices``: all of it under muon; under dist_muon 1/d_dense
    of the dense matrices' and 1/d_expert of the experts' (see the module's ASSUMPTION). A ScenarioError (key
    training.muon_fp32_matmul_prec) where the GPU's catalog entry has no rate for its GEMMs' type."""
    dtype = ns_dtype(tr)
    if dtype != "bf16" and gpu.peak_at(dtype) <= 0:
        raise ScenarioError(f"muon_fp32_matmul_prec {tr.muon_fp32_matmul_prec} runs the Newton-Schulz GEMMs in "
                            f"{dtype}, but GPU {gpu.name} has no {dtype} rate in its catalog entry (peak_flops_"
                            f"{dtype}): give it, or use medium (bf16)", key="training.muon_fp32_matmul_prec")
    out = NsCost()
    for x in matrices:
        share = x.count / ((d_expert if x.expert else d_dense) if layer_wise(tr, par) else 1)
        sec, flops, by = ns_cost(x.rows, x.cols, tr.muon_num_ns_steps, gpu, dtype)
        gather = x.rows * x.cols * MOMENTUM_GATHER_BYTES * share if x.split > 1 else 0.0
        out = out + NsCost(sec * share, flops * share, (by[0] * share, by[1] * share, by[2] * share),
                           0.0 if x.expert else gather, gather if x.expert else 0.0)
    return out


def step_bytes_and_flops(adam_params: float, muon: float, adam_bytes: float, adam_flops: float,
                         tr: TrainingSpec) -> tuple[float, float]:
    """(bytes, FLOPs) of the step's elementwise stream over ``adam_params`` scalar-optimizer (Adam) parameters at
    ``adam_bytes`` and ``adam_flops`` each and ``muon`` Muon parameters (MUON_STEP_BYTES, MUON_FLOPS_PER_PARAM; the
    cast to bf16 and back only at ``muon_fp32_matmul_prec`` medium)."""
    per = MUON_STEP_BYTES - (0 if ns_dtype(tr) == "bf16" else CAST_BYTES)
    return adam_params * adam_bytes + muon * per, adam_params * adam_flops + muon * MUON_FLOPS_PER_PARAM
