"""The scenario spec: the frozen dataclasses a scenario file is read into.

Nothing downstream of the scenario package reads YAML. All quantities are SI here
(bytes, bytes/s, seconds, FLOP/s); units are parsed once, at load time, by
reader.py against the key table of schema.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

# training.precision → (GpuSpec field of its dense GEMM peak, that rate in words). Why fp32 is the
# FP32 rate and not TF32: emulator/devices/compute.py, "Precision".
PRECISION_PEAK = {
    "bf16": ("peak_flops", "bf16 tensor-core"),
    "fp16": ("peak_flops", "fp16 tensor-core"),
    "fp32": ("peak_flops_fp32", "FP32 (CUDA-core, no TF32)"),
    "tf32": ("peak_flops_tf32", "TF32 tensor-core"),
    "fp8": ("peak_flops_fp8", "FP8 tensor-core"),
}

# live.skew_base / live.skew_slope defaults: the fit σ(c) = a + b·c of the arrival spread of 4 gloo
# processes on this project's 2-core machine, 2026-12-03 16:14 UTC, 150 rounds of 7 kernel lengths
# (benchmarks/live_skew_calibration.py; the measured table is in the README, "Arrival skew").
SKEW_BASE_S = 2.25e-3
SKEW_SLOPE = 0.1274


def precision_refusal(gpu: "GpuSpec", precision: str) -> str:
    """Why ``gpu`` cannot run ``precision`` (its catalog entry gives no rate for it)."""
    field, words = PRECISION_PEAK[precision]
    return (f"{precision} needs the GPU's {words} rate, but GPU {gpu.name} has none (its catalog entry gives "
            f"no {field}); choose another precision or GPU, or give the GPU a {field}")


@dataclass(frozen=True)
class GpuSpec:
    name: str
    peak_flops: float  # dense bf16/fp16 tensor-core FLOP/s
    hbm_bandwidth: float  # B/s
    memory_bytes: float  # B
    launch_overhead: float = 4e-6  # s per kernel
    gemm_efficiency: float = 0.0  # measured fraction of peak of large GEMMs; 0: the model's (compute.py)
    memory_efficiency: float = 0.0  # measured fraction of HBM bandwidth of streaming kernels; 0: the model's
    sm_count: int = 0  # streaming multiprocessors; 0: unknown, costed as an A100's (devices/compute.py)
    matmul_fraction: float = 0.0  # measured max achievable matmul FLOP/s / dense peak; 0: unmeasured (as A100)
    grouped_gemm_efficiency: float = 0.0  # MoE grouped GEMM / the batched GEMM of its groups; 0: 1.0 (layer.py)
    kernel_table: str = ""  # built-in measured-kernel table (devices/kernels.py: h100, h200, b200); "": none
    kernels: tuple[tuple[str, str, tuple[int, ...], float], ...] = ()  # measured (op, dtype, dims, s), first
    peak_flops_fp32: float = 0.0  # FP32 (CUDA-core) FLOP/s; 0: unknown (training.precision fp32 is refused)
    peak_flops_tf32: float = 0.0  # dense TF32 tensor-core FLOP/s; 0: none (precision tf32 is refused)
    peak_flops_fp8: float = 0.0  # dense FP8 tensor-core FLOP/s; 0: none (precision fp8 is refused)
    peak_flops_fp4: float = 0.0  # dense FP4 (NVFP4/MXFP4) tensor-core FLOP/s; 0: none
    # compute kernels run this many times longer while a communication kernel of the same GPU is
    # resident (NCCL's kernels hold SMs and HBM bandwidth); 1: no slowdown (engine.py)
    comm_overlap_slowdown: float = 1.0

    def peak_at(self, precision: str) -> float:
        """Dense FLOP/s of GEMMs at ``training.precision`` (PRECISION_PEAK); 0 when the GPU has no such rate."""
        return float(getattr(self, PRECISION_PEAK[precision][0]))


@dataclass(frozen=True)
class NodeSpec:
    name: str
    gpus_per_node: int
    gpu: GpuSpec
    intra: str  # "nvswitch" | "pcie"
    intra_bandwidth: float  # B/s per GPU port, each direction (line rate)
    intra_latency: float  # s per link
    intra_efficiency: float  # achieved / line rate for collectives (nccl-tests calibrated)
    nics: int  # NICs per node (compute rails)
    nic_bandwidth: float  # B/s per NIC, each direction (line rate)
    nic_latency: float  # s per link
    nic_efficiency: float
    step_latency_intra: float = 0.0  # s, per-step software latency of a collective inside a node
    step_latency_inter: float = 0.0  # s, per-step software latency across nodes
    collective_launch: float = 0.0  # s, fixed cost of one collective call
    nvls_busbw: float = 0.0  # B/s, NVLink SHARP all-reduce bus bandwidth inside an NVLink domain; 0: no NVLS
    # GPUs that share one NVLink switch domain (a GB200 NVL72 rack: 72 GPUs over 18 nodes of 4); 0: the node's
    # own GPUs (gpus_per_node). The network treats each domain as one node (network/domain.py).
    nvlink_domain: int = 0

    @property
    def domain(self) -> int:
        """GPUs of one NVLink domain: ``nvlink_domain``, or ``gpus_per_node`` where it is not given."""
        return self.nvlink_domain or self.gpus_per_node


@dataclass(frozen=True)
class FabricSpec:
    kind: str = "single_switch"  # schema.FABRIC_KINDS: single_switch, fat_tree, fat_tree3, rail, multi_plane, ...
    oversubscription: float = 1.0
    link_bandwidth: float | None = None  # B/s per fabric link; default: the NIC rate
    latency: float = 1e-6  # s per fabric link
    graph: str | None = None  # path, for kind == custom
    leaf_size: int = 16  # nodes per leaf (fat_tree) or per rail switch (rail)
    torus_dims: tuple[int, ...] = ()  # for kind == torus; default: a ring
    routing: str = "spray"  # spray (every flow split evenly over its equal-cost paths) | ecmp_hash (one, by hash)
    seed: int = 0  # seed of the ECMP hash
    spines: int = 0  # spine switches (fat_tree, rail; per pod: fat_tree3; per plane: multi_plane); 0: one per NIC
    pod_size: int = 4  # leaves per pod (fat_tree3)
    cores: int = 0  # core switches per spine position (fat_tree3); 0: pod_size
    group_size: int = 4  # routers per group (dragonfly)
    global_links: int = 1  # links between each pair of groups (dragonfly)
    sharp: bool = False  # in-network reduction in the switches (SHARP / NCCL CollNet); collectives.algorithm collnet


@dataclass(frozen=True)
class Override:
    """A fault or straggler. kind: gpu_slowdown | link_degrade | link_fail | node_fail."""

    kind: str
    target: str  # "gpu:5", "node:3", or a link "src->dst" in topology node names
    factor: float = 1.0  # slowdown (>1 is slower) or bandwidth factor (<1 is slower)
    extra_latency: float = 0.0  # s
    at: float | None = None  # s: the fault begins then, in the middle of the run (links only); None: from the start
    until: float | None = None  # s: the link recovers then; None: never


@dataclass(frozen=True)
class ClusterSpec:
    nodes: int
    node: NodeSpec | None
    fabric: FabricSpec = field(default_factory=FabricSpec)
    overrides: tuple[Override, ...] = ()


@dataclass(frozen=True)
class ModelSpec:
    preset: str | None = None
    layers: int = 0
    hidden: int = 0
    heads: int = 0
    ffn_hidden: int = 0
    seq_len: int = 0
    vocab: int = 0
    kv_heads: int = 0  # 0: same as heads
    experts: int = 0  # 0: dense
    top_k: int = 0
    swiglu: bool = False
    tied_embeddings: bool = False
    causal: bool = True  # a causal attention mask (decoders); False: bidirectional (BERT)
    activation: str = ""  # MLP: gelu | swiglu | squared_relu; "": swiglu if swiglu else gelu
    biases: bool | None = None  # linear biases and layernorm shifts; None: not swiglu (GPT yes, Llama no)
    dropout: bool | None = None  # hidden and attention dropout; None: as biases (GPT yes, Llama no)
    norm: str = ""  # layernorm (gain + shift) | rmsnorm (gain); "": layernorm if biases else rmsnorm
    # Mixture-of-Experts beyond experts/top_k (DeepSeek-MoE, Qwen-MoE): workload/models.py
    expert_ffn_hidden: int = 0  # MLP width of one routed expert; 0: ffn_hidden
    shared_experts: int = 0  # experts every token goes through (run as one MLP of their summed width)
    shared_expert_ffn_hidden: int = 0  # width of one shared expert; 0: expert_ffn_hidden
    first_dense_layers: int = 0  # leading layers with a dense MLP of ffn_hidden (DeepSeek first_k_dense_replace)
    moe_imbalance: float = 1.0  # tokens of the busiest expert / the mean (1: perfectly balanced routing)
    moe_expert_load: tuple[float, ...] = ()  # measured tokens per expert (instead of moe_imbalance); (): none
    # Multi-latent attention (DeepSeek-V2/V3) when kv_lora_rank > 0
    q_lora_rank: int = 0  # query down-projection rank; 0: a full query projection
    kv_lora_rank: int = 0  # compressed key/value rank; 0: standard attention
    qk_nope_head_dim: int = 0  # per-head query/key dims without rotary embedding; 0: hidden / heads
    qk_rope_head_dim: int = 0  # per-head query/key dims with the decoupled rotary embedding
    v_head_dim: int = 0  # per-head value dims; 0: hidden / heads
    head_dim: int = 0  # per-head query, key and value dims of any attention (Qwen3: 128); 0: hidden / heads
    # sliding-window attention (GPT-OSS: 128): each query attends its last sliding_window keys; 0: none
    sliding_window: int = 0
    # with a window: every N-th layer attends fully, (N-1):1 (Megatron's window_attn_skip_freq); 0: every layer windowed
    window_attn_skip_freq: int = 0
    softmax_type: str = "vanilla"  # vanilla | off-by-one | learnable (sinks: GPT-OSS; Megatron's softmax_type)

    def resolved(self) -> "ModelSpec":
        """The implied defaults filled in: ffn_hidden 0 → 4·hidden, kv_heads 0 → heads,
        top_k 0 → 1 for an MoE model, the activation from ``swiglu`` (and back), biases
        from the activation's family, dropout as biases, the norm from the biases."""
        act = self.activation or ("swiglu" if self.swiglu else "gelu")
        gated = act == "swiglu"
        biases = (not gated) if self.biases is None else self.biases
        return replace(self, ffn_hidden=self.ffn_hidden or 4 * self.hidden, kv_heads=self.kv_heads or self.heads,
                       top_k=self.top_k or (1 if self.experts else 0), activation=act, swiglu=gated,
                       biases=biases, dropout=biases if self.dropout is None else self.dropout,
                       norm=self.norm or ("layernorm" if biases else "rmsnorm"))


@dataclass(frozen=True)
class TrainingSpec:
    global_batch: int = 1
    micro_batch: int = 1
    precision: str = "bf16"  # bf16 | fp16 | fp32 | tf32 | fp8 (devices/compute.py: the peak each runs at)
    recompute: str = "none"  # none | selective | full
    attention: str = "unfused"  # unfused (Megatron's softmax kernels, as calibrated) | flash (cuDNN) | fa2
    grad_reduce: str = "auto"  # data-parallel gradient reduction type: auto (fp32 for bf16) | fp32 | bf16 | fp16
    fp8_params: bool = False  # fp8 only: the layers' GEMM weights stored in fp8 (NeMo's fp8_params, memory.py)
    # the distributed optimizer's implementation (memory.py, optimizer_state_bytes): megatron (Megatron-Core's
    # DistributedOptimizer, fp32 main weights) | apex (Apex DistributedFusedAdam as NeMo sets it up: bf16
    # weights' fp32 masters kept as their 16-bit remainders)
    optimizer: str = "megatron"


@dataclass(frozen=True)
class ParallelSpec:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int | None = None  # expert tensor-parallel size; None: as tp (workload/placement.py: MoE parallel folding)
    sequence_parallel: bool = False
    zero: int = 0
    schedule: str = "1f1b"  # gpipe | 1f1b | interleaved-1f1b
    virtual_stages: int = 1
    first_chunk_layers: int | None = None  # layers of model chunk 0; None: an even split (scenario/stages.py)
    last_chunk_layers: int | None = None  # layers of the last model chunk; None: an even split
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool | None = None  # ZeRO-1/2 parameter all-gather under the next forward; None: as
    # overlap_grad_reduce (Megatron's --overlap-param-gather, which NeMo's recipes turn on with it)
    grad_bucket: float = 25e6 * 4  # B
    order: tuple[str, ...] = ()  # rank placement, slowest → fastest axis; () = Megatron's pp, dp, cp, tp


@dataclass(frozen=True)
class CollectivesSpec:
    algorithm: str = "ring"  # ring | tree | collnet | hierarchical | direct | nvls | auto (NCCL's choice)


@dataclass(frozen=True)
class ProfiledSpec:
    """What a one-GPU profile (``workload.profile``) ran, where the trace alone cannot tell: the
    micro-batch and the model's sizes. 0: not given (kv_heads: as heads; ffn_hidden: 4 x hidden)."""

    micro_batch: int = 0
    seq_len: int = 0
    layers: int = 0
    hidden: int = 0
    heads: int = 0
    kv_heads: int = 0
    ffn_hidden: int = 0
    vocab: int = 0
    peak_memory: float = 0.0  # B, the profiled run's peak (torch.cuda.max_memory_allocated); 0: not given


@dataclass(frozen=True)
class WorkloadSpec:
    trace: str | None = None  # path, resolved relative to the scenario file
    format: str = "emulator"  # emulator | kineto | chakra
    mirror: int = 0  # replay a one-rank trace as N data-parallel ranks
    comm_groups: str | None = None  # chakra: the communicator-group file (default: comm_group.json beside)
    profile: str | None = None  # a one-GPU PyTorch profiler trace of the user's script (workload/profiled.py)
    profiled: ProfiledSpec | None = None  # what that profile ran


@dataclass(frozen=True)
class SimulationSpec:
    iterations: int = 1
    fold: str = "auto"  # auto | off
    detail: str = "layer"  # layer | op
    # a fold in effect over replicas whose transfers have other latencies is kept, bounded, when its
    # iteration times at the least and the greatest of those latencies agree to this (relative);
    # 0: refused, the run made rank by rank (exact)
    fold_tolerance: float = 0.0


@dataclass(frozen=True)
class LiveSpec:
    """``emulator live`` only: the arrival-skew model of the emulated ranks (``emulator.live.skew``)."""

    skew: str = "off"  # off | model
    skew_base: float = SKEW_BASE_S  # s: σ of a rank's arrival after no compute (a)
    skew_slope: float = SKEW_SLOPE  # σ grows by this per second of compute since the last sync (b)


@dataclass(frozen=True)
class JobSpec:
    """One job of a multi-job scenario (``jobs:``): its own workload and where it runs.

    ``placement`` is a policy (contiguous | spread | random) or "list" for an explicit
    ``node_list``; the loader resolves every policy to ``nodes_assigned`` (node indices,
    in the order the job's ranks fill them), so nothing downstream re-runs a policy.
    """

    name: str
    nodes: int = 0  # how many nodes the job uses
    placement: str = "contiguous"  # contiguous | spread | random | list
    node_list: tuple[int, ...] = ()  # for placement "list": the nodes, in rank order
    seed: int = 0  # for placement "random"
    start: float = 0.0  # s, when the job starts (offset from t = 0)
    model: ModelSpec | None = None
    training: TrainingSpec = field(default_factory=TrainingSpec)
    parallel: ParallelSpec = field(default_factory=ParallelSpec)
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    nodes_assigned: tuple[int, ...] = ()  # resolved by the loader (scenario/allocation.py)
    entry: str = ""  # the jobs: entry this job is a copy of (``count``), its name; "" for the job itself


@dataclass(frozen=True)
class Scenario:
    name: str
    cluster: ClusterSpec
    model: ModelSpec | None = None
    training: TrainingSpec = field(default_factory=TrainingSpec)
    parallel: ParallelSpec = field(default_factory=ParallelSpec)
    collectives: CollectivesSpec = field(default_factory=CollectivesSpec)
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    simulation: SimulationSpec = field(default_factory=SimulationSpec)
    live: LiveSpec = field(default_factory=LiveSpec)
    jobs: tuple[JobSpec, ...] = ()  # several jobs on one fabric; empty: the one job above
    path: str = ""  # the file it was loaded from, for messages and relative paths

    @property
    def gpus(self) -> int:
        node = self.cluster.node
        return self.cluster.nodes * node.gpus_per_node if node else 0
