"""HybridEP: the bytes and the time of one MoE layer's token dispatch and combine.

HybridEP is NVIDIA's expert-parallel all-to-all in DeepEP's ``hybrid-ep`` branch
(deepseek-ai/DeepEP @ 94a9f8f6b146, docs/README_Hybrid-EP.md and docs/Hybrid-EP_Implementation.md),
the ``hybridep`` backend of Megatron-Core's flex dispatcher (Megatron-LM d98e8a64dd
megatron/core/transformer/moe/fused_a2a.py, ``HybridEPDispatch`` and ``HybridEPCombine`` over
``HybridEPBuffer.dispatch_with_permute`` / ``combine_with_unpermute``; token_dispatcher.py picks it
with ``moe_flex_dispatcher_backend == "hybridep"``). Pure functions, no SimPy. In a run, the flex
dispatcher's ``hybridep`` plan (network/dispatch.py) builds its flows from ``miss_probability``,
``row_scales`` and ``chunk_fraction`` on the real links, shared with the other traffic; ``traffic`` and
``time_of`` are the same call's closed form on links of its own (tests/test_hybrid_ep.py checks they agree).

What moves (Hybrid-EP_Implementation.md, section 8, "RDMA communication pattern", and the kernel's
maps in csrc/hybrid_ep/backend/hybrid_ep_backend.cuh):
- The EP group's ranks are split into NVLink domains of ``ranks_per_domain`` ranks
  (``NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN``: "num_of_nodes: Number of NVLink domains (not OS
  nodes/containers)"): 8 on a DGX H100 or B200 (NVSwitch), up to 72 on a GB200/GB300 NVL72 rack.
- Dispatch sends a token over RDMA once per other domain that holds at least one of its top-k
  experts (``attn_to_rdma_map``: one bool per token and remote node), to the GPU of the same local
  rank there (its "peer"); that GPU, and the token's own GPU for its own domain, then write it over
  NVLink once per rank of the domain that holds one of its experts (``sparse_to_dense_map``: one
  slot per token and local rank), not once per expert. A rank's own copy stays in its HBM.
- Combine is the reverse with the same counts: each rank sends its (BF16) expert outputs of a token
  over NVLink to the peer, which pre-reduces them ("Intra-node (multi-node only): Pre-reduces data
  within node before sending to peers") and sends one row over RDMA.
- The two stages are pipelined in chunks of 64 tokens (README_Hybrid-EP.md, "Chunk Size Tuning";
  Megatron fused_a2a.py ``HYBRIDEP_TOKEN_ALIGNMENT = 64``), so the IB transfer overlaps the NVLink
  one ("This overlaps IB communication with intra-node NVLink operations to hide latency").

Expected counts under a uniform router (the README's benchmarks use "Router: Random Uniform"): a
token picks top_k distinct experts of E; a rank holds m = E/ep of them, a domain L·m. A given set of
h experts is hit with probability p(h) = 1 − C(E−h, k)/C(E, k). Per GPU and per direction:

- RDMA rows   = T · (N − 1) · p(L·m)                     (N = ep / L domains)
- NVLink rows = T · (L − 1) · p(m)  from its own tokens, plus, for the rows it received from each
  other domain, (L − 1) · p(m) / p(L·m) forwards each: T · N · (L − 1) · p(m) in all
- received rows (all sources, its own included) = T · ep · p(m): what DeepEP's test counts
  (tests/test_hybrid_ep.py, ``nvl_dispatch = dispatched_hidden.numel() * 2``) for its "algorithm
  bandwidth"

Row sizes: BF16, 2 bytes an element; FP8, 1 byte plus one 32-bit scale per 128 elements
(Hybrid-EP_Implementation.md 8: "one 32-bit scaling factor ... per 128 elements"; the test's
``fp8_factor = (1 + 4 / 128) / 2``). Megatron sends BF16 only ("HybridEP dispatcher does not support
fp8 dispatch now", ``init_hybrid_ep_buffer``); combine is BF16 always ("Combine kernel only supports
BF16"). Dispatch rows also carry the routing probabilities of the receiver's experts (FP32; the RDMA
row those of the peer's whole domain, ``rdma_prob_buffer``, Implementation.md 4).

Time of one call, the stages overlapped: launch + α_NVLink (+ α_RDMA across domains) +
max(t_NVLink, t_RDMA) + one 64-token chunk of the other stage (the pipeline's fill), with t the
stage's bytes over the GPU's calibrated NVLink port or its share of the node's NICs.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import comb
from typing import Sequence

from emulator.scenario.spec import NodeSpec

CHUNK_TOKENS = 64  # tokens per pipeline chunk (README_Hybrid-EP.md; fused_a2a.py HYBRIDEP_TOKEN_ALIGNMENT)
FP8_SCALE_GROUP = 128  # elements per 32-bit FP8 scaling factor (Hybrid-EP_Implementation.md, 8)
PROB_BYTES = 4  # one FP32 routing probability


def miss_probability(experts: int, top_k: int, held: int) -> float:
    """Probability that a token's top_k distinct experts (uniform over ``experts``) include none of
    ``held`` given experts: C(E − h, k) / C(E, k) (the flex dispatcher's plans use it too:
    network/dispatch.py ``use_probability``)."""
    if held <= 0:
        return 1.0
    if top_k > experts - held:
        return 0.0
    return comb(experts - held, top_k) / comb(experts, top_k)


def hit_probability(experts: int, top_k: int, held: int) -> float:
    """Probability that a token's top_k experts include at least one of ``held``: 1 − C(E − h, k) / C(E, k)."""
    return 1.0 - miss_probability(experts, top_k, held)


def row_bytes(hidden: int, dtype: str = "bf16") -> float:
    """Bytes of one token's row on the wire: bf16 2·hidden; fp8 hidden + 4·hidden/128 (its scales)."""
    if dtype == "bf16":
        return 2.0 * hidden
    if dtype == "fp8":
        return hidden + 4.0 * hidden / FP8_SCALE_GROUP
    raise ValueError(f"HybridEP sends bf16 or fp8 rows, got {dtype!r}")


@dataclass(frozen=True)
class EpGroup:
    """An expert-parallel group as HybridEP sees it: ``ep`` ranks in NVLink domains of
    ``ranks_per_domain`` (the last factor of ep), ``experts`` routed experts spread evenly."""

    ep: int
    ranks_per_domain: int
    experts: int
    top_k: int

    def __post_init__(self) -> None:
        if self.ep < 1 or self.ranks_per_domain < 1 or self.ep % self.ranks_per_domain:
            raise ValueError(f"ranks_per_domain {self.ranks_per_domain} must divide ep {self.ep}")
        if self.experts % self.ep:
            raise ValueError(f"ep {self.ep} must divide the experts ({self.experts})")
        if not 1 <= self.top_k <= self.experts:
            raise ValueError(f"top_k must be 1 to {self.experts}, got {self.top_k}")

    @property
    def domains(self) -> int:
        """N: NVLink domains the group spans (HybridEP's num_of_nodes)."""
        return self.ep // self.ranks_per_domain

    @property
    def local_experts(self) -> int:
        """m: experts per rank."""
        return self.experts // self.ep

    def p_rank(self) -> float:
        """Probability that a token goes to a given rank (one of its top-k on that rank)."""
        return hit_probability(self.experts, self.top_k, self.local_experts)

    def p_domain(self) -> float:
        """Probability that a token goes to a given domain."""
        return hit_probability(self.experts, self.top_k, self.local_experts * self.ranks_per_domain)


@dataclass(frozen=True)
class Traffic:
    """Bytes per GPU and per direction of one dispatch or combine (sent and received alike, by symmetry)."""

    nvlink: float  # over the GPU's NVLink port
    rdma: float  # over its NIC
    received: float  # rows landing on the GPU from every source, its own included (DeepEP's test's numerator)


def traffic(tokens: int, hidden: int, group: EpGroup, dtype: str = "bf16", probs: bool = True) -> Traffic:
    """HybridEP's bytes for ``tokens`` tokens per rank (the module docstring's counts); ``probs``: the
    rows carry the routing probabilities (dispatch), not the combine's."""
    L, N, m = group.ranks_per_domain, group.domains, group.local_experts
    p_r, p_d = group.p_rank(), group.p_domain()
    row = row_bytes(hidden, dtype)
    nvl_rows = tokens * N * (L - 1) * p_r
    rdma_rows = tokens * (N - 1) * p_d
    nvl_scale, rdma_scale = row_scales(row, m, L, probs)
    return Traffic(nvl_rows * row * nvl_scale, rdma_rows * row * rdma_scale, tokens * group.ep * p_r * row)


def row_scales(row: float, local_experts: int, ranks_per_domain: int, probs: bool) -> tuple[float, float]:
    """(NVLink, RDMA) bytes on the wire per byte of a token's ``row``: 1, or with ``probs`` the FP32
    routing probabilities the row carries: a rank's m experts' over NVLink, the peer's domain's m·L over
    RDMA (``rdma_prob_buffer``, Hybrid-EP_Implementation.md 4)."""
    if not probs:
        return 1.0, 1.0
    return (1.0 + local_experts * PROB_BYTES / row,
            1.0 + local_experts * ranks_per_domain * PROB_BYTES / row)


def chunk_fraction(tokens: float) -> float:
    """The share of a call one 64-token pipeline chunk carries (all of it under 64 tokens)."""
    return min(1.0, CHUNK_TOKENS / tokens) if tokens > 0 else 1.0


@dataclass(frozen=True)
class Links:
    """What one GPU has for HybridEP: calibrated rates (B/s, each direction) and latencies (s)."""

    nvlink: float  # its NVLink port (line rate × efficiency)
    rdma: float  # its share of the node's NICs (nics × rate × efficiency / gpus_per_node)
    alpha_nvlink: float  # one step over NVLink: two link latencies and the software step
    alpha_rdma: float  # one step over the NICs
    launch: float  # the kernel's launch


def links_of(node: NodeSpec) -> Links:
    """A catalog or inline node's figures as HybridEP's links (the NVLink of its domain, its NICs)."""
    rdma = node.nics * node.nic_bandwidth * node.nic_efficiency / node.gpus_per_node
    return Links(node.intra_bandwidth * node.intra_efficiency, rdma,
                 2 * node.intra_latency + node.step_latency_intra,
                 2 * node.nic_latency + node.step_latency_inter, node.collective_launch)


def time_of(load: Traffic, links: Links, tokens: int) -> float:
    """Seconds of one call: launch, the steps' latencies, the slower stage and one chunk of the other."""
    t_nvl = load.nvlink / links.nvlink if load.nvlink else 0.0
    if not load.rdma:
        return links.launch + links.alpha_nvlink + t_nvl if load.nvlink else 0.0
    t_rdma = load.rdma / links.rdma
    fill = chunk_fraction(tokens) * min(t_nvl, t_rdma)
    return links.launch + links.alpha_nvlink + links.alpha_rdma + max(t_nvl, t_rdma) + fill


def dispatch_time(tokens: int, hidden: int, group: EpGroup, links: Links, dtype: str = "bf16") -> float:
    """One layer's HybridEP dispatch of ``tokens`` tokens per rank (rows of ``dtype``, with probabilities)."""
    return time_of(traffic(tokens, hidden, group, dtype, probs=True), links, tokens)


def combine_time(tokens: int, hidden: int, group: EpGroup, links: Links) -> float:
    """One layer's HybridEP combine: BF16 rows, the same counts as the dispatch, no probabilities."""
    return time_of(traffic(tokens, hidden, group, "bf16", probs=False), links, tokens)


def ranks_per_domain(ep_group: Sequence[int], domain: int) -> int:
    """EP ranks per NVLink domain of ``domain`` GPUs (ranks r and s share one when r // domain ==
    s // domain): the fewest of any domain the group touches, as HybridEP needs equal domains."""
    counts: dict[int, int] = {}
    for r in ep_group:
        counts[r // domain] = counts.get(r // domain, 0) + 1
    return min(counts.values())
