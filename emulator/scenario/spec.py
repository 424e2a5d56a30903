"""The scenario spec: the frozen dataclasses a scenario file is read into, and the one
description of its keys.

Nothing downstream of the scenario package reads YAML. All quantities are SI here
(bytes, bytes/s, seconds, FLOP/s); units are parsed once, at load time, by reader.py.

Each field is declared with ``key(...)`` (emulator/scenario/keys.py): its help text, unit
kind, allowed values, bounds and default. The key table that the reader checks a file
against, the catalog's entries, the JSON Schema of ``emulator schema`` (schema.py) and
the reference page of keys (docs/reference_pages.py) are all derived from these fields;
the rules between keys stay in the rule book (rules.py) and the loader's checks (checks.py).

How to add a scenario key (one place)
-------------------------------------
Add a field to the section's dataclass below (``training:`` is TrainingSpec, ``cluster.node.gpu:``
GpuSpec, ...), declared with ``key``; the examples are fields of this file::

    sequence_parallel: bool = key("Megatron sequence parallelism.", default=False)
    hbm_bandwidth: float = key('HBM bandwidth, e.g. "3350 GB/s".', unit="bandwidth", minimum=MIN_BANDWIDTH)
    recompute: str = key("Activation recomputation.", default="none", choices=("none", "selective", "full"))
    etp: int | None = key("Expert tensor-parallel size; absent: tp.", default=None, minimum=1, maximum=10**6)

- the annotation gives the type: ``int``, ``float`` (a plain number), ``bool``, ``str``,
  ``tuple[int, ...]``, ``tuple[float, ...]``, a spec dataclass (a section), ``tuple[Spec, ...]``
  (a list of sections); ``X | None`` (default None) is a key that may be absent;
- ``unit=``: bytes, time, bandwidth or flops_rate (a ``float``, written with its unit, kept in SI);
  ``kind=``: ratio, path, axis_order or placement; ``choices=``: the values of a string;
- ``minimum=`` / ``maximum=`` / ``positive=True``: bounds; ``required=True``: the file must give it;
- ``catalog=``: gpu, node or model, whose names may stand in; ``name=``: the key's name in the
  file where it differs from the field's;
- the first argument is the help text that ``emulator schema``, the reference page and the
  "is required" errors show: one or two sentences, a unit example ('e.g. "2 us"') for a quantity,
  and what absent or 0 means where that is not the default's plain meaning.

Keys are listed (in messages, the schema and the page) in field order; a field without a
default goes before those with one (the dataclass rule). That is all: the reader reads and
checks the key in a file, a catalog entry and ``--set``, and ``emulator schema`` and the
reference page list it. A rule that ties it to other keys goes into the rule book (rules.py),
or into the loader's checks (checks.py) where it needs the whole scenario or which keys the file gave.
A field that no file gives (the loader's bookkeeping) is declared with ``internal("what it
holds")``; a key that the file gives and the spec does not keep, with ``file_key`` in the
class's ``FILE_KEYS``. tests/test_spec_keys.py checks that every field is one or the other.
A new section of plain keys at the top level (a Scenario field such as ``live``) is also named
in yamltree.SUB_SECTIONS, the sections the reader reads alike.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from emulator.scenario.keys import MAX_LATENCY, MIN_BANDWIDTH, FileKey, file_key, internal, key

# training.precision → (GpuSpec field of its dense GEMM peak, that rate in words). Why fp32 is the
# FP32 rate and not TF32: emulator/devices/compute.py, "Precision".
PRECISION_PEAK = {
    "bf16": ("peak_flops", "bf16 tensor-core"),
    "fp16": ("peak_flops", "fp16 tensor-core"),
    "fp32": ("peak_flops_fp32", "FP32 (CUDA-core, no TF32)"),
    "tf32": ("peak_flops_tf32", "TF32 tensor-core"),
    "fp8": ("peak_flops_fp8", "FP8 tensor-core"),
    "mxfp8": ("peak_flops_fp8", "MXFP8 (block-scaled FP8) tensor-core"),
    "nvfp4": ("peak_flops_fp4", "NVFP4 tensor-core"),
}

# Precisions whose GEMMs need block-scaled tensor cores (sm_100 and later: Megatron-LM
# megatron/core/transformer/transformer_config.py, fp8_recipe "'mxfp8' for Blackwell architecture only",
# fp4_recipe "NVFP4BlockScaling recipe for Blackwell+ architecture"). FP4 and the block-scaled formats
# arrive together with Blackwell's tensor cores, so a GPU has them when its entry gives a peak_flops_fp4.
BLOCK_SCALED = ("mxfp8", "nvfp4")
# Quantised precisions (Transformer Engine recipes: emulator/workload/layer.py) and fp8's scaling recipes
# (Megatron-LM's --fp8-recipe names): delayed (an amax history) | tensorwise (current scaling).
QUANTISED = ("fp8", "mxfp8", "nvfp4")
FP8_RECIPES = ("delayed", "tensorwise", "blockwise")

# live.skew_base / live.skew_slope defaults: the fit σ(c) = a + b·c of the arrival spread of 4 gloo
# processes on this project's 2-core machine, 2026-12-03 16:14 UTC, 150 rounds of 7 kernel lengths
# (benchmarks/live_skew_calibration.py; the measured table is in the README, "Arrival skew").
SKEW_BASE_S = 2.25e-3
SKEW_SLOPE = 0.1274


# The values some keys take (their choices; the reader and the rule book read them from here).
FABRIC_KINDS = ("single_switch", "fat_tree", "fat_tree3", "rail", "multi_plane", "dragonfly", "ring", "torus",
                "custom")
ROUTINGS = ("spray", "ecmp_hash")
FAULT_KINDS = ("gpu_slowdown", "link_degrade", "link_fail", "node_fail")
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "dualpipev", "dualpipe")
AXES = ("pp", "dp", "cp", "tp")  # the parallel axes a rank placement orders
PLACEMENTS = ("contiguous", "spread", "random")  # job placement policies (emulator/scenario/allocation.py)
# The largest world a mirrored trace may replay: 2**20 ranks, about ten times the largest
# GPU clusters built to date (~1e5 GPUs); the cluster's own GPU count is checked too (checks.py).
MAX_MIRROR = 2**20


def precision_refusal(gpu: "GpuSpec", precision: str) -> str:
    """Why ``gpu`` cannot run ``precision`` (its catalog entry gives no rate for it)."""
    field, words = PRECISION_PEAK[precision]
    if precision in BLOCK_SCALED and gpu.peak_flops_fp4 <= 0:
        return (f"{precision} for Blackwell only (Megatron-LM): it needs the GPU's {words} rate, block-scaled "
                f"tensor cores (sm_100 and later), but GPU {gpu.name} has none (its catalog entry gives no "
                f"peak_flops_fp4); choose fp8 or a Blackwell GPU")
    return (f"{precision} needs the GPU's {words} rate, but GPU {gpu.name} has none (its catalog entry gives "
            f"no {field}); choose another precision or GPU, or give the GPU a {field}")


@dataclass(frozen=True)
class GpuSpec:
    FILE_KEYS: ClassVar[tuple[FileKey, ...]] = (
        file_key("preset", "A catalog GPU to start from; the other keys change its figures.", catalog="gpu",
                 type="str"),)

    name: str = key("A label for this GPU type.")
    peak_flops: float = key('Dense bf16/fp16 tensor-core peak, e.g. "989.4 TFLOP/s".', unit="flops_rate", positive=True)
    hbm_bandwidth: float = key('HBM bandwidth, e.g. "3350 GB/s".', unit="bandwidth", minimum=MIN_BANDWIDTH)
    memory_bytes: float = key('HBM capacity, e.g. "80 GiB".', unit="bytes", positive=True, name="memory")
    launch_overhead: float = key('Fixed cost per kernel, e.g. "4 us".', default=4e-6, unit="time", maximum=MAX_LATENCY)
    # measured fraction of peak of large GEMMs; 0: the model's (compute.py)
    gemm_efficiency: float = key(
        "Measured fraction of peak that large GEMMs reach (emulator calibrate --kineto); replaces the model's A100 "
        "fit scaled to this GPU.", default=0.0, kind="ratio", minimum=0, maximum=1)
    memory_efficiency: float = key(
        "Measured fraction of HBM bandwidth that streaming kernels reach.",
        default=0.0, kind="ratio", minimum=0, maximum=1)
    # streaming multiprocessors; 0: unknown, costed as an A100's (devices/compute.py)
    sm_count: int = key(
        "Streaming multiprocessors (GEMM tile-wave quantisation); 0 or absent: as an A100 (108).",
        default=0, minimum=0, maximum=10**5)
    matmul_fraction: float = key(
        "Maximum achievable matmul FLOP/s as a fraction of the dense peak (a measurement, e.g. mamf-finder); 0 or "
        "absent: as an A100.", default=0.0, kind="ratio", minimum=0, maximum=1)
    peak_flops_fp32: float = key(
        'FP32 (CUDA-core) peak, e.g. "19.5 TFLOP/s"; absent: training.precision fp32 is refused.',
        default=0.0, unit="flops_rate", minimum=0)
    peak_flops_tf32: float = key(
        'Dense TF32 tensor-core peak, e.g. "156 TFLOP/s"; absent: none.', default=0.0, unit="flops_rate", minimum=0)
    peak_flops_fp8: float = key(
        'Dense FP8 tensor-core peak, e.g. "1978.9 TFLOP/s"; absent: none.', default=0.0, unit="flops_rate", minimum=0)
    peak_flops_fp4: float = key(
        'Dense FP4 (NVFP4/MXFP4) tensor-core peak, e.g. "10 PFLOP/s"; absent: none.', default=0.0,
        unit="flops_rate", minimum=0)
    # measured max achievable FP8 matmul FLOP/s / the FP8 peak (mamf-finder); 0: unmeasured (matmul_fraction's)
    matmul_fraction_fp8: float = key(
        "Maximum achievable FP8 matmul FLOP/s as a fraction of the FP8 peak (a measurement, e.g. mamf-finder); 0 or "
        "absent: matmul_fraction's (devices/compute.py).", default=0.0, kind="ratio", minimum=0, maximum=1)
    kernel_table: str = key(
        "Built-in table of measured kernels costed before the roofline (devices/kernels.py): h100, h200, b200, or "
        "none.", default="", choices=('none', 'h100', 'h200', 'b200'))
    # MoE grouped GEMM / the batched GEMM of its groups; 0: 1.0 (layer.py)
    grouped_gemm_efficiency: float = key(
        "Throughput of an MoE grouped GEMM over that of the batched GEMM of its groups' shape (a measurement); 0 or "
        "absent: 1, as DeepGEMM measured on H800 (emulator/workload/layer.py).",
        default=0.0, kind="ratio", minimum=0, maximum=1)
    # compute kernels run this many times longer while a communication kernel of the same GPU is
    # resident (NCCL's kernels hold SMs and HBM bandwidth); 1: no slowdown (engine.py)
    comm_overlap_slowdown: float = key(
        "Compute kernels run this many times longer while a communication kernel of the same GPU is resident (NCCL "
        "holds SMs and HBM bandwidth); 1 or absent: no slowdown. A measurement: emulator calibrate --kineto.",
        default=1.0, minimum=1, maximum=10)
    kernels: tuple[tuple[str, str, tuple[int, ...], float], ...] = internal(
        "Measured kernels (op, dtype, dims, s) of a catalog entry (emulator calibrate --kineto writes them), "
        "costed before kernel_table and the roofline (devices/kernels.py).", default=())

    def peak_at(self, precision: str) -> float:
        """Dense FLOP/s of GEMMs at ``training.precision`` (PRECISION_PEAK); 0 when the GPU has no such rate
        (mxfp8 and nvfp4 also need block-scaled tensor cores: BLOCK_SCALED)."""
        if precision in BLOCK_SCALED and self.peak_flops_fp4 <= 0:
            return 0.0
        return float(getattr(self, PRECISION_PEAK[precision][0]))


@dataclass(frozen=True)
class NodeSpec:
    FILE_KEYS: ClassVar[tuple[FileKey, ...]] = (
        file_key("preset", "A catalog node to start from; the other keys change it.", catalog="node", type="str"),)

    name: str = key("A label for this node type.")
    gpus_per_node: int = key("GPUs in one node.", minimum=1, maximum=4096)
    gpu: GpuSpec = key("A catalog GPU name, or a mapping of GPU figures.", catalog="gpu")
    intra: str = key("How GPUs of a node connect.", choices=('nvswitch', 'pcie'))
    intra_bandwidth: float = key(
        'Line rate of one GPU port, each direction, e.g. "450 GB/s".', unit="bandwidth", minimum=MIN_BANDWIDTH)
    intra_latency: float = key('Latency of one intra-node link, e.g. "0.15 us".', unit="time", maximum=MAX_LATENCY)
    intra_efficiency: float = key(
        "Achieved / line rate inside a node (nccl-tests), in (0, 1].", kind="ratio", maximum=1.0, positive=True)
    nics: int = key("Network cards per node (compute rails).", minimum=0, maximum=1024)
    nic_bandwidth: float = key(
        'Line rate of one NIC, each direction, e.g. "400 Gb/s".', unit="bandwidth", minimum=MIN_BANDWIDTH)
    nic_latency: float = key('Latency of a NIC link, e.g. "0.5 us".', unit="time", maximum=MAX_LATENCY)
    nic_efficiency: float = key(
        "Achieved / line rate of a NIC (nccl-tests), in (0, 1].", kind="ratio", maximum=1.0, positive=True)
    step_latency_intra: float = key(
        "Software latency per collective step inside a node.", default=0.0, unit="time", maximum=MAX_LATENCY)
    step_latency_inter: float = key(
        "Software latency per collective step across nodes.", default=0.0, unit="time", maximum=MAX_LATENCY)
    collective_launch: float = key("Fixed cost of one collective call.", default=0.0, unit="time", maximum=MAX_LATENCY)
    nvls_busbw: float = key(
        "Bus bandwidth of an all-reduce by NVLink SHARP (in-switch reduction) inside a node (an NVLink domain), "
        "large messages (nccl-tests); used by collectives.algorithm: nvls. Absent: the node has no NVLS.",
        default=0.0, unit="bandwidth", minimum=MIN_BANDWIDTH)
    # GPUs that share one NVLink switch domain (a GB200 NVL72 rack: 72 GPUs over 18 nodes of 4); 0: the node's
    # own GPUs (gpus_per_node). The network treats each domain as one node (network/domain.py).
    nvlink_domain: int = key(
        "GPUs that share one NVLink switch domain, a multiple of gpus_per_node: 72 in a GB200/GB300 NVL72 rack of 18 "
        "nodes (compute trays) of 4, 64 for 16 trays; absent: gpus_per_node. The intra_* keys, step_latency_intra "
        "and nvls_busbw then hold for the whole domain, and the network treats it as one node.",
        default=0, minimum=0, maximum=4096)
    # a GPU's copies to and from pinned host memory (training.fine_grained_activation_offloading): PCIe or NVLink-C2C
    host_bandwidth: float = key(
        "Copy rate between one GPU and pinned host memory, each direction (nvbandwidth host_to_device and "
        "device_to_host), used by training.fine_grained_activation_offloading; absent: not known, and offloading "
        "is refused.", default=0.0, unit="bandwidth", minimum=MIN_BANDWIDTH)
    # the host's cost to issue one kernel or collective (workload/host.py): eager PyTorch's Python, dispatcher and
    # cudaLaunchKernel; 0: the host is never what the GPU waits for
    host_launch: float = key(
        'Host seconds to issue one kernel or collective in eager PyTorch (Python, the ATen dispatcher and the '
        'launch), e.g. "11.3 us"; the GPU waits when the host falls behind (small layers, many small MoE kernels), '
        'and training.cuda_graph_impl cuts it. 0 or absent: the host is not modelled.',
        default=0.0, unit="time", maximum=MAX_LATENCY)

    @property
    def domain(self) -> int:
        """GPUs of one NVLink domain: ``nvlink_domain``, or ``gpus_per_node`` where it is not given."""
        return self.nvlink_domain or self.gpus_per_node


@dataclass(frozen=True)
class FabricSpec:
    kind: str = key("Topology between nodes.", default="single_switch", choices=FABRIC_KINDS)
    oversubscription: float = key(
        'Leaf down/up bandwidth ratio, 1 or more (2 or "2:1").', default=1.0, kind="ratio", minimum=1.0, maximum=1e6)
    link_bandwidth: float | None = key(
        "Bandwidth of one fabric link; default: the NIC rate.", default=None, unit="bandwidth", minimum=MIN_BANDWIDTH)
    latency: float = key('Latency of one fabric link, e.g. "1 us".', default=1e-6, unit="time", maximum=MAX_LATENCY)
    graph: str | None = key(
        "Graph file (nodes and links) for kind: custom, relative to the scenario.", default=None, kind="path")
    leaf_size: int = key(
        "Nodes per leaf (fat_tree, fat_tree3, multi_plane), per rail switch (rail) or per router (dragonfly).",
        default=16, minimum=1)
    torus_dims: tuple[int, ...] = key("Torus dimensions, e.g. [4, 4, 2]; default: a ring.", default=())
    routing: str = key(
        "ECMP over equal-cost paths: spray (each flow split evenly over them, the default) or ecmp_hash (each flow "
        "takes one, chosen by a seeded hash: collisions happen).", default="spray", choices=ROUTINGS)
    seed: int = key("Seed of the ECMP hash (routing: ecmp_hash).", default=0, minimum=0, maximum=2**63 - 1)
    spines: int = key(
        "Spine switches (fat_tree, rail; per pod for fat_tree3; per plane for multi_plane); absent: one per NIC.",
        default=0, minimum=1, maximum=10**5)
    pod_size: int = key("Leaves per pod (fat_tree3).", default=4, minimum=1, maximum=10**5)
    cores: int = key(
        "Core switches per spine position (fat_tree3); absent: pod_size.", default=0, minimum=1, maximum=10**5)
    group_size: int = key("Routers per group (dragonfly).", default=4, minimum=1, maximum=10**5)
    global_links: int = key(
        "Links between each pair of groups (dragonfly), at most group_size.", default=1, minimum=1, maximum=10**5)
    sharp: bool = key(
        "In-network reduction in the fabric's switches (InfiniBand SHARP, NCCL CollNet): enables "
        "collectives.algorithm collnet, and auto may choose it. Not on ring or torus.", default=False)


@dataclass(frozen=True)
class Fault:
    """A fault or straggler, one item of ``cluster.overrides``: a slow GPU, a degraded or failed link, a failed node."""

    kind: str = key("What goes wrong.", choices=FAULT_KINDS, required=True)
    target: str = key('"gpu:5", "node:3", or a link "src->dst" in topology node names.', required=True)
    factor: float = key(
        "Slowdown (>1 is slower) or bandwidth factor (<1 is slower).", default=1.0, maximum=1e6, positive=True)
    extra_latency: float = key('Added latency, e.g. "5 us".', default=0.0, unit="time", maximum=MAX_LATENCY)
    # moments of a run, not latencies: not held to MAX_LATENCY (a fault at minute 3 is a fair question)
    at: float | None = key(
        'When a link fault begins, in the middle of the run, e.g. "2.5 s" (link_degrade, link_fail); absent: from '
        "the start.", default=None, unit="time", minimum=0)
    until: float | None = key(
        'When the link recovers, e.g. "4 s" (after at); absent: never.', default=None, unit="time", minimum=0)


@dataclass(frozen=True)
class ClusterSpec:
    nodes: int = key(
        "Number of nodes.", minimum=1, maximum=10**6, required=True, required_unless=('fabric.kind', 'custom'))
    node: NodeSpec | None = key(
        "A catalog node (dgx-a100, dgx-h100, ...) or an inline node.",
        required=True, required_unless=('fabric.kind', 'custom'), catalog="node")
    fabric: FabricSpec = key("The network between nodes.", factory=FabricSpec)
    overrides: tuple[Fault, ...] = key("Faults and stragglers.", default=())

    FILE_KEYS: ClassVar[tuple[FileKey, ...]] = (
        file_key("catalog", "A catalog file of your own (as `emulator calibrate --out` writes) whose nodes and GPUs "
                            "`node:` and `gpu:` may name, besides the built-in ones.", after="overrides", kind="path"),)


@dataclass(frozen=True)
class ModelSpec:
    preset: str | None = key(
        "A model preset (the model catalog, emulator/scenario/catalog.py); other keys change it.",
        default=None, catalog="model")
    layers: int = key("Transformer layers.", default=0, minimum=1, maximum=10**6)
    hidden: int = key("Hidden size.", default=0, minimum=1, maximum=10**7)
    heads: int = key("Attention heads.", default=0, minimum=1, maximum=10**6)
    ffn_hidden: int = key("MLP inner size; 0 or absent: the model's default.", default=0, minimum=0, maximum=10**8)
    seq_len: int = key("Sequence length in tokens.", default=0, minimum=1, maximum=10**8)
    vocab: int = key("Vocabulary size.", default=0, minimum=1, maximum=10**8)
    kv_heads: int = key("Key/value heads (GQA); 0: as heads.", default=0, minimum=0, maximum=10**6)
    experts: int = key("MoE experts per layer; 0: dense.", default=0, minimum=0, maximum=10**6)
    top_k: int = key("Experts per token (MoE).", default=0, minimum=0, maximum=10**6)
    swiglu: bool = key("SwiGLU MLP (three matrices); the same as activation: swiglu.", default=False)
    # MLP: gelu | swiglu | squared_relu; "": swiglu if swiglu else gelu
    activation: str = key(
        "MLP activation: gelu (GPT, two matrices), swiglu (Llama, gated, three) or squared_relu (Nemotron, two); "
        "absent: swiglu if swiglu, else gelu.", default="", choices=('gelu', 'swiglu', 'squared_relu'))
    # linear biases and layernorm shifts; None: not swiglu (GPT yes, Llama no)
    biases: bool | None = key(
        "Linear biases and layernorm shifts; absent: yes for gelu/squared_relu, no for swiglu.", default=None)
    # hidden and attention dropout; None: as biases (GPT yes, Llama no)
    dropout: bool | None = key("Hidden and attention dropout in training; absent: as biases.", default=None)
    # layernorm (gain + shift) | rmsnorm (gain); "": layernorm if biases else rmsnorm
    norm: str = key(
        "The layers' norms: layernorm (gain and shift, 2h each; GPT, Nemotron) or rmsnorm (gain, h; Llama); absent: "
        "layernorm if biases, else rmsnorm.", default="", choices=('layernorm', 'rmsnorm'))
    # Mixture-of-Experts beyond experts/top_k (DeepSeek-MoE, Qwen-MoE): workload/models.py
    expert_ffn_hidden: int = key(
        "MLP width of one routed expert (MoE); 0 or absent: ffn_hidden.", default=0, minimum=0, maximum=10**8)
    shared_experts: int = key(
        "Shared experts every token goes through (DeepSeek-MoE, Qwen-MoE); 0: none.",
        default=0, minimum=0, maximum=10**4)
    shared_expert_ffn_hidden: int = key(
        "MLP width of one shared expert; 0 or absent: expert_ffn_hidden.", default=0, minimum=0, maximum=10**8)
    first_dense_layers: int = key(
        "Leading layers with a dense MLP of ffn_hidden instead of experts (DeepSeek: 1 in V2, 3 in V3); 0: every "
        "layer is MoE.", default=0, minimum=0, maximum=10**6)
    moe_imbalance: float = key(
        "Tokens routed to the busiest expert over the mean, at least 1; stretches the busiest expert-parallel rank's "
        "expert GEMMs and all-to-all. Default 1: what Megatron-Core's token drop with capacity factor 1 padded to "
        "capacity (NeMo's MegatronTokenDropCallback) makes exact; a lower bound for dropless routing.",
        default=1.0, minimum=1.0, maximum=1e6)
    moe_expert_load: tuple[tuple[float, ...], ...] = key(
        "A measured routing distribution: tokens (or shares) of each expert, one number per expert in expert order; "
        "the busiest expert-parallel rank's load is read from it (Megatron's contiguous local experts). One list: "
        "every MoE layer; a list of lists: one per MoE layer, in layer order; a file name (read relative to the "
        "scenario): a text file of one line per MoE layer, numbers separated by commas or spaces, # comments. "
        "Instead of moe_imbalance.", default=(), kind="expert_load")
    moe_load_seed: int | None = key(
        "Draw each MoE layer's per-expert load, per step, from this seed (workload/routing.py drawn_load): the "
        "routed copies of one micro-batch over the EP group fall on the experts multinomially, with expert shares "
        "from a Dirichlet of moe_load_concentration (absent: equal shares, Megatron's random router). Step k of "
        "simulation.iterations takes the draw of step k. Instead of moe_imbalance, moe_expert_load and "
        "moe_router_force_load_balancing; absent: no draw.", default=None, minimum=0, maximum=2**32 - 1)
    moe_load_concentration: float | None = key(
        "With moe_load_seed: the Dirichlet concentration per expert of the experts' shares of a layer; one "
        "expert's share spreads about the mean by about 1/sqrt(concentration) of it (10: 32%, 100: 10%); absent: "
        "equal shares (only the tokens' random draw).", default=None, minimum=0.0, maximum=1e12, positive=True)
    # Megatron-Core's router and capacity keys (transformer_config.py; workload/routing.py)
    moe_router_force_load_balancing: bool = key(
        "Megatron-Core's benchmark mode (router.py: random logits): each token picks top_k experts uniformly, so each "
        "expert's load is binomial and the busiest exceeds the mean by the expected maximum of the binomials "
        "(docs/guides/moe.md). Excludes moe_imbalance and moe_expert_load.", default=False)
    moe_expert_capacity_factor: float | None = key(
        "Megatron-Core's moe_expert_capacity_factor: an expert takes at most ceil(tokens x top_k / experts x factor) "
        "tokens and drops the rest; absent: dropless.", default=None, minimum=0.0, maximum=1e6, positive=True)
    moe_token_drop_policy: str = key(
        "Which tokens a full expert drops (Megatron-Core): probs (lowest routing probability) or position (the last "
        "in the batch); the cost is the same.", default="probs", choices=("probs", "position"))
    moe_pad_expert_input_to_capacity: bool = key(
        "With moe_expert_capacity_factor: every expert runs exactly its capacity (Megatron-Core pads), so its load is "
        "the factor times the mean, however routing falls.", default=False)
    moe_router_num_groups: int = key(
        "Group-limited routing (DeepSeek-V3: 8): the experts fall in this many groups; 0: none.",
        default=0, minimum=0, maximum=10**6)
    moe_router_group_topk: int = key(
        "Group-limited routing (DeepSeek-V3: 4): a token's experts come from at most this many groups; 0: none.",
        default=0, minimum=0, maximum=10**6)
    moe_router_dtype: str = key(
        "The router's GEMM and softmax/top-k in fp32 or fp64 (Megatron-Core's moe_router_dtype; DeepSeek-V3 sets "
        "fp32); absent: the training precision.", default="", choices=("fp32", "fp64"))
    moe_router_fusion: bool = key(
        "Megatron-Core's moe_router_fusion: the routing's score function and top-k, the aux loss's scores and the "
        "aux loss each run as one Transformer Engine kernel (router.py fused_topk_with_score_function, "
        "fused_compute_score_for_moe_aux_loss, fused_moe_aux_loss) instead of a kernel per PyTorch op. Megatron's "
        "default, false; its performance recipes set it.", default=False)
    moe_permute_fusion: bool = key(
        "Megatron-Core's moe_permute_fusion: the token permutation and unpermutation as Transformer Engine's fused "
        "kernels (moe_utils.py fused_permute_with_probs, fused_unpermute) instead of PyTorch ops (a transpose and "
        "an argsort of the routing map, an index_select; a zeroed output and a scatter_add). Megatron's default, "
        "false; NeMo's MoE recipes set it (Qwen3Config, DeepSeekConfig, the performance scripts).", default=False)
    moe_router_padding_for_quantization: bool = key(
        "Megatron-Core's moe_router_padding_for_quantization: under fp8, mxfp8 or nvfp4 the routing map is padded so "
        "that each expert's token count is a multiple of the quantised GEMMs' alignment (16 for FP8, 32 for MXFP8 and "
        "NVFP4), before the alltoall dispatch or after DeepEP's; false: the experts pad and unpad their rows "
        "themselves (TE's Fp8Padding and Fp8Unpadding copies).", default=False)
    # HybridEP's static shapes and Megatron-Core's paged stash (transformer_config.py @ d98e8a64dd; workload/routing.py,
    # workload/activations.py)
    moe_expert_rank_capacity_factor: float | None = key(
        "Megatron-Core's moe_expert_rank_capacity_factor: with the flex dispatcher's hybridep backend, each expert-"
        "parallel rank receives at most tokens x top_k x factor routed copies and HybridEP drops the rest "
        "(_HybridEPManager.setup_metadata). The receive buffer then has a static size: no host sync, so the MoE "
        "layer can be captured in a CUDA graph, and its experts keep that many rows for the backward; absent: "
        "dropless, sized per step.", default=None, minimum=0.0, maximum=1e6, positive=True)
    moe_paged_stash: bool = key(
        "Megatron-Core's moe_paged_stash: the routed experts' saved activations (Transformer Engine's fused grouped "
        "MLP: fc1 input, activation input, probabilities, fc2 input) are copied out of their static-size buffers into "
        "pages of a buffer sized from the mean load, and back before the backward. "
        "Needs moe_expert_rank_capacity_factor.", default=False)
    moe_paged_stash_buffer_size_factor_cuda: float = key(
        "The paged stash's GPU buffer: the most tokens in flight at once, times this; positive: of the mean load "
        "(tokens x top_k per rank), negative: of the busiest rank's actual load (Megatron-Core's default 1.10).",
        default=1.10, minimum=-1e6, maximum=1e6)
    moe_paged_stash_buffer_size_factor_cpu: float = key(
        "The paged stash's pinned host buffer for what overflows the GPU buffer, sized as the GPU one (positive: "
        "mean, negative: actual); 0: none (Megatron-Core's default).", default=0.0, minimum=-1e6, maximum=1e6)
    # Megatron-Core's latent MoE (moe_layer.py @ d98e8a64dd: fc1_latent_proj, fc2_latent_proj; Nemotron 3 Super)
    moe_latent_size: int = key(
        "Megatron-Core's moe_latent_size: the routed experts work in this latent width. A projection (replicated "
        "over TP) takes the tokens from hidden to it before the dispatch and one takes them back after the combine, so "
        "the dispatch, the combine and the experts' GEMMs move and take latent-wide rows; the shared experts keep "
        "hidden. 0 or absent: none.", default=0, minimum=0, maximum=10**7)
    use_transformer_engine_op_fuser: bool = key(
        "Megatron-Core's use_transformer_engine_op_fuser: the routed experts as Transformer Engine's fusible ops "
        "(experts.py TEGroupedMLP._fused_forward; Megatron-Core asserts it for SwiGLU experts only with TE's "
        "NVTE_CUTEDSL_FUSED_GROUPED_MLP=1, which the bridge's recipes set beside it). On a GPU with block-scaled "
        "tensor cores under mxfp8 or nvfp4, TE runs them as its CuTe DSL fused grouped MLP (ops/fused/"
        "grouped_mlp.py): fc1 with the activation, the probabilities and the quantisation of fc2's input in one "
        "grouped GEMM, fc2's dgrad with the activation's backward and the quantisation of fc1's output gradient in "
        "another; elsewhere the same kernels as without it. Needs the experts' TP 1 and SwiGLU or squared-ReLU "
        "experts. Megatron's default, false.",
        default=False)
    moe_permute_fusion_into_hybridep: bool = key(
        "Megatron-Core's moe_permute_fusion_into_hybridep: with the flex dispatcher's hybridep backend, the dispatch "
        "writes the tokens in the experts' order and the combine reads them from it (hybrid_ep_dispatch with "
        "fused=True): no permutation or unpermutation kernels of their own. Megatron's default, false.",
        default=False)
    # Multi-latent attention (DeepSeek-V2/V3) when kv_lora_rank > 0
    q_lora_rank: int = key(
        "Multi-latent attention: rank of the query down-projection; 0: a full query projection.",
        default=0, minimum=0, maximum=10**7)
    kv_lora_rank: int = key(
        "Multi-latent attention (DeepSeek-V2/V3): rank of the compressed keys and values; 0: standard attention.",
        default=0, minimum=0, maximum=10**7)
    qk_nope_head_dim: int = key(
        "Multi-latent attention: per-head query/key dims without rotary embedding; 0: hidden/heads.",
        default=0, minimum=0, maximum=10**5)
    qk_rope_head_dim: int = key(
        "Multi-latent attention: per-head query/key dims of the decoupled rotary embedding.",
        default=0, minimum=0, maximum=10**5)
    v_head_dim: int = key(
        "Multi-latent attention: per-head value dims; 0: hidden/heads.", default=0, minimum=0, maximum=10**5)
    # DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5; workload/sparse_attention.py): Megatron-Core's
    # experimental_attention_variant "dsa" and its dsa_indexer_* keys (transformer_config.py @ d98e8a64dd)
    experimental_attention_variant: str = key(
        "Megatron-Core's experimental_attention_variant: dsa (DeepSeek Sparse Attention: a lightning indexer picks "
        "each query's dsa_indexer_topk keys and multi-latent attention attends only those); absent: dense "
        "attention. dsv4_hybrid (DeepSeek-V4: each layer's own attention by csa_compress_ratios: a sliding window "
        "over one shared key/value head, plus compressed keys, of which the indexer picks top-k at ratio 4).",
        default="", choices=("dsa", "dsv4_hybrid"))
    dsa_indexer_n_heads: int = key("DSA: the indexer's heads (DeepSeek-V3.2: 64; GLM-5: 32).", default=0,
                                   minimum=0, maximum=10**5)
    dsa_indexer_head_dim: int = key("DSA: the indexer's head dimension (DeepSeek-V3.2, GLM-5: 128).", default=0,
                                    minimum=0, maximum=10**5)
    dsa_indexer_topk: int = key("DSA: the keys each query attends (DeepSeek-V3.2, GLM-5: 2048).", default=0,
                                minimum=0, maximum=10**8)
    dsa_indexer_loss_coeff: float = key(
        "DSA: the indexer's KL loss coefficient (Megatron-Core's dsa_indexer_loss_coeff); above 0 the indexer is "
        "trained: the loss's attention target is computed and the indexer has a backward. 0 or absent: the "
        "indexer runs without gradients.", default=0.0, minimum=0.0, maximum=1e6)
    dsa_indexer_topk_freq: int = key(
        "DSA: Megatron-Core's dsa_indexer_topk_freq, cross-layer top-k sharing: above 1, only every N-th layer past "
        "dsa_indexer_skip_topk_offset has an indexer and computes its top-k; the layers between reuse it (dsa.py "
        "is_dsa_skip_topk_layer). An MTP module numbers its layers anew. 1: every layer computes its own.",
        default=1, minimum=1, maximum=10**4)
    dsa_indexer_skip_topk_offset: int = key(
        "DSA: Megatron-Core's dsa_indexer_skip_topk_offset, the layer (1-based; 0 counts as 1) from which the top-k "
        "sharing cadence counts.", default=0, minimum=0, maximum=10**6)
    dsa_indexer_use_sparse_loss: bool = key(
        "DSA: the indexer's KL loss over each query's top-k keys only (Megatron-Core's "
        "dsa_indexer_use_sparse_loss); false: over every key it may attend (the dense target).", default=False)
    # DeepSeek-V4's hybrid attention (workload/compressed_attention.py): the keys of Megatron-Bridge's DeepSeek-V4
    # provider (067f987df, deepseek_v4_bridge.py) and of its FLOP count (training/utils/flop_utils.py)
    csa_compress_ratios: tuple[int, ...] = key(
        "dsv4_hybrid: each layer's compression ratio, the decoder's then the MTP modules' (Megatron-Bridge's "
        "csa_compress_ratios): 0 a sliding window alone, 4 compressed sparse attention (CSA: every 4 tokens pooled "
        "into one key, of which the indexer picks dsa_indexer_topk), 128 heavily compressed attention (HCA: every "
        "128 tokens pooled into one key, all attended).", default=(), kind="layer_list", minimum=0, maximum=10**6)
    csa_window_size: int = key(
        "dsv4_hybrid: the sliding window every layer attends (DeepSeek-V4: 128; HF's sliding_window).", default=128,
        minimum=1, maximum=10**7)
    o_groups: int = key(
        "dsv4_hybrid: the grouped output projection's head groups (DeepSeek-V4-Flash: 8): each group's heads x "
        "head_dim go to o_lora_rank, then one linear takes o_groups x o_lora_rank to hidden.", default=0, minimum=0,
        maximum=10**5)
    o_lora_rank: int = key("dsv4_hybrid: the grouped output projection's width per group (DeepSeek-V4: 1024).",
                           default=0, minimum=0, maximum=10**7)
    # Manifold-constrained hyper-connections (Megatron-Core transformer_config.py @ d98e8a64dd; workload/
    # hyper_connection.py)
    enable_mhc_connections: bool = key(
        "Megatron-Core's enable_mhc_connections (mHC, DeepSeek-V4): the residual stream is mhc_num_residual_streams "
        "copies of hidden; around each attention and MLP block a small projection mixes them (pre, post and a "
        "Sinkhorn-normalised residual matrix).", default=False)
    mhc_num_residual_streams: int = key("mHC: the residual streams (Megatron-Core's default and DeepSeek-V4: 4).",
                                        default=4, minimum=1, maximum=64)
    mhc_sinkhorn_iterations: int = key("mHC: Sinkhorn-Knopp iterations (Megatron-Core's default and DeepSeek-V4: "
                                       "20).", default=20, minimum=1, maximum=10**4)
    use_fused_mhc: bool = key(
        "use_fused_mhc, as Megatron-Bridge's DeepSeek-V4 Blackwell recipes set it (Megatron-Core's dev branch): "
        "one kernel projects, normalises and aggregates the streams, one mixes the residual, expands the block's "
        "output and adds them; false: the separate PyTorch kernels of hyper_connection.py.", default=False)
    head_dim: int = key(
        "Per-head query, key and value dims, for any attention kind (Qwen3: 128 with hidden 4096 and 64 heads; "
        "Megatron's kv_channels); 0 or absent: hidden/heads. With multi-latent attention, the default of "
        "qk_nope_head_dim and v_head_dim.", default=0, minimum=0, maximum=10**5)
    # multi-token prediction modules (DeepSeek-V3: 1; workload/mtp.py); 0: none
    mtp_num_layers: int = key(
        "Multi-token prediction modules (Megatron-Core's mtp_num_layers; DeepSeek-V3: 1). Each is one more "
        "transformer layer (an MoE layer in an MoE model), a 2h-to-h projection, norms of the hidden state and of "
        "the shared embedding, and one more pass of the output head with its cross-entropy. 0 or absent: none.",
        default=0, minimum=0, maximum=64)
    mtp_use_repeated_layer: bool = key(
        "Megatron-Core's mtp_use_repeated_layer: the MTP depths run one module, its weights shared "
        "(gpt_layer_specs.py builds a single MTP layer spec): the compute of mtp_num_layers modules, the "
        "parameters, gradients and optimizer state of one.", default=False)
    # sliding-window attention (GPT-OSS: 128): each query attends its last sliding_window keys; 0: none
    sliding_window: int = key(
        "Sliding-window attention: each query attends its last N keys (itself included; GPT-OSS: 128, HF's "
        "sliding_window); 0 or absent: full attention. Costed in fused attention (training.attention: flash); the "
        "unfused path computes the full square.", default=0, minimum=0, maximum=10**7)
    # with a window: every N-th layer attends fully, (N-1):1 (Megatron's window_attn_skip_freq); 0: every layer
    # windowed
    window_attn_skip_freq: int = key(
        "With sliding_window: every N-th layer attends fully, the others through the window ((N-1):1, Megatron's "
        "window_attn_skip_freq; GPT-OSS: 2, alternating); 0 or absent: every layer windowed.",
        default=0, minimum=0, maximum=10**5)
    # vanilla | off-by-one | learnable (sinks: GPT-OSS; Megatron's softmax_type)
    softmax_type: str = key(
        "Attention softmax (Megatron's softmax_type): vanilla; off-by-one (a fixed extra logit); learnable "
        "(attention sinks: one learned logit per head, GPT-OSS).", default="vanilla",
        choices=("vanilla", "off-by-one", "learnable"))
    tied_embeddings: bool = key("Input and output embeddings shared.", default=False)
    causal: bool = key("A causal attention mask (decoders, the default); false: bidirectional (BERT).", default=True)
    # Megatron-Core's position_embedding_type (transformer_config.py @ d98e8a64dd); "": learned_absolute with biases,
    # else rope. Hybrid models (Megatron-Bridge's HybridModelProvider) use none.
    position_embedding_type: str = key(
        "Position embeddings (Megatron's position_embedding_type): learned_absolute (GPT), rope (Llama) or none "
        "(Nemotron-H); absent: learned_absolute with biases, else rope.", default="",
        choices=("learned_absolute", "rope", "none"))
    # hybrid models (workload/hybrid.py): Megatron-Core's hybrid_layer_pattern
    # (megatron/core/models/hybrid/hybrid_layer_allocation.py @ d98e8a64dd, Symbols) and its Mamba-2 mixer's keys
    # (megatron/core/ssm/mamba_mixer.py; defaults from transformer_config.py)
    hybrid_layer_pattern: str = key(
        "A hybrid model's layers (Megatron-Core's hybrid_layer_pattern; Nemotron-H): one symbol per layer, M a Mamba-2 "
        "mixer, * attention, - a dense MLP, E an MoE MLP; its length is layers. Absent: every layer is attention "
        "and an MLP (a transformer).", default="")
    mamba_state_dim: int = key("A Mamba-2 mixer's state size N per head (d_state).", default=128, minimum=1,
                               maximum=10**5)
    mamba_head_dim: int = key("A Mamba-2 mixer's head dimension P.", default=64, minimum=1, maximum=10**5)
    mamba_num_groups: int = key("A Mamba-2 mixer's groups of B and C (ngroups).", default=8, minimum=1,
                                maximum=10**5)
    mamba_num_heads: int = key(
        "A Mamba-2 mixer's heads; 0 or absent: 2·hidden / mamba_head_dim (expand 2).", default=0, minimum=0,
        maximum=10**6)

    # a hybrid model's gated delta net (G layers; workload/delta_net.py): Megatron-Core's linear_* keys and their
    # defaults (transformer_config.py @ d98e8a64dd), Qwen3-Next's sizes
    linear_num_key_heads: int = key("A gated delta net's query and key heads (Megatron-Core's linear_num_key_heads).",
                                    default=16, minimum=1, maximum=10**5)
    linear_num_value_heads: int = key("A gated delta net's value heads (linear_num_value_heads); a multiple of the "
                                      "key heads.", default=32, minimum=1, maximum=10**5)
    linear_key_head_dim: int = key("A gated delta net's query and key head dimension (linear_key_head_dim).",
                                   default=128, minimum=1, maximum=10**5)
    linear_value_head_dim: int = key("A gated delta net's value head dimension (linear_value_head_dim).",
                                     default=128, minimum=1, maximum=10**5)
    linear_conv_kernel_dim: int = key("A gated delta net's causal convolution taps (linear_conv_kernel_dim).",
                                      default=4, minimum=1, maximum=1024)
    attention_output_gate: bool = key(
        "Megatron-Core's attention_output_gate (Qwen3-Next): the QKV projection also gives a gate of heads x head_dim, "
        "and the attention's output is multiplied by its sigmoid before the output projection.", default=False)

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


# Megatron-Core transformer_config.py @ d98e8a64dd, ``recompute_modules`` (the choices a GPT or MoE layer has)
RECOMPUTE_MODULES = ("core_attn", "mla_up_proj", "layernorm", "moe_act", "moe", "shared_experts", "mlp", "mhc")
# Megatron-Core transformer_config.py @ d98e8a64dd, ``cuda_graph_impl`` and ``cuda_graph_modules`` (mamba: a hybrid
# model's Mamba layers; the deprecated enable_cuda_graph, external_cuda_graph and cuda_graph_scope are not taken)
CUDA_GRAPH_IMPLS = ("none", "local", "transformer_engine", "full_iteration")
CUDA_GRAPH_MODULES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba")
# Megatron-Core transformer_config.py @ d98e8a64dd, ``offload_modules`` (fine-grained activation offloading; its
# fused_group_mlp, which needs Transformer Engine's op fuser, and gdp_qkv, a GatedDeltaProduct mixer's, are not
# modelled)
OFFLOAD_MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act")


@dataclass(frozen=True)
class TrainingSpec:
    global_batch: int = key("Sequences per iteration.", default=1, minimum=1)
    micro_batch: int = key("Sequences per micro-batch.", default=1, minimum=1)
    # bf16 | fp16 | fp32 | tf32 | fp8 | mxfp8 | nvfp4 (devices/compute.py: the peak each runs at)
    precision: str = key(
        "Compute precision: bf16/fp16 at the tensor-core peak; fp32 at the FP32 rate (PyTorch's default, no TF32); "
        "tf32 (fp32 storage, TF32 matmuls) at the TF32 rate; fp8 at the FP8 rate (refused on a GPU without one); "
        "mxfp8 (1x32 blocks, E8M0 scales) at the FP8 rate and nvfp4 (16-element blocks, E4M3 scales) at the FP4 "
        "rate, both on Blackwell only (Transformer Engine recipes: docs/guides/precisions.md).",
        default="bf16", choices=tuple(PRECISION_PEAK))
    recompute: str = key("Activation recomputation.", default="none", choices=('none', 'selective', 'full'))
    # Megatron-Core's recompute_method and recompute_num_layers under full recompute (recompute.py @ d98e8a64dd,
    # _checkpointed_forward, over each model chunk's layers)
    recompute_method: str = key(
        "With recompute full, Megatron-Core's recompute_method: uniform (the chunk's layers in groups of "
        "recompute_num_layers, each group's input kept and the group rerun before its backward) or block (only the "
        "first recompute_num_layers layers of each model chunk are rerun; the others keep their activations).",
        default="uniform", choices=('uniform', 'block'))
    recompute_num_layers: int = key(
        "With recompute full, Megatron-Core's recompute_num_layers: the layers of a uniform group, or the layers of "
        "each model chunk that block recomputes.", default=1, minimum=1, maximum=10**6)
    attention: str = key(
        "Attention kernels: unfused (Megatron's, as in layers.csv), flash (cuDNN's fused flash attention, as "
        "Transformer Engine and PyTorch SDPA run it on Hopper) or fa2 (FlashAttention-2's kernels; "
        "docs/guides/kernels.md).", default="unfused", choices=('unfused', 'flash', 'fa2'))
    grad_reduce: str = key(
        "Type of the data-parallel gradient reduction, and of the gradients held (memory): auto (Megatron: fp32 when "
        "training in bf16 or fp8, else the training type), fp32, bf16 or fp16.",
        default="auto", choices=('auto', 'fp32', 'bf16', 'fp16'))
    fp8_params: bool = key(
        "With precision fp8: the layers' GEMM weights are kept in fp8 (1 B; NeMo's fp8_params, Megatron's "
        "--fp8-param-gather), and the distributed optimizer's parameter all-gather moves them in 1 B; false: bf16 "
        "weights plus Transformer Engine's cached fp8 copy and its transpose. Also with mxfp8 (MXFP8 weights).",
        default=False)
    fp4_param: bool = key(
        "With precision nvfp4: Megatron-Core's fp4_param (--fp4-param-gather): the layers' GEMM weights are kept in "
        "NVFP4 (4-bit values, an E4M3 scale per 16x16 block), quantised from the fp32 master shard by the optimizer "
        "(fp4_utils.py quantize_nvfp4_param_shard), and the distributed optimizer's parameter all-gather moves them "
        "in 1/2 + 1/256 B; false: bf16 weights, cast to both NVFP4 copies each step.", default=False)
    # precision fp8's scaling recipe (Megatron-LM --fp8-recipe): delayed | tensorwise; "": delayed (layer.py)
    fp8_recipe: str = key(
        "With precision fp8, the scaling recipe (Megatron-LM --fp8-recipe): delayed (Transformer Engine's "
        "DelayedScaling: scales from an amax history), tensorwise (Float8CurrentScaling: an amax pass before each "
        "cast, no history) or blockwise (Float8BlockScaling: an fp32 scale per 1x128 block of activations and "
        "gradients and per 128x128 block of weights, both copies of a tensor quantised from it in one pass; sm_90 "
        "and later). Absent: delayed.", default="", choices=FP8_RECIPES)
    # Transformer Engine's FP8 attention (Megatron-Core fp8_dot_product_attention: the recipe's fp8_dpa; layer.py)
    fp8_dot_product_attention: bool = key(
        "With a quantised precision and attention flash: Transformer Engine's FP8 dot product attention (Megatron-"
        "Core's fp8_dot_product_attention, TE's fp8_dpa): Q, K and V are cast to FP8, cuDNN's fused attention runs "
        "in FP8 and its output is cast back; the backward likewise.", default=False)
    # Megatron-Core's MXFP8 LM head (transformer_config.py fp8_output_proj; gpt_model.py builds the output layer as
    # extensions/transformer_engine.py TELMHeadColumnParallelLinear when fp8_utils.is_mxfp8_output_proj_active)
    fp8_output_proj: bool = key(
        "With precision mxfp8: the output layer (the LM head, and its passes over the MTP modules' hidden states) "
        "runs its GEMMs in MXFP8 as Transformer Engine's linear layer (Megatron-Core's fp8_output_proj, "
        "TELMHeadColumnParallelLinear), with its input, weight and output-gradient casts and the weight's two "
        "MXFP8 copies in memory; false: the head stays in BF16.", default=False)
    # Megatron-LM's BF16 layers of a quantised run (megatron/core/fp8_utils.py, is_first_last_bf16_layer)
    first_last_layers_bf16: bool = key(
        "With a quantised precision (fp8, mxfp8, nvfp4), keep the first num_layers_at_start_in_bf16 and the last "
        "num_layers_at_end_in_bf16 transformer layers in BF16 (Megatron-LM --first-last-layers-bf16).",
        default=False)
    num_layers_at_start_in_bf16: int = key(
        "Layers at the start kept in BF16 with first_last_layers_bf16 (Megatron-LM default 1).", default=1,
        minimum=0)
    num_layers_at_end_in_bf16: int = key(
        "Layers at the end kept in BF16 with first_last_layers_bf16 (Megatron-LM default 1).", default=1,
        minimum=0)
    # the distributed optimizer's implementation (optimizer.py, optimizer_state_bytes): megatron (Megatron-Core's
    # DistributedOptimizer, fp32 main weights) | apex (Apex DistributedFusedAdam as NeMo sets it up: bf16
    # weights' fp32 masters kept as their 16-bit remainders)
    # muon | dist_muon: Megatron-Core's optimizer names for Muon (OptimizerConfig.optimizer @ d98e8a64dd;
    # workload/muon.py), the scalar parameters on Adam
    optimizer: str = key(
        "The optimizer. Adam, as the distributed optimizer (parallel.zero 1 or 2) implements it: megatron "
        "(Megatron-Core's DistributedOptimizer: fp32 main weight, momentum and variance, 12 B a parameter over the "
        "data-parallel ranks) or apex (Apex DistributedFusedAdam as NeMo sets it up: with bf16 weights the fp32 "
        "master is kept as its 16-bit remainder, 10 B). Or Megatron-Core's Muon, by its optimizer names: muon "
        "(parallel.zero 0: every 2-D weight but the embeddings and the output layer orthogonalised by Newton-Schulz, "
        "an fp32 main weight and momentum, 8 B; the rest on Adam, 12 B; at zero 1 Megatron-LM's muon with the "
        "distributed optimizer: Megatron-Core's LayerWiseDistributedOptimizer deals whole parameters out over the "
        "data-parallel ranks, reduce-scatters the gradients into shard-aligned buckets and all-gathers the updated "
        "weights) or dist_muon (parallel.zero 1: Megatron-Bridge's name, without the distributed optimizer: the "
        "same, but the gradients all-reduced whole).", default="megatron",
        choices=('megatron', 'apex', 'muon', 'dist_muon'))
    muon_num_ns_steps: int = key(
        "With optimizer muon or dist_muon: Newton-Schulz steps per weight matrix (Megatron-Core's muon_num_ns_steps).",
        default=5, minimum=1, maximum=100)
    muon_tp_mode: str = key(
        "With optimizer muon or dist_muon and tp > 1 (Megatron-Core's muon_tp_mode): duplicated (each TP rank "
        "all-gathers a split matrix's momentum and orthogonalises it whole) or blockwise (each rank its own shard; "
        "Megatron-Bridge's distributed_muon_with_cosine_annealing default).", default="duplicated",
        choices=("duplicated", "blockwise"))
    muon_split_qkv: bool = key(
        "With optimizer muon or dist_muon: a fused QKV weight is orthogonalised as its Q, K and V blocks (Megatron-"
        "Core's muon_split_qkv).", default=True)
    muon_fp32_matmul_prec: str = key(
        "With optimizer muon or dist_muon: the precision of the Newton-Schulz matmuls (Megatron-Core's "
        "muon_fp32_matmul_prec, torch's float32 matmul precision): medium (bf16 GEMMs, X cast to bf16 and back), "
        "high (TF32 tensor cores) or highest (full FP32 on the CUDA cores; Megatron-Bridge's DeepSeek-V4-Flash Muon "
        "recipe).", default="medium", choices=("medium", "high", "highest"))
    # Megatron-Core's precision-aware optimizer (optimizer_config.py @ d98e8a64dd; workload/optimizer.py)
    use_precision_aware_optimizer: bool = key(
        "Megatron-Core's use_precision_aware_optimizer (optimizer megatron): Transformer Engine's FusedAdam keeps "
        "the moments in exp_avg_dtype and exp_avg_sq_dtype and, unquantised or with delayed scaling, the main "
        "weight (as a 16-bit remainder of a bf16 weight with store_param_remainders).", default=False)
    main_params_dtype: str = key(
        "With use_precision_aware_optimizer: the main weights' type (Megatron-Core's main_params_dtype).",
        default="fp32", choices=("fp32", "fp16"))
    exp_avg_dtype: str = key(
        "With use_precision_aware_optimizer: Adam's first moment's type (Megatron-Core's exp_avg_dtype).",
        default="fp32", choices=("fp32", "fp16", "bf16", "fp8"))
    exp_avg_sq_dtype: str = key(
        "With use_precision_aware_optimizer: Adam's second moment's type (Megatron-Core's exp_avg_sq_dtype).",
        default="fp32", choices=("fp32", "fp16", "bf16", "fp8"))
    store_param_remainders: bool = key(
        "With use_precision_aware_optimizer, where Transformer Engine keeps an fp32 main weight of a bf16 weight: "
        "only its 16-bit remainder (Megatron-Core's store_param_remainders, default true from TE 2.1).",
        default=True)
    # with recompute: selective, Megatron's --recompute-modules (workload/recompute.py); None: the emulator's
    # selective recompute (the attention core when unfused)
    recompute_modules: tuple[str, ...] | None = key(
        "With recompute: selective, the modules recomputed in the backward (Megatron's --recompute-modules): "
        "core_attn, mla_up_proj, layernorm, moe_act, moe, shared_experts, mlp. Absent: the emulator's selective "
        "recompute (the attention core when unfused; Megatron's default is [core_attn], which also reruns a fused "
        "attention).", default=None, choices=RECOMPUTE_MODULES)
    fine_grained_activation_offloading: bool = key(
        "Megatron-Core's fine-grained activation offloading (--fine-grained-activation-offloading): the inputs that "
        "the offload_modules save for their backward go to pinned host memory after their forward, on a copy "
        "stream, and come back before their backward, a layer ahead (docs/guides/moe-memory.md). Needs "
        "cluster.node.host_bandwidth.", default=False)
    offload_modules: tuple[str, ...] | None = key(
        "With fine_grained_activation_offloading, the modules whose saved inputs are offloaded (Megatron-Core's "
        "--offload-modules): attn_norm, qkv_linear, core_attn, attn_proj, mlp_norm, expert_fc1, moe_act.",
        default=None, choices=OFFLOAD_MODULES)
    cpu_offloading: bool = key(
        "Megatron-Core's cpu_offloading (Transformer Engine's get_cpu_offload_context): every tensor the first "
        "cpu_offloading_num_layers layers save for their backward goes to pinned host memory on a copy stream, each "
        "copy done before the forward of the layer that many places from the end, and comes back as many layers "
        "ahead of its backward (workload/cpu_offload.py). Needs cluster.node.host_bandwidth.", default=False)
    cpu_offloading_num_layers: int = key(
        "With cpu_offloading, how many layers (the first ones) are offloaded (Megatron-Core's "
        "cpu_offloading_num_layers; less than model.layers).", default=0, minimum=0, maximum=10**6)
    cuda_graph_impl: str = key(
        "CUDA graphs (Megatron-Core's --cuda-graph-impl): none; local or transformer_engine (per-layer graphs of the "
        "cuda_graph_modules: a graphed module's kernels cost the host one launch a pass); full_iteration (one graph "
        "for the whole forward and backward). Needs cluster.node.host_launch to change anything.",
        default="none", choices=CUDA_GRAPH_IMPLS)
    cuda_graph_modules: tuple[str, ...] = key(
        "With cuda_graph_impl local or transformer_engine, the parts of each layer captured (Megatron-Core's "
        "--cuda-graph-modules): attn, mlp (a dense layer's), moe (a drop-and-pad MoE layer's whole MLP), moe_router "
        "(the router and the shared experts), moe_preprocess (with moe_router: the dispatcher's preprocess, up to "
        "its host sync). Empty or absent: the whole layer.", default=(), choices=CUDA_GRAPH_MODULES)
    activation_offload_fraction: float = key(
        "With fine_grained_activation_offloading, the share of each model chunk's eligible module groups that are "
        "offloaded, the first in forward order; the later ones stay on the GPU (Megatron-Core's "
        "--activation-offload-fraction: a share of groups, not of bytes).", default=1.0, kind="ratio", maximum=1.0)


@dataclass(frozen=True)
class ParallelSpec:
    tp: int = key("Tensor-parallel size.", default=1, minimum=1, maximum=10**6)
    pp: int = key("Pipeline-parallel size.", default=1, minimum=1, maximum=10**6)
    dp: int = key("Data-parallel size; absent: GPUs / (tp*pp*cp).", default=1, minimum=1, maximum=10**7)
    cp: int = key("Context-parallel size.", default=1, minimum=1, maximum=10**6)
    ep: int = key(
        "Expert-parallel size; etp*ep divides tp*dp*cp (ep divides dp*cp when etp is tp).",
        default=1, minimum=1, maximum=10**6)
    # expert tensor-parallel size; None: as tp (workload/placement.py: MoE parallel folding)
    etp: int | None = key(
        "Expert tensor-parallel size (Megatron-Core's expert_tensor_parallel_size); absent: tp. Other than tp, the "
        "expert layers get their own grid etp x ep x expert-dp x pp = world (MoE parallel folding: with etp 1 the EP "
        "groups take in the attention's TP ranks).", default=None, minimum=1, maximum=10**6)
    sequence_parallel: bool = key("Megatron sequence parallelism.", default=False)
    # how context parallelism exchanges keys and values (workload/layer.py attention_core_forward)
    cp_comm_type: str = key(
        "Context parallelism's communication (Megatron-Core's cp_comm_type, Transformer Engine's attention with "
        "CP): p2p (the keys and values go round the CP ring, a step under each block's attention kernel) or a2a "
        "(DeepSpeed-Ulysses: an all-to-all of Q, K and V turns sequence shards into head shards, the attention "
        "runs on the whole sequence with heads/cp heads, an all-to-all turns its output back; heads over tp*cp "
        "must be whole), all_gather (K and V all-gathered before the attention, exposed; dK and dV "
        "reduce-scattered after its backward: the Llama 3 paper's CP) or a2a+p2p (hierarchical: an all-to-all over "
        "the first level of hierarchical_context_parallel_sizes, the K/V ring over the second).", default="p2p",
        choices=("p2p", "a2a", "all_gather", "a2a+p2p"))
    hierarchical_context_parallel_sizes: tuple[int, ...] | None = key(
        "With cp_comm_type a2a+p2p: [a2a, p2p], the sizes of the all-to-all level (consecutive CP ranks, "
        "inside a node as a rule) and of the ring over those groups; their product is cp (Megatron-Core's "
        "hierarchical_context_parallel_sizes, parallel_state.py create_hierarchical_groups).", default=None)
    # Transformer Engine's Userbuffers overlap of the TP all-gathers and reduce-scatters with the linear
    # layers' GEMMs (workload/layer.py, "Userbuffers")
    tp_comm_overlap: bool = key(
        "Megatron-Core's tp_comm_overlap (--tp-comm-overlap; NeMo's MegatronCommOverlapCallback): Transformer "
        "Engine's Userbuffers run the sequence-parallel all-gathers and reduce-scatters of the attention's and the "
        "dense MLP's linear layers beside their GEMMs, split in chunks (ring exchange for the all-gathers, a "
        "4-way pipeline for the reduce-scatters); the pipelined and bulk GEMMs give 16 SMs to the communication. "
        "Needs sequence_parallel when tp > 1; no effect at tp 1, on the experts, or with MLA.", default=False)
    tp_comm_overlap_cfg: str = key(
        "With tp_comm_overlap: the name of one of NeMo's Userbuffers configurations (nemo/collections/llm/recipes/"
        "tp_overlap_configs/userbuffers.py, e.g. userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192, as its recipes "
        "pass them): per GEMM its method, the SMs its communication holds and whether the GEMM gives them up; "
        "absent: Transformer Engine's defaults (emulator/data/userbuffers.yaml lists the names).", default="")
    zero: int = key("ZeRO stage, 0 to 3.", default=0, minimum=0, maximum=3)
    # Megatron-FSDP's hybrid sharding (HSDP; workload/builder.py, memory.py): Megatron-Core's DDP config names
    num_distributed_optimizer_instances: int = key(
        "With zero 3 (Megatron-FSDP): HSDP, the data-parallel ranks split into this many instances of consecutive "
        "ranks (Megatron-Core's num_distributed_optimizer_instances). Weights and gradients are sharded within an "
        "instance, gathered and reduce-scattered there each micro-batch; once a step the gradient shards are "
        "reduced across the instances (outer_dp_sharding_strategy). 1: plain FSDP over all of dp x cp.",
        default=1, minimum=1, maximum=4096)
    outer_dp_sharding_strategy: str = key(
        "With num_distributed_optimizer_instances > 1 (Megatron-Core's outer_dp_sharding_strategy): no_shard "
        "(the instances replicate the shards: their gradients all-reduced across the instances, the optimizer "
        "states sharded within one) or optim (the optimizer states and main weights sharded across the instances "
        "too: the gradient shards reduce-scattered across them, and the updated weights all-gathered back after "
        "the step).", default="no_shard", choices=("no_shard", "optim"))
    schedule: str = key("Pipeline schedule (docs/guides/pipeline-schedules.md). zb-v and dualpipev place two "
                        "chunks on each rank in a V (rank i holds chunks i and 2*pp-1-i): virtual_stages is 2 "
                        "(unset: 2), a pipeline_model_parallel_layout has 2*pp stages in model order; dualpipev "
                        "needs at least 2*pp micro-batches. dualpipe runs two directions: rank i holds stages i "
                        "and pp-1-i (two copies of the parameters, their gradients all-reduced over the pair); it "
                        "needs an even pp and an even number of micro-batches, at least 2*pp.", default="1f1b",
                        choices=SCHEDULES)
    virtual_stages: int = key("Model chunks per stage (interleaved-1f1b; 2 for zb-v and dualpipev, which set it "
                              "when unset).", default=1, minimum=1, maximum=10**4)
    # layers of model chunk 0; None: an even split (scenario/stages.py)
    first_chunk_layers: int | None = key(
        "Layers of the first model chunk (with virtual_stages 1: the first pipeline stage; 0: the embedding alone); "
        "the other chunks split the rest evenly. Absent: an even split.", default=None, minimum=0, maximum=10**6)
    last_chunk_layers: int | None = key(
        "Layers of the last model chunk (0: the LM head alone); see first_chunk_layers.",
        default=None, minimum=0, maximum=10**6)
    # Megatron-Core's: the embedding and the loss counted as layers in the even split (transformer_block.py
    # get_num_layers_to_build @ d98e8a64dd); the loader turns them into first_chunk_layers and last_chunk_layers
    account_for_embedding_in_pipeline_split: bool = key(
        "Megatron-Core's account_for_embedding_in_pipeline_split: the embedding counts as one layer when the layers "
        "are split evenly over pp x virtual_stages, so the first model chunk holds one layer fewer.", default=False)
    account_for_loss_in_pipeline_split: bool = key(
        "Megatron-Core's account_for_loss_in_pipeline_split: the loss counts as one layer in the even split, so the "
        "last model chunk holds one layer fewer.", default=False)
    # Megatron's flexible layout, e.g. "Et*3|(tt|)*29,m|L" (scenario/stages.py); None: the split above
    pipeline_model_parallel_layout: str | None = key(
        "Megatron's flexible pipeline layout: the stages in model order, split by |, of E (embedding), t "
        "(transformer layer), m (MTP layer) and L (loss), with x*n and (...)*n repetitions, e.g. "
        "\"Et*3|(tt|)*29,m|L\". Its stage count is pp x virtual stages (the virtual stages follow from it); not "
        "with first_chunk_layers, last_chunk_layers or virtual_stages.", default=None)
    overlap_grad_reduce: bool = key("Overlap gradient reduction with backward.", default=True)
    # ZeRO-1/2 parameter all-gather under the next forward; None: as
    overlap_param_gather: bool | None = key(
        "ZeRO-1/2: the distributed optimizer's (or dist_muon's) parameter all-gather overlaps the next iteration's "
        "forward, bucket by bucket; absent: as overlap_grad_reduce.", default=None)
    # overlap_grad_reduce (Megatron's --overlap-param-gather, which NeMo's recipes turn on with it)
    # the job's CUDA_DEVICE_MAX_CONNECTIONS (emulator/run/wiring.py issue_order: one hardware queue)
    cuda_device_max_connections: int = key(
        "The job's CUDA_DEVICE_MAX_CONNECTIONS: the hardware queues a GPU feeds its streams through; 0 (the default): "
        "not set (CUDA's 8, ASSUMPTION: a queue per stream). 1, as Megatron-Core asks for with tp or cp > 1 before "
        "Blackwell (training/arguments.py) and Megatron-Bridge's H100 recipes set: one queue, where a kernel that "
        "waits for another stream holds back every kernel issued after it (a gradient bucket's reduce-scatter "
        "behind the one before it stalls the backward issued after it).", default=0, minimum=0, maximum=32)
    grad_bucket: float = key('Gradient bucket size, e.g. "25 MB".', default=25e6 * 4, unit="bytes", positive=True)
    order: tuple[str, ...] = key(
        "Rank placement, slowest to fastest axis, e.g. [pp, dp, cp, tp] (Megatron's, the default: TP fastest inside "
        "a node).", default=(), kind="axis_order")
    # MoE token dispatch (Megatron-Core's keys; workload/dispatch.py)
    moe_token_dispatcher_type: str = key(
        "How MoE tokens reach their experts (Megatron-Core's moe_token_dispatcher_type): alltoall (NCCL all-to-all-v "
        "of the routed copies, with the token-count all-gather, the probabilities' all-to-all and a host sync), "
        "allgather (the hidden states all-gathered over the expert group, reduce-scattered back) or flex "
        "(moe_flex_dispatcher_backend's kernels). Default alltoall, the emulator's behaviour before the key; "
        "Megatron-Core's own default is allgather.", default="alltoall", choices=("alltoall", "allgather", "flex"))
    moe_flex_dispatcher_backend: str = key(
        "The flex dispatcher's kernels (Megatron-Core's moe_flex_dispatcher_backend): deepep (DeepEP's normal "
        "kernels: each token crosses the network once per destination node, then NVLink inside it) or hybridep "
        "(NVIDIA's HybridEP, DeepEP's hybrid-ep branch: the same per NVLink domain, so on a GB200/GB300 NVL72 "
        "rack an EP group of up to 72 GPUs sends nothing over its NICs; RDMA and NVLink stages pipelined in "
        "64-token chunks; needs the EP group to fill its NVLink domains equally).", default="deepep",
        choices=("deepep", "hybridep"))
    moe_flex_dispatcher_num_sms: int = key(
        "SMs the DeepEP kernels hold while they run (Megatron-Core's moe_flex_dispatcher_num_sms, DeepEP's historical "
        "default 20: Buffer.set_num_sms): compute under them runs on the rest.", default=20, minimum=1,
        maximum=10**4)
    moe_shared_expert_overlap: bool = key(
        "The shared experts' first GEMM runs under the dispatch and their second under the combine (Megatron-Core "
        "token_dispatcher.py).", default=False)
    # Megatron-Core's 1F1B all-to-all overlap (workload/builder.py run_pair; rules.py _a2a_overlap_violations)
    overlap_moe_expert_parallel_comm: bool = key(
        "Megatron-Core's 1F1B all-to-all overlap: in the steady state the forward of one micro-batch runs beside the "
        "backward of another, layer by layer, so each one's expert dispatch and combine all-to-all hide behind the "
        "other's compute (model_chunk_schedule_plan.py). Needs ep > 1, the alltoall or flex dispatcher, virtual "
        "pipeline stages when pp > 1, no full recompute, bf16 or fp16, at most one MTP layer and no "
        "moe_shared_expert_overlap (transformer_config.py).", default=False)
    delay_wgrad_compute: bool = key(
        "With overlap_moe_expert_parallel_comm: the weight-gradient GEMMs of the experts and of the attention run "
        "after their input gradients, so the backward dispatch starts sooner and the wgrad GEMMs run under it "
        "(Megatron-Core's delay_wgrad_compute).", default=False)

    def one_queue(self) -> bool:
        """One hardware queue a GPU (``cuda_device_max_connections`` 1: emulator/run/wiring.py issue_order)."""
        return self.cuda_device_max_connections == 1

    def expert_dp(self) -> int:
        """Expert-data-parallel size, the ranks that share one expert's weights: dp·cp/ep, or with MoE parallel
        folding tp·dp·cp/(etp·ep) (world/(etp·ep·pp), Megatron-Core's expert_data_parallel_size)."""
        if self.etp and self.etp != self.tp:
            return max(1, self.tp * self.dp * self.cp // (self.etp * self.ep))
        return max(1, self.dp * self.cp // self.ep)


@dataclass(frozen=True)
class CollectivesSpec:
    algorithm: str = key(
        "Collective algorithm: ring (the default; all-to-all direct, broadcast a chain per ring channel), tree "
        "(NCCL's double binary tree), collnet (in-network reduction, needs cluster.fabric.sharp), hierarchical, "
        "direct, nvls, or auto (per call, the fastest of ring, tree, collnet and nvls by the emulator's own cost; "
        "emulator collective shows the pick per size).",
        default="ring", choices=('auto', 'ring', 'tree', 'collnet', 'hierarchical', 'direct', 'nvls'))


@dataclass(frozen=True)
class ProfiledSpec:
    """What a one-GPU profile (``workload.profile``) ran, where the trace alone cannot tell: the
    micro-batch and the model's sizes. 0: not given (kv_heads: as heads; ffn_hidden: 4 x hidden)."""

    micro_batch: int = key("Samples per step in the profiled run.", default=0, minimum=1, maximum=10**6, required=True)
    seq_len: int = key("Tokens per sample in the profiled run.", default=0, minimum=1, maximum=10**8, required=True)
    layers: int = key(
        "Repeated blocks (transformer layers) of the profiled model.",
        default=0, minimum=1, maximum=10**5, required=True)
    hidden: int = key("Hidden size of the profiled model.", default=0, minimum=1, maximum=10**7, required=True)
    heads: int = key("Attention heads of the profiled model.", default=0, minimum=1, maximum=10**6, required=True)
    kv_heads: int = key(
        "Key/value heads (grouped-query attention); absent: as heads.", default=0, minimum=1, maximum=10**6)
    ffn_hidden: int = key("MLP inner size; absent: 4 x hidden.", default=0, minimum=1, maximum=10**8)
    vocab: int = key(
        "Vocabulary of the profiled model (as the script ran it, unpadded).",
        default=0, minimum=1, maximum=10**8, required=True)
    peak_memory: float = key(
        "The profiled run's peak GPU memory, e.g. \"53.4 GiB\" (torch.cuda.max_memory_allocated()); given, memory is "
        "predicted from it (emulator/workload/memory.py, profiled_memory).", default=0.0, unit="bytes", positive=True)


@dataclass(frozen=True)
class WorkloadSpec:
    trace: str | None = key(
        "A trace file to run instead of a model, relative to the scenario.", default=None, kind="path")
    format: str = key("Trace format.", default="emulator", choices=('emulator', 'kineto', 'chakra'))
    mirror: int = key(
        "Replay a one-rank trace as N data-parallel ranks (at most the cluster's GPUs); 0: off.",
        default=0, minimum=0, maximum=MAX_MIRROR)
    comm_groups: str | None = key(
        "Chakra traces: the communicator-group file (ASTRA-sim's JSON of group id to ranks), relative to the "
        "scenario; default: comm_group.json beside the trace.", default=None, kind="path")
    # a one-GPU PyTorch profiler trace of the user's script (workload/profiled.py)
    profile: str | None = key(
        "A PyTorch profiler trace (Kineto JSON, .json or .json.gz, record_shapes=True) of one GPU of your own "
        "training script: predicted at the model, batch and layout of this scenario (emulator/workload/profiled.py); "
        "needs workload.profiled.", default=None, kind="path")
    profiled: ProfiledSpec | None = key(
        "What the profile ran (micro-batch and model sizes), where the trace cannot tell.", default=None)


@dataclass(frozen=True)
class SimulationSpec:
    iterations: int = key("Training iterations to simulate.", default=1, minimum=1, maximum=10**6)
    fold: str = key("Symmetry folding of identical ranks.", default="auto", choices=('auto', 'off'))
    detail: str = key("Granularity of compute ops.", default="layer", choices=('layer', 'op'))
    # a fold in effect over replicas whose transfers have other latencies is kept, bounded, when its
    # iteration times at the least and the greatest of those latencies agree to this (relative);
    # 0: refused, the run made rank by rank (exact)
    fold_tolerance: float = key(
        "Data-parallel replicas folded in effect whose pipeline transfers cross leaves unevenly (other latencies): "
        "kept when the iteration times with each transfer at the least and at the greatest latency of its copies "
        "agree to this relative tolerance (the summary gives both, sim.fold_bounds_s); 0 (the default): refused, "
        "every such replica simulated (exact).", default=0.0, minimum=0, maximum=0.01)


@dataclass(frozen=True)
class LiveSpec:
    """``emulator live`` only: the arrival-skew model of the emulated ranks (``emulator.live.skew``)."""

    skew: str = key(
        "emulator live: off (the emulated ranks arrive at a collective with their mirror) or model (each arrives "
        "(e_n - e_k)*sigma(c) after it, sigma(c) = skew_base + skew_slope*c, c the compute since the last "
        "synchronisation; emulator/live/skew.py).", default="off", choices=('off', 'model'))
    # s: σ of a rank's arrival after no compute (a)
    skew_base: float = key(
        "Spread (standard deviation) of a rank's arrival after no compute, e.g. \"1 ms\" "
        "(benchmarks/live_skew_calibration.py measures it).", default=SKEW_BASE_S, unit="time", maximum=MAX_LATENCY)
    # σ grows by this per second of compute since the last sync (b)
    skew_slope: float = key(
        "How much that spread grows per second of compute since the last synchronisation (a ratio, 0 to 1: a rank "
        "stalled for all of it lags by at most all of it).", default=SKEW_SLOPE, minimum=0, maximum=1)


@dataclass(frozen=True)
class JobSpec:
    """One job of a multi-job scenario (``jobs:``): its own workload and where it runs.

    ``placement`` is a policy (contiguous | spread | random) or "list" for an explicit
    ``node_list``; the loader resolves every policy to ``nodes_assigned`` (node indices,
    in the order the job's ranks fill them), so nothing downstream re-runs a policy.
    """

    name: str = key(
        "Name of the job (unique; names its rows in the summary and its process group in trace.json).", required=True)
    nodes: int = key(
        "Nodes the job runs on; absent with an explicit placement list: the list's length.",
        default=0, minimum=1, maximum=10**6)
    placement: str = key(
        "Where the job runs: contiguous (the first free run of nodes, the default), spread (round robin over the "
        "leaves), random (with seed), or an explicit list of node indices such as [0, 2, 4].",
        default="contiguous", kind="placement")
    node_list: tuple[int, ...] = internal("The nodes of an explicit placement list, in rank order.", default=())
    seed: int = key("Seed of placement: random.", default=0, minimum=0, maximum=2**63 - 1)
    # a moment of the run, not a latency: not held to MAX_LATENCY (a job that starts after another's
    # first iterations, seconds to minutes in, is the question); bounded by the unit parser's 1e7 s
    start: float = key(
        'When the job starts, e.g. "2 ms" or "30 s" (default 0 s: at the start of the run).',
        default=0.0, unit="time", minimum=0)
    model: ModelSpec | None = key("The job's model: a preset, or its sizes.", default=None)
    training: TrainingSpec = key("The job's batch and precision.", factory=TrainingSpec)
    parallel: ParallelSpec = key(
        "The job's parallelism (GPUs = its nodes x gpus_per_node = tp*pp*dp*cp).", factory=ParallelSpec)
    workload: WorkloadSpec = key("A trace to run as this job instead of a model.", factory=WorkloadSpec)
    nodes_assigned: tuple[int, ...] = internal(
        "The job's nodes, in the order its ranks fill them, resolved by the loader (scenario/allocation.py).",
        default=())
    entry: str = internal("The name of the jobs: entry this job is a copy of (count); \"\" for the entry itself.",
                          default="")

    # copies of one job (a mix): NAME-0 .. NAME-(N-1), each placed by the job's policy in turn; at most
    # 10**4, a hundred times the 32-job mixes of issue 29 (each copy is its own Program)
    FILE_KEYS: ClassVar[tuple[FileKey, ...]] = (
        file_key("count", "Copies of this job, named NAME-0 ... NAME-(N-1), each placed by its placement policy in "
                          "turn (default 1: the job itself).", after="start", minimum=1, maximum=10**4, type="int"),
        file_key("stagger", 'With count: copy i starts at start + i x stagger, e.g. "50 ms" (default 0 s).',
                 after="count", unit="time", minimum=0),
    )


@dataclass(frozen=True)
class Scenario:
    name: str = key("Name of the scenario.", required=True)
    cluster: ClusterSpec = key("The hardware.", required=True)
    model: ModelSpec | None = key("The model: a preset, or its sizes.", default=None)
    training: TrainingSpec = key("Batch and precision.", factory=TrainingSpec)
    parallel: ParallelSpec = key("Parallelism (Megatron: GPUs = tp*pp*dp*cp).", factory=ParallelSpec)
    collectives: CollectivesSpec = key("Collective communication.", factory=CollectivesSpec)
    workload: WorkloadSpec = key("A trace to run instead of a model.", factory=WorkloadSpec)
    simulation: SimulationSpec = key("Simulation controls.", factory=SimulationSpec)
    live: LiveSpec = key("emulator live only: how the emulated ranks arrive at collectives.", factory=LiveSpec)
    jobs: tuple[JobSpec, ...] = key(
        "Several jobs sharing the cluster's fabric, each with its own model, training, parallel (or workload.trace) "
        "and placement; replaces the top-level workload.", default=())
    path: str = internal("The file it was loaded from, for messages and relative paths.", default="")
    given: tuple[tuple[str, str], ...] = internal(
        "Keys a profiled workload's profile records, as the file gave them: (key path, FILE:LINE), for the "
        "checks made once the profile is read (workload/profiled.py check_keys, check_gpu).", default=())

    @property
    def gpus(self) -> int:
        node = self.cluster.node
        return self.cluster.nodes * node.gpus_per_node if node else 0
