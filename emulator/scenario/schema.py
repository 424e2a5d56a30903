"""The scenario key table, and the JSON Schema derived from it.

``KEYS`` is the one description of what a scenario file may contain: every key,
its type, bounds, choices and help text. The loader (reader.py)
validates against it, the catalog reads its node/GPU entries with it, and
:func:`scenario_schema` turns it into a JSON Schema (draft 2020-12) for editors
and for ``emulator schema``. Add a key here and both follow.

Types: ``str``, ``enum``, ``int``, ``number``, ``ratio`` (0.8, "230/300", "2:1"),
``bool``, the unit kinds of emulator/scenario/units.py (``bytes``, ``time``,
``bandwidth``, ``flops_rate``), ``path`` (a file, relative to the scenario),
``int_list``, ``section`` (a mapping of keys) and ``sections`` (a list of them).
"""
from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from typing import Any, Mapping, Sequence

from emulator.scenario import spec
from emulator.scenario.units import KINDS as UNIT_KINDS
from emulator.scenario.units import RATIO_PATTERN, UNIT_PATTERNS

Names = Mapping[str, Sequence[str]]  # catalog kind ("gpu", "node", "model") → the names it knows

UNIT_TYPES = tuple(UNIT_KINDS)  # bytes, time, bandwidth, flops_rate, flops
MAX_COUNT = 10**9  # default upper bound of an integer key


@dataclass(frozen=True)
class Key:
    """One key of a scenario file."""

    type: str
    doc: str
    required: bool = False
    enum: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    positive: bool = False  # strictly more than 0 (unit types, numbers)
    attr: str | None = None  # dataclass field name, when it differs from the key
    keys: Mapping[str, "Key"] | None = None  # for section / sections
    names: str | None = None  # "gpu" | "node" | "model": a catalog name may stand in
    cls: str | None = None  # dataclass of emulator.scenario this section becomes
    required_unless: tuple[str, str] | None = None  # (sibling key path, value) that waives it


# Physical bounds of link and device figures (the rule book refuses values outside them):
# - no link is slower than 1 Mb/s (125 kB/s): 1/10 of the first Ethernet (IEEE 802.3, 1983: 10 Mb/s);
#   a smaller figure is a typo in the unit (1e-300 Gb/s, "200 b/s" for "200 Gb/s");
# - no latency or fixed cost is longer than 1 s: light in fibre (2e8 m/s) goes once round the
#   Earth (40,075 km) in 0.2 s, and a kernel launch or collective step costs microseconds.
MIN_BANDWIDTH = 125e3  # B/s (1 Mb/s)
MAX_LATENCY = 1.0  # s
# The largest world a mirrored trace may replay: 2**20 ranks, about ten times the largest
# GPU clusters built to date (~1e5 GPUs); the cluster's own GPU count is checked too (checks.py).
MAX_MIRROR = 2**20


def _time(doc: str) -> Key:
    return Key("time", doc, maximum=MAX_LATENCY)


def _bandwidth(doc: str) -> Key:
    return Key("bandwidth", doc, minimum=MIN_BANDWIDTH)


GPU_KEYS: dict[str, Key] = {
    "preset": Key("str", "A catalog GPU to start from; the other keys change its figures.", names="gpu"),
    "name": Key("str", "A label for this GPU type."),
    "peak_flops": Key("flops_rate", 'Dense bf16/fp16 tensor-core peak, e.g. "989.4 TFLOP/s".', positive=True),
    "hbm_bandwidth": _bandwidth('HBM bandwidth, e.g. "3350 GB/s".'),
    "memory": Key("bytes", 'HBM capacity, e.g. "80 GiB".', positive=True, attr="memory_bytes"),
    "launch_overhead": _time('Fixed cost per kernel, e.g. "4 us".'),
    "gemm_efficiency": Key("ratio", "Measured fraction of peak that large GEMMs reach (emulator calibrate "
                                    "--kineto); replaces the model's A100 fit scaled to this GPU.",
                           minimum=0, maximum=1),
    "memory_efficiency": Key("ratio", "Measured fraction of HBM bandwidth that streaming kernels reach.",
                             minimum=0, maximum=1),
    "sm_count": Key("int", "Streaming multiprocessors (GEMM tile-wave quantisation); 0 or absent: as an A100 (108).",
                    minimum=0, maximum=10**5),
    "matmul_fraction": Key("ratio", "Maximum achievable matmul FLOP/s as a fraction of the dense peak (a "
                                    "measurement, e.g. mamf-finder); 0 or absent: as an A100.", minimum=0, maximum=1),
    "peak_flops_fp32": Key("flops_rate", 'FP32 (CUDA-core) peak, e.g. "19.5 TFLOP/s"; absent: '
                                         "training.precision fp32 is refused.", minimum=0),
    "peak_flops_tf32": Key("flops_rate", 'Dense TF32 tensor-core peak, e.g. "156 TFLOP/s"; absent: none.',
                           minimum=0),
    "peak_flops_fp8": Key("flops_rate", 'Dense FP8 tensor-core peak, e.g. "1978.9 TFLOP/s"; absent: none.',
                          minimum=0),
    "peak_flops_fp4": Key("flops_rate", 'Dense FP4 (NVFP4/MXFP4) tensor-core peak, e.g. "10 PFLOP/s"; absent: '
                                        "none.", minimum=0),
    "kernel_table": Key("enum", "Built-in table of measured kernels costed before the roofline "
                                "(devices/kernels.py): h100, h200, b200, or none.",
                          enum=("none", "h100", "h200", "b200")),
    "grouped_gemm_efficiency": Key("ratio", "Throughput of an MoE grouped GEMM over that of the batched GEMM of its "
                                            "groups' shape (a measurement); 0 or absent: 1, as DeepGEMM measured "
                                            "on H800 (emulator/workload/layer.py).", minimum=0, maximum=1),
    "comm_overlap_slowdown": Key("number", "Compute kernels run this many times longer while a communication "
                                           "kernel of the same GPU is resident (NCCL holds SMs and HBM "
                                           "bandwidth); 1 or absent: no slowdown. A measurement: emulator "
                                           "calibrate --kineto.", minimum=1, maximum=10),
}

NODE_KEYS: dict[str, Key] = {
    "preset": Key("str", "A catalog node to start from; the other keys change it.", names="node"),
    "name": Key("str", "A label for this node type."),
    "gpus_per_node": Key("int", "GPUs in one node.", minimum=1, maximum=4096),
    "gpu": Key("section", "A catalog GPU name, or a mapping of GPU figures.", keys=GPU_KEYS,
               names="gpu", cls="GpuSpec"),
    "intra": Key("enum", "How GPUs of a node connect.", enum=("nvswitch", "pcie")),
    "intra_bandwidth": _bandwidth('Line rate of one GPU port, each direction, e.g. "450 GB/s".'),
    "intra_latency": _time('Latency of one intra-node link, e.g. "0.15 us".'),
    "intra_efficiency": Key("ratio", "Achieved / line rate inside a node (nccl-tests), in (0, 1].",
                            positive=True, maximum=1.0),
    "nics": Key("int", "Network cards per node (compute rails).", minimum=0, maximum=1024),
    "nic_bandwidth": _bandwidth('Line rate of one NIC, each direction, e.g. "400 Gb/s".'),
    "nic_latency": _time('Latency of a NIC link, e.g. "0.5 us".'),
    "nic_efficiency": Key("ratio", "Achieved / line rate of a NIC (nccl-tests), in (0, 1].",
                          positive=True, maximum=1.0),
    "step_latency_intra": _time("Software latency per collective step inside a node."),
    "step_latency_inter": _time("Software latency per collective step across nodes."),
    "collective_launch": _time("Fixed cost of one collective call."),
    "nvls_busbw": _bandwidth("Bus bandwidth of an all-reduce by NVLink SHARP (in-switch reduction) "
                             "inside a node, large messages (nccl-tests); used by collectives.algorithm: "
                             "nvls. Absent: the node has no NVLS."),
    "nvlink_domain": Key("int", "GPUs that share one NVLink switch domain, a multiple of gpus_per_node: 72 in a "
                                "GB200/GB300 NVL72 rack of 18 nodes (compute trays) of 4, 64 for 16 trays; "
                                "absent: gpus_per_node. The intra_* keys, step_latency_intra and nvls_busbw "
                                "then hold for the whole domain, and the network treats it as one node.",
                         minimum=0, maximum=4096),
}

FABRIC_KINDS = ("single_switch", "fat_tree", "fat_tree3", "rail", "multi_plane", "dragonfly", "ring", "torus",
                "custom")
ROUTINGS = ("spray", "ecmp_hash")
FABRIC_KEYS: dict[str, Key] = {
    "kind": Key("enum", "Topology between nodes.", enum=FABRIC_KINDS),
    "oversubscription": Key("ratio", 'Leaf down/up bandwidth ratio, 1 or more (2 or "2:1").',
                            minimum=1.0, maximum=1e6),
    "link_bandwidth": _bandwidth("Bandwidth of one fabric link; default: the NIC rate."),
    "latency": _time('Latency of one fabric link, e.g. "1 us".'),
    "graph": Key("path", "Graph file (nodes and links) for kind: custom, relative to the scenario."),
    "leaf_size": Key("int", "Nodes per leaf (fat_tree, fat_tree3, multi_plane), per rail switch (rail) "
                                 "or per router (dragonfly).", minimum=1),
    "torus_dims": Key("int_list", "Torus dimensions, e.g. [4, 4, 2]; default: a ring."),
    "routing": Key("enum", "ECMP over equal-cost paths: spray (each flow split evenly over them, the default) or "
                           "ecmp_hash (each flow takes one, chosen by a seeded hash: collisions happen).",
                   enum=ROUTINGS),
    "seed": Key("int", "Seed of the ECMP hash (routing: ecmp_hash).", minimum=0, maximum=2**63 - 1),
    "spines": Key("int", "Spine switches (fat_tree, rail; per pod for fat_tree3; per plane for multi_plane); "
                         "absent: one per NIC.", minimum=1, maximum=10**5),
    "pod_size": Key("int", "Leaves per pod (fat_tree3).", minimum=1, maximum=10**5),
    "cores": Key("int", "Core switches per spine position (fat_tree3); absent: pod_size.",
                 minimum=1, maximum=10**5),
    "group_size": Key("int", "Routers per group (dragonfly).", minimum=1, maximum=10**5),
    "global_links": Key("int", "Links between each pair of groups (dragonfly), at most group_size.",
                        minimum=1, maximum=10**5),
    "sharp": Key("bool", "In-network reduction in the fabric's switches (InfiniBand SHARP, NCCL CollNet): "
                         "enables collectives.algorithm collnet, and auto may choose it. Not on ring or torus."),
}

# The fabric kinds that read each fabric key (topology.py, BUILDERS): a key given for another kind
# would be ignored, so the loader refuses it. single_switch reads none (its ports are the NICs').
_SPINES = ("fat_tree", "rail", "fat_tree3", "multi_plane")  # leaf/rail switches joined by spines
_LINKS = (*_SPINES, "dragonfly", "ring", "torus")  # kinds with fabric links of their own
FABRIC_KEY_KINDS: dict[str, tuple[str, ...]] = {
    "oversubscription": _SPINES,
    "leaf_size": (*_SPINES, "dragonfly"),
    "link_bandwidth": _LINKS,
    "latency": _LINKS,
    "torus_dims": ("torus",),
    "graph": ("custom",),
}

OVERRIDE_KINDS = ("gpu_slowdown", "link_degrade", "link_fail", "node_fail")
OVERRIDE_KEYS: dict[str, Key] = {
    "kind": Key("enum", "What goes wrong.", required=True, enum=OVERRIDE_KINDS),
    "target": Key("str", '"gpu:5", "node:3", or a link "src->dst" in topology node names.',
                  required=True),
    "factor": Key("number", "Slowdown (>1 is slower) or bandwidth factor (<1 is slower).",
                  positive=True, maximum=1e6),
    "extra_latency": _time('Added latency, e.g. "5 us".'),
    # moments of a run, not latencies: not held to MAX_LATENCY (a fault at minute 3 is a fair question)
    "at": Key("time", 'When a link fault begins, in the middle of the run, e.g. "2.5 s" (link_degrade, '
                      'link_fail); absent: from the start.', minimum=0),
    "until": Key("time", 'When the link recovers, e.g. "4 s" (after at); absent: never.', minimum=0),
}

CLUSTER_KEYS: dict[str, Key] = {
    "nodes": Key("int", "Number of nodes.", required=True, minimum=1, maximum=10**6,
                 required_unless=("fabric.kind", "custom")),
    "node": Key("section", "A catalog node (dgx-a100, dgx-h100, ...) or an inline node.",
                required=True, keys=NODE_KEYS, names="node", cls="NodeSpec",
                required_unless=("fabric.kind", "custom")),
    "fabric": Key("section", "The network between nodes.", keys=FABRIC_KEYS, cls="FabricSpec"),
    "overrides": Key("sections", "Faults and stragglers.", keys=OVERRIDE_KEYS, cls="Override"),
    "catalog": Key("path", "A catalog file of your own (as `emulator calibrate --out` writes) whose "
                           "nodes and GPUs `node:` and `gpu:` may name, besides the built-in ones."),
}

MODEL_KEYS: dict[str, Key] = {
    "preset": Key("str", "A model preset (the model catalog, emulator/scenario/catalog.py); other keys change it.",
                  names="model"),
    "layers": Key("int", "Transformer layers.", minimum=1, maximum=10**6),
    "hidden": Key("int", "Hidden size.", minimum=1, maximum=10**7),
    "heads": Key("int", "Attention heads.", minimum=1, maximum=10**6),
    "ffn_hidden": Key("int", "MLP inner size; 0 or absent: the model's default.", minimum=0,
                      maximum=10**8),
    "seq_len": Key("int", "Sequence length in tokens.", minimum=1, maximum=10**8),
    "vocab": Key("int", "Vocabulary size.", minimum=1, maximum=10**8),
    "kv_heads": Key("int", "Key/value heads (GQA); 0: as heads.", minimum=0, maximum=10**6),
    "experts": Key("int", "MoE experts per layer; 0: dense.", minimum=0, maximum=10**6),
    "top_k": Key("int", "Experts per token (MoE).", minimum=0, maximum=10**6),
    "swiglu": Key("bool", "SwiGLU MLP (three matrices); the same as activation: swiglu."),
    "activation": Key("enum", "MLP activation: gelu (GPT, two matrices), swiglu (Llama, gated, three) or "
                              "squared_relu (Nemotron, two); absent: swiglu if swiglu, else gelu.",
                      enum=("gelu", "swiglu", "squared_relu")),
    "biases": Key("bool", "Linear biases and layernorm shifts; absent: yes for gelu/squared_relu, no for swiglu."),
    "dropout": Key("bool", "Hidden and attention dropout in training; absent: as biases."),
    "norm": Key("enum", "The layers' norms: layernorm (gain and shift, 2h each; GPT, Nemotron) or rmsnorm (gain, h; "
                        "Llama); absent: layernorm if biases, else rmsnorm.", enum=("layernorm", "rmsnorm")),
    "expert_ffn_hidden": Key("int", "MLP width of one routed expert (MoE); 0 or absent: ffn_hidden.", minimum=0,
                             maximum=10**8),
    "shared_experts": Key("int", "Shared experts every token goes through (DeepSeek-MoE, Qwen-MoE); 0: none.",
                          minimum=0, maximum=10**4),
    "shared_expert_ffn_hidden": Key("int", "MLP width of one shared expert; 0 or absent: expert_ffn_hidden.",
                                    minimum=0, maximum=10**8),
    "first_dense_layers": Key("int", "Leading layers with a dense MLP of ffn_hidden instead of experts "
                                     "(DeepSeek: 1 in V2, 3 in V3); 0: every layer is MoE.", minimum=0, maximum=10**6),
    "moe_imbalance": Key("number", "Tokens routed to the busiest expert over the mean, at least 1; stretches the "
                                   "busiest expert-parallel rank's expert GEMMs and all-to-all. Default 1: what "
                                   "Megatron-Core's token drop with capacity factor 1 padded to capacity (NeMo's "
                                   "MegatronTokenDropCallback) makes exact; a lower bound for dropless routing.",
                         minimum=1.0, maximum=1e6),
    "moe_expert_load": Key("number_list", "A measured routing distribution: tokens (or shares) of each expert, "
                                          "one number per expert in expert order; the busiest expert-parallel "
                                          "rank's load is read from it (Megatron's contiguous local experts). "
                                          "Instead of moe_imbalance."),
    "q_lora_rank": Key("int", "Multi-latent attention: rank of the query down-projection; 0: a full query "
                              "projection.", minimum=0, maximum=10**7),
    "kv_lora_rank": Key("int", "Multi-latent attention (DeepSeek-V2/V3): rank of the compressed keys and values; "
                               "0: standard attention.", minimum=0, maximum=10**7),
    "qk_nope_head_dim": Key("int", "Multi-latent attention: per-head query/key dims without rotary embedding; "
                                   "0: hidden/heads.", minimum=0, maximum=10**5),
    "qk_rope_head_dim": Key("int", "Multi-latent attention: per-head query/key dims of the decoupled rotary "
                                   "embedding.", minimum=0, maximum=10**5),
    "v_head_dim": Key("int", "Multi-latent attention: per-head value dims; 0: hidden/heads.", minimum=0,
                      maximum=10**5),
    "head_dim": Key("int", "Per-head query, key and value dims, for any attention kind (Qwen3: 128 with hidden "
                           "4096 and 64 heads; Megatron's kv_channels); 0 or absent: hidden/heads. With "
                           "multi-latent attention, the default of qk_nope_head_dim and v_head_dim.", minimum=0,
                    maximum=10**5),
    "sliding_window": Key("int", "Sliding-window attention: each query attends its last N keys (itself included; "
                                 "GPT-OSS: 128, HF's sliding_window); 0 or absent: full attention. Costed in fused "
                                 "attention (training.attention: flash); the unfused path computes the full square.",
                          minimum=0, maximum=10**7),
    "window_attn_skip_freq": Key("int", "With sliding_window: every N-th layer attends fully, the others through the "
                                        "window ((N-1):1, Megatron's window_attn_skip_freq; GPT-OSS: 2, alternating); "
                                        "0 or absent: every layer windowed.", minimum=0, maximum=10**5),
    "softmax_type": Key("enum", "Attention softmax (Megatron's softmax_type): vanilla; off-by-one (a fixed extra "
                                "logit); learnable (attention sinks: one learned logit per head, GPT-OSS).",
                        enum=("vanilla", "off-by-one", "learnable")),
    "tied_embeddings": Key("bool", "Input and output embeddings shared."),
    "causal": Key("bool", "A causal attention mask (decoders, the default); false: bidirectional (BERT)."),
}

TRAINING_KEYS: dict[str, Key] = {
    "global_batch": Key("int", "Sequences per iteration.", minimum=1),
    "micro_batch": Key("int", "Sequences per micro-batch.", minimum=1),
    "precision": Key("enum", "Compute precision: bf16/fp16 at the tensor-core peak; fp32 at the FP32 rate "
                              "(PyTorch's default, no TF32); tf32 (fp32 storage, TF32 matmuls) at the TF32 "
                              "rate; fp8 at the FP8 rate (refused on a GPU without one).",
                      enum=("bf16", "fp16", "fp32", "tf32", "fp8")),
    "recompute": Key("enum", "Activation recomputation.", enum=("none", "selective", "full")),
    "attention": Key("enum", "Attention kernels: unfused (Megatron's, as in layers.csv), flash (cuDNN's fused "
                              "flash attention, as Transformer Engine and PyTorch SDPA run it on Hopper) or fa2 "
                              "(FlashAttention-2's kernels; docs/guides/kernels.md).",
                     enum=("unfused", "flash", "fa2")),
    "grad_reduce": Key("enum", "Type of the data-parallel gradient reduction, and of the gradients held "
                               "(memory): auto (Megatron: fp32 when training in bf16 or fp8, else the training "
                               "type), fp32, bf16 or fp16.",
                       enum=("auto", "fp32", "bf16", "fp16")),
    "fp8_params": Key("bool", "With precision fp8: the layers' GEMM weights are kept in fp8 (1 B; NeMo's "
                              "fp8_params, Megatron's --fp8-param-gather); false: bf16 weights plus "
                              "Transformer Engine's cached fp8 copy and its transpose (memory only)."),
    "optimizer": Key("enum", "The distributed optimizer (parallel.zero 1 or 2), memory only: megatron "
                             "(Megatron-Core's DistributedOptimizer: fp32 main weight, momentum and variance, "
                             "12 B a parameter over the data-parallel ranks) or apex (Apex DistributedFusedAdam "
                             "as NeMo sets it up: with bf16 weights the fp32 master is kept as its 16-bit "
                             "remainder, 10 B).", enum=("megatron", "apex")),
}

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")
AXES = ("pp", "dp", "cp", "tp")  # the parallel axes a rank placement orders
PARALLEL_KEYS: dict[str, Key] = {
    "tp": Key("int", "Tensor-parallel size.", minimum=1, maximum=10**6),
    "pp": Key("int", "Pipeline-parallel size.", minimum=1, maximum=10**6),
    "dp": Key("int", "Data-parallel size; absent: GPUs / (tp*pp*cp).", minimum=1, maximum=10**7),
    "cp": Key("int", "Context-parallel size.", minimum=1, maximum=10**6),
    "ep": Key("int", "Expert-parallel size; etp*ep divides tp*dp*cp (ep divides dp*cp when etp is tp).", minimum=1,
              maximum=10**6),
    "etp": Key("int", "Expert tensor-parallel size (Megatron-Core's expert_tensor_parallel_size); absent: tp. "
                      "Other than tp, the expert layers get their own grid etp x ep x expert-dp x pp = world "
                      "(MoE parallel folding: with etp 1 the EP groups take in the attention's TP ranks).",
               minimum=1, maximum=10**6),
    "sequence_parallel": Key("bool", "Megatron sequence parallelism."),
    "zero": Key("int", "ZeRO stage, 0 to 3.", minimum=0, maximum=3),
    "schedule": Key("enum", "Pipeline schedule.", enum=SCHEDULES),
    "virtual_stages": Key("int", "Model chunks per stage (interleaved-1f1b).", minimum=1,
                          maximum=10**4),
    "first_chunk_layers": Key("int", "Layers of the first model chunk (with virtual_stages 1: the first "
                                     "pipeline stage; 0: the embedding alone); the other chunks split the "
                                     "rest evenly. Absent: an even split.", minimum=0, maximum=10**6),
    "last_chunk_layers": Key("int", "Layers of the last model chunk (0: the LM head alone); see "
                                    "first_chunk_layers.", minimum=0, maximum=10**6),
    "overlap_grad_reduce": Key("bool", "Overlap gradient reduction with backward."),
    "overlap_param_gather": Key("bool", "ZeRO-1/2: the distributed optimizer's parameter all-gather overlaps the "
                                        "next iteration's forward, bucket by bucket; absent: as overlap_grad_reduce."),
    "grad_bucket": Key("bytes", 'Gradient bucket size, e.g. "25 MB".', positive=True),
    "order": Key("axis_order", "Rank placement, slowest to fastest axis, e.g. [pp, dp, cp, tp] "
                               "(Megatron's, the default: TP fastest inside a node)."),
}

COLLECTIVES_KEYS: dict[str, Key] = {
    "algorithm": Key("enum", "Collective algorithm: ring (the default; all-to-all direct, broadcast a chain "
                             "per ring channel), tree (NCCL's double binary tree), collnet (in-network "
                             "reduction, needs cluster.fabric.sharp), hierarchical, direct, nvls, or auto "
                             "(NCCL 2.30's tuning model chooses per call by operation, size and layout).",
                     enum=("auto", "ring", "tree", "collnet", "hierarchical", "direct", "nvls")),
}

PROFILED_KEYS: dict[str, Key] = {
    "micro_batch": Key("int", "Samples per step in the profiled run.", minimum=1, maximum=10**6, required=True),
    "seq_len": Key("int", "Tokens per sample in the profiled run.", minimum=1, maximum=10**8, required=True),
    "layers": Key("int", "Repeated blocks (transformer layers) of the profiled model.", minimum=1, maximum=10**5,
                  required=True),
    "hidden": Key("int", "Hidden size of the profiled model.", minimum=1, maximum=10**7, required=True),
    "heads": Key("int", "Attention heads of the profiled model.", minimum=1, maximum=10**6, required=True),
    "kv_heads": Key("int", "Key/value heads (grouped-query attention); absent: as heads.", minimum=1,
                    maximum=10**6),
    "ffn_hidden": Key("int", "MLP inner size; absent: 4 x hidden.", minimum=1, maximum=10**8),
    "vocab": Key("int", "Vocabulary of the profiled model (as the script ran it, unpadded).", minimum=1,
                 maximum=10**8, required=True),
    "peak_memory": Key("bytes", 'The profiled run\'s peak GPU memory, e.g. "53.4 GiB" '
                                "(torch.cuda.max_memory_allocated()); given, memory is predicted from it "
                                "(emulator/memory.py, profiled_memory).", positive=True),
}

WORKLOAD_KEYS: dict[str, Key] = {
    "trace": Key("path", "A trace file to run instead of a model, relative to the scenario."),
    "format": Key("enum", "Trace format.", enum=("emulator", "kineto", "chakra")),
    "mirror": Key("int", "Replay a one-rank trace as N data-parallel ranks (at most the cluster's GPUs); "
                         "0: off.", minimum=0, maximum=MAX_MIRROR),
    "comm_groups": Key("path", "Chakra traces: the communicator-group file (ASTRA-sim's JSON of group id to "
                               "ranks), relative to the scenario; default: comm_group.json beside the trace."),
    "profile": Key("path", "A PyTorch profiler trace (Kineto JSON, .json or .json.gz, record_shapes=True) of one "
                           "GPU of your own training script: predicted at the model, batch and layout of this "
                           "scenario (emulator/workload/profiled.py); needs workload.profiled."),
    "profiled": Key("section", "What the profile ran (micro-batch and model sizes), where the trace cannot tell.",
                    keys=PROFILED_KEYS, cls="ProfiledSpec"),
}

SIMULATION_KEYS: dict[str, Key] = {
    "iterations": Key("int", "Training iterations to simulate.", minimum=1, maximum=10**6),
    "fold": Key("enum", "Symmetry folding of identical ranks.", enum=("auto", "off")),
    "detail": Key("enum", "Granularity of compute ops.", enum=("layer", "op")),
    "fold_tolerance": Key("number", "Data-parallel replicas folded in effect whose pipeline transfers cross leaves "
                                    "unevenly (other latencies): kept when the iteration times with each transfer at "
                                    "the least and at the greatest latency of its copies agree to this relative "
                                    "tolerance (the summary gives both, sim.fold_bounds_s); 0 (the default): refused, "
                                    "every such replica simulated (exact).", minimum=0, maximum=0.01),
}

LIVE_KEYS: dict[str, Key] = {
    "skew": Key("enum", "emulator live: off (the emulated ranks arrive at a collective with their mirror) or model "
                        "(each arrives (e_n - e_k)*sigma(c) after it, sigma(c) = skew_base + skew_slope*c, c the "
                        "compute since the last synchronisation; emulator/live/skew.py).", enum=("off", "model")),
    "skew_base": _time('Spread (standard deviation) of a rank\'s arrival after no compute, e.g. "1 ms" '
                       "(benchmarks/live_skew_calibration.py measures it)."),
    "skew_slope": Key("number", "How much that spread grows per second of compute since the last "
                                "synchronisation (a ratio, 0 to 1: a rank stalled for all of it lags by at "
                                "most all of it).", minimum=0, maximum=1),
}

KEYS: dict[str, Key] = {
    "name": Key("str", "Name of the scenario.", required=True),
    "cluster": Key("section", "The hardware.", required=True, keys=CLUSTER_KEYS, cls="ClusterSpec"),
    "model": Key("section", "The model: a preset, or its sizes.", keys=MODEL_KEYS, cls="ModelSpec"),
    "training": Key("section", "Batch and precision.", keys=TRAINING_KEYS, cls="TrainingSpec"),
    "parallel": Key("section", "Parallelism (Megatron: GPUs = tp*pp*dp*cp).", keys=PARALLEL_KEYS,
                    cls="ParallelSpec"),
    "collectives": Key("section", "Collective communication.", keys=COLLECTIVES_KEYS,
                       cls="CollectivesSpec"),
    "workload": Key("section", "A trace to run instead of a model.", keys=WORKLOAD_KEYS,
                    cls="WorkloadSpec"),
    "simulation": Key("section", "Simulation controls.", keys=SIMULATION_KEYS, cls="SimulationSpec"),
    "live": Key("section", "emulator live only: how the emulated ranks arrive at collectives.", keys=LIVE_KEYS,
                cls="LiveSpec"),
}

PLACEMENTS = ("contiguous", "spread", "random")  # job placement policies (emulator/scenario/allocation.py)
JOB_KEYS: dict[str, Key] = {
    "name": Key("str", "Name of the job (unique; names its rows in the summary and its process group in trace.json).",
                required=True),
    "nodes": Key("int", "Nodes the job runs on; absent with an explicit placement list: the list's length.",
                 minimum=1, maximum=10**6),
    "placement": Key("placement", "Where the job runs: contiguous (the first free run of nodes, the default), "
                                  "spread (round robin over the leaves), random (with seed), or an explicit "
                                  "list of node indices such as [0, 2, 4]."),
    "seed": Key("int", "Seed of placement: random.", minimum=0, maximum=2**63 - 1),
    # a moment of the run, not a latency: not held to MAX_LATENCY (a job that starts after another's
    # first iterations, seconds to minutes in, is the question); bounded by the unit parser's 1e7 s
    "start": Key("time", 'When the job starts, e.g. "2 ms" or "30 s" (default 0 s: at the start of the run).',
                 minimum=0),
    # copies of one job (a mix): NAME-0 .. NAME-(N-1), each placed by the job's policy in turn; at most
    # 10**4, a hundred times the 32-job mixes of issue 29 (each copy is its own Program)
    "count": Key("int", "Copies of this job, named NAME-0 ... NAME-(N-1), each placed by its placement policy in "
                        "turn (default 1: the job itself).", minimum=1, maximum=10**4),
    "stagger": Key("time", 'With count: copy i starts at start + i x stagger, e.g. "50 ms" (default 0 s).',
                   minimum=0),
    "model": Key("section", "The job's model: a preset, or its sizes.", keys=MODEL_KEYS, cls="ModelSpec"),
    "training": Key("section", "The job's batch and precision.", keys=TRAINING_KEYS, cls="TrainingSpec"),
    "parallel": Key("section", "The job's parallelism (GPUs = its nodes x gpus_per_node = tp*pp*dp*cp).",
                    keys=PARALLEL_KEYS, cls="ParallelSpec"),
    "workload": Key("section", "A trace to run as this job instead of a model.", keys=WORKLOAD_KEYS,
                    cls="WorkloadSpec"),
}

KEYS["jobs"] = Key("sections", "Several jobs sharing the cluster's fabric, each with its own model, training, "
                               "parallel (or workload.trace) and placement; replaces the top-level workload.",
                   keys=JOB_KEYS, cls="JobSpec")

SECTION_TYPES = ("section", "sections")


def all_key_paths(keys: Mapping[str, Key] = KEYS, prefix: str = "") -> list[str]:
    """Every dotted key path of the table (sections included), e.g. ``parallel.tp``."""
    out: list[str] = []
    for name, key in keys.items():
        path = f"{prefix}{name}"
        out.append(path)
        if key.keys is not None:
            out.extend(all_key_paths(key.keys, path + "."))
    return out


# ---------------------------------------------------------------- JSON Schema


def _default(key: Key, name: str, cls: type | None) -> Any:
    """The dataclass default of a key, in the file's spelling (unit kinds: an SI string)."""
    if cls is None:
        return MISSING
    for f in fields(cls):
        if f.name == (key.attr or name) and f.default is not MISSING:
            value = f.default
            if value is None:
                return MISSING
            if key.type in UNIT_TYPES:
                return f"{value:g} {UNIT_KINDS[key.type].si_unit}"
            if key.type in ("int_list", "axis_order", "number_list"):
                return list(value)
            return value
    return MISSING


def _scalar_schema(key: Key, names: Names) -> dict[str, Any]:
    t = key.type
    if t in UNIT_TYPES:
        return {"type": "string", "pattern": UNIT_PATTERNS[t]}
    if t == "enum":
        return {"type": "string", "enum": list(key.enum)}
    if t == "str":
        choices = list(names.get(key.names, ())) if key.names else []
        return {"type": "string", "enum": choices} if choices else {"type": "string", "minLength": 1}
    if t == "path":
        return {"type": "string", "minLength": 1}
    if t == "bool":
        return {"type": "boolean"}
    if t == "int_list":
        return {"type": "array", "items": {"type": "integer", "minimum": 1}, "maxItems": 6}
    if t == "number_list":
        return {"type": "array", "items": {"type": "number", "minimum": 0}, "minItems": 1}
    if t == "placement":
        return {"oneOf": [{"type": "string", "enum": list(PLACEMENTS)},
                          {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1,
                           "uniqueItems": True}]}
    if t == "axis_order":
        return {"type": "array", "items": {"type": "string", "enum": list(AXES)}, "minItems": 4, "maxItems": 4,
                "uniqueItems": True}
    out: dict[str, Any] = {"type": "integer" if t == "int" else "number"}
    if t == "ratio":
        out = {"oneOf": [{"type": "number"}, {"type": "string", "pattern": RATIO_PATTERN}]}
        number = out["oneOf"][0]
    else:
        number = out
    if key.positive:
        number["exclusiveMinimum"] = 0
    if key.minimum is not None:
        number["minimum"] = key.minimum
    number["maximum"] = key.maximum if key.maximum is not None else MAX_COUNT
    return out


def _object_schema(keys: Mapping[str, Key], cls: type | None, names: Names) -> dict[str, Any]:
    props = {name: _key_schema(name, key, cls, names) for name, key in keys.items()}
    required = [n for n, k in keys.items() if k.required and k.required_unless is None]
    out: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        out["required"] = required
    conditional = [n for n, k in keys.items() if k.required and k.required_unless is not None]
    for name in conditional:
        path, value = keys[name].required_unless  # type: ignore[misc]
        head, *rest = path.split(".")
        inner: dict[str, Any] = {"const": value}
        for part in reversed(rest):
            inner = {"properties": {part: inner}, "required": [part]}
        cond = {"properties": {head: inner}, "required": [head]}
        out.setdefault("allOf", []).append({"if": cond, "else": {"required": [name]}})
    return out


def _key_schema(name: str, key: Key, parent: type | None, names: Names) -> dict[str, Any]:
    if key.type in SECTION_TYPES:
        cls = getattr(spec, key.cls) if key.cls else None
        obj = _object_schema(key.keys or {}, cls, names)
        out = {"type": "array", "items": obj} if key.type == "sections" else obj
        if key.names:
            choices = list(names.get(key.names, ()))
            text = {"type": "string", "enum": choices} if choices else {"type": "string"}
            out = {"oneOf": [text, out]}
    else:
        out = _scalar_schema(key, names)
        default = _default(key, name, parent)
        if default is not MISSING:
            out["default"] = default
    out["description"] = key.doc
    return out


def scenario_schema(names: Names | None = None) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a scenario file, derived from ``KEYS``. ``names`` holds the
    catalog names a key may take ({"gpu": [...], "node": [...], "model": [...]}), given at run time by
    the caller (the CLI reads them from the catalogs); without them those keys are any string."""
    body = _object_schema(KEYS, spec.Scenario, names or {})
    body["patternProperties"] = {"^x-": {"description": "Ignored: a place for YAML &anchors."}}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://example.invalid/emulator/scenario.schema.json",
        "title": "Emulator scenario",
        "description": "A training job on a cluster. Quantities carry units as strings "
                       '("200 Gb/s", "2 us", "80 GiB"); a bare number where a unit is needed is an error.',
        **body,
    }
