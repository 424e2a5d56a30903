"""MoE token dispatch as flows: NCCL all-to-all-v with per-pair sizes, and the flex dispatcher's backends.

The collective names are ``emulator.program.dispatch_op``'s ("<kind>:<in|out>:<params>"); the workload
(workload/dispatch.py) makes them, :func:`dispatch` turns one into a raw plan for ``CollectiveModel``. Each
plan is one phase with **one flow per rank of the group**, whose legs (hops, scaled by the bytes each leg
carries per byte of S) move at one common rate, the pace of that rank's most loaded link: the collective
ends when its slowest rank does, so a rank's legs finishing early would not end it sooner. Every leg is
routed on the links it really uses, where it shares them with TP, PP and DP traffic.

- ``all_to_all_v`` (Megatron-Core's alltoall dispatcher, token_dispatcher.py ``MoEAlltoAllTokenDispatcher``:
  ``all_to_all(ep_group, tokens, output_splits, input_splits)``, NCCL send/recv pairs). S is one rank's
  routed copies. Rank b receives the share q_b of every rank's copies: the busiest receiver (the group's
  first member) load/n, every other (1 − load/n)/(n − 1), so the sizes add up to the routed copies and only
  the busiest receiver gets the large volume. ``in`` (dispatch): rank a sends S·q_b to each b; ``out``
  (combine): rank b sends S·q_b back to each a. Its latency adds NCCL's cost per peer beyond the first,
  as the plain all-to-all's (collectives.ALLTOALL_PEER_S).
- ``deepep`` (DeepEP's normal kernels, V1 ``Buffer.internode_dispatch``/``internode_combine`` as
  Megatron-Core drives them: fused_a2a.py, token_dispatcher.py ``MoEFlexTokenDispatcher``; DeepEP
  csrc/kernels/internode.cu). S is one rank's tokens, each sent once. A token crosses the network once per
  destination node, over RDMA to the GPU of that node with the sender's local index, which forwards it over
  NVLink to each GPU of its node that holds one of the token's experts; a destination in the sender's own
  node is reached over NVLink directly. The shares are P(the token uses the node) and P(it uses the GPU),
  from the routing (:func:`use_probability`, group-limited as DeepSeek-V3 routes) and the placement of the
  experts (EP rank i holds experts i·E/n …). ``out`` (combine) runs the same legs backwards. DeepEP's
  published bandwidths (docs/legacy.md, "Normal kernels with NVLink and RDMA forwarding", measured on H800
  with ~160 GB/s NVLink and a ~50 GB/s CX7 NIC) enter as fractions of those link rates
  (``DEEPEP_NVLINK``, ``DEEPEP_RDMA``): each leg's bytes are scaled by 1/fraction on the emulator's links.

- ``hybridep`` (NVIDIA's HybridEP, DeepEP branch ``hybrid-ep`` @ 94a9f8f6b146: deep_ep/hybrid_ep_buffer.py
  ``HybridEPBuffer.dispatch_with_permute``/``combine_with_unpermute``, csrc/hybrid_ep/; Megatron-Core's flex
  backend ``hybridep``: fused_a2a.py ``HybridEPDispatch``/``HybridEPCombine``, token_dispatcher.py
  ``_HybridEPManager``). The legs of ``deepep`` grouped by **NVLink domain**, which is the network's node
  (network/domain.py: 72 GPUs over the 18 trays of an NVL72 rack, one 8-GPU node elsewhere): RDMA once per
  other domain holding one of the token's experts, to the peer of the same local rank, NVLink once per rank
  of a domain holding its experts; combine the reverse, pre-reduced at the peer. Counts, row sizes and the
  64-token pipeline are network/hybrid_ep.py's (``row_scales``, ``chunk_fraction``): the forward dispatch
  and its backward carry the FP32 probabilities (``probs``), over the links at their calibrated rates (the
  node's intra_efficiency and nic_efficiency, as hybrid_ep.py ``links_of``) with no DeepEP fraction. On one
  NVLink domain (an NVL72 rack, EP ≤ 72) no byte crosses a NIC.

``BACKENDS`` maps a flex backend to its plan: the plug-in point for another backend.
"""
from __future__ import annotations

from functools import lru_cache
from itertools import combinations
from typing import TYPE_CHECKING, Callable

from emulator.network.hybrid_ep import chunk_fraction, miss_probability, row_scales
from emulator.program import parse_dispatch_op

if TYPE_CHECKING:
    from emulator.network.raw_plan import Hop, PlanMaker, RawFlow, RawPlan

# DeepEP V1 normal kernels on H800 (deepseek-ai/DeepEP docs/legacy.md, "Performance"; ../shared/calibration/
# blackwell/sources.md S18): intranode EP 8, NVLink bottleneck 153 GB/s dispatch and 158 GB/s combine of
# "~160 GB/s NVLink maximum bandwidth".
DEEPEP_NVLINK = {"in": 153.0 / 160.0, "out": 158.0 / 160.0}
# Internode RDMA bottleneck bandwidth of the "~50 GB/s" CX7 NIC, by EP size (8 GPUs a node): EP 16 43/43,
# EP 32 58/57, EP 64 51/50 GB/s (dispatch/combine). Above 50 the figure is "logical" (it counts bytes that
# need not cross the NIC), so a fraction is capped at 1: the NIC's own rate.
DEEPEP_RDMA = {2: {"in": 43.0 / 50.0, "out": 43.0 / 50.0}, 4: {"in": 1.0, "out": 1.0},
               8: {"in": 1.0, "out": 1.0}}


def rdma_fraction(nodes: int, direction: str) -> float:
    """DeepEP's RDMA fraction for a group over ``nodes`` nodes: the row of the largest node count ≤ it."""
    key = max([k for k in DEEPEP_RDMA if k <= max(nodes, 2)])
    return DEEPEP_RDMA[key][direction]


@lru_cache(maxsize=4096)
def _no_use(experts: int, top_k: int, groups: int, group_topk: int, members: tuple[int, ...]) -> float:
    """P(a token uses none of the experts ``members``) with balanced (random) scores: a uniform
    ``group_topk``-subset S of the ``groups`` contiguous expert groups (1, 1: no limit), then top_k experts
    uniform among the M = g·E/G open ones: the mean over S of C(M − a_S, k)/C(M, k), a_S the members in S."""
    size = experts // groups
    per_group = [0] * groups
    for e in members:
        per_group[e // size] += 1
    m = group_topk * size
    total, subsets = 0.0, 0
    for chosen in combinations(range(groups), group_topk):
        a = sum(per_group[i] for i in chosen)
        total += miss_probability(m, top_k, a)
        subsets += 1
    return total / subsets


def use_probability(experts: int, top_k: int, groups: int, group_topk: int, members: tuple[int, ...]) -> float:
    """P(a token has at least one of its top_k experts among ``members``)."""
    return 1.0 - _no_use(experts, top_k, max(1, groups), max(1, group_topk), members)


def _local_experts(i: int, local: int) -> tuple[int, ...]:
    """EP rank i's experts (Megatron-Core moe_layer.py: ``local_expert_indices_offset``)."""
    return tuple(range(i * local, (i + 1) * local))


def _flow(model: "PlanMaker", hops: list["Hop"], two_hop: list[tuple[int, int, int]],
          extra: float = 0.0) -> "RawFlow":
    """One rank's flow over ``hops``; its latency: launch + the slowest leg's α (a forwarded leg's two)
    + ``extra``."""
    alphas = [model.alpha(a, b) for a, b, _s in hops]
    alphas += [model.alpha(a, r) + model.alpha(r, b) for a, r, b in two_hop]
    return hops, 1.0, model.steps.launch + max(alphas, default=0.0) + extra, []


def all_to_all_v(model: "PlanMaker", direction: str, params: dict[str, float],
                 group: tuple[int, ...]) -> "RawPlan":
    """NCCL all-to-all-v: one flow per rank over its legs to (``in``) or from (``out``) every other rank."""
    n = len(group)
    load = params.get("load", 1.0)
    busiest = load / n
    rest = (1.0 - busiest) / (n - 1)
    share = {b: (busiest if i == 0 else rest) for i, b in enumerate(group)}
    peers = max(0, n - 2) * model.steps.peer  # NCCL's send/recv pairs (collectives.ALLTOALL_PEER_S)
    flows = []
    for a in group:
        if direction == "in":
            hops = [(a, b, share[b]) for b in group if b != a]
        else:  # rank a returns to each b what b sent it
            hops = [(a, b, share[a]) for b in group if b != a]
        flows.append(_flow(model, hops, [], peers))
    return [flows]


def _routing(model: "PlanMaker", params: dict[str, float], group: tuple[int, ...]) -> tuple[
        list[list[int]], dict[int, int], dict[int, float], list[float], int]:
    """The group's nodes (the network's: NVLink domains on an NVL72 rack, network/domain.py), each rank's
    node, P(a token uses the GPU) (the busiest receiver's scaled by ``load``), P(it uses the node) (the
    busiest receiver's node's by the same tokens: :func:`busiest_node_use`), and the experts per rank."""
    n = len(group)
    experts, top_k = int(params["experts"]), int(params["top_k"])
    groups, group_topk = int(params.get("groups", 1)), int(params.get("group_topk", 1))
    load = params.get("load", 1.0)
    local = max(1, experts // n)
    index = {r: i for i, r in enumerate(group)}
    nodes = model.by_node(group) if model.node_of(group[0]) >= 0 else [list(group)]
    node_of = {r: k for k, members in enumerate(nodes) for r in members}
    p_gpu = {r: use_probability(experts, top_k, groups, group_topk, _local_experts(index[r], local)) for r in group}
    balanced = p_gpu[group[0]]
    p_gpu[group[0]] = min(1.0, balanced * load)  # the busiest receiver (all_to_all_v's convention)
    p_node = [use_probability(experts, top_k, groups, group_topk,
                              tuple(e for r in members for e in _local_experts(index[r], local))) for members in nodes]
    k = node_of[group[0]]
    p_node[k] = busiest_node_use(p_node[k], balanced, p_gpu[group[0]])
    return nodes, node_of, p_gpu, p_node, local


def busiest_node_use(node: float, balanced: float, loaded: float) -> float:
    """P(a token uses the busiest receiver's node) once P(it uses that GPU) grows from ``balanced`` to
    ``loaded``: 1 − (1 − ``node``)·(1 − loaded)/(1 − balanced), the tokens that miss the node missing the GPU
    as often as before relative to its new share (the extra tokens of the busiest GPU taken as independent of
    the node's other experts). The RDMA legs into that node carry it; 1 when the GPU takes every token."""
    if balanced >= 1.0:
        return node
    return 1.0 - (1.0 - node) * (1.0 - loaded) / (1.0 - balanced)


def _relayed_legs(s: int, nodes: list[list[int]], node_of: dict[int, int], p_gpu: dict[int, float],
                  p_node: list[float]) -> tuple[list[tuple[int, int, float, bool]], list[tuple[int, int, int]]]:
    """Rank ``s``'s dispatch legs per byte of its tokens, each marked True when it crosses RDMA, and its
    forwarded paths: NVLink to each GPU of its own node with P(use GPU); RDMA once per other node with
    P(use node) to the GPU of its local index there, which forwards to each other GPU of that node with
    P(use GPU)."""
    home = node_of[s]
    j = nodes[home].index(s)
    legs = [(s, g, p_gpu[g], False) for g in nodes[home] if g != s]
    two_hop: list[tuple[int, int, int]] = []
    for k, members in enumerate(nodes):
        if k == home:
            continue
        relay = members[j % len(members)]
        legs.append((s, relay, p_node[k], True))
        for g in members:
            if g != relay:
                legs.append((relay, g, p_gpu[g], False))
                two_hop.append((s, relay, g))
    return legs, two_hop


def _reverse(legs: list["Hop"]) -> list["Hop"]:
    return [(b, a, x) for a, b, x in legs]


def deepep(model: "PlanMaker", direction: str, params: dict[str, float], group: tuple[int, ...]) -> "RawPlan":
    """DeepEP's normal dispatch (``in``) or combine (``out``): per token owner, RDMA once per remote node to
    the relay of the owner's local index, NVLink forwarding inside each node (module docstring)."""
    nodes, node_of, p_gpu, p_node, _local = _routing(model, params, group)
    nvl_f = DEEPEP_NVLINK[direction]
    rdma_f = rdma_fraction(len(nodes), direction)
    flows = []
    for s in group:
        marked, two_hop = _relayed_legs(s, nodes, node_of, p_gpu, p_node)
        legs = [(a, b, x / (rdma_f if rdma else nvl_f)) for a, b, x, rdma in marked]
        if direction == "out":
            legs = _reverse(legs)
            two_hop = [(b, r, a) for a, r, b in two_hop]
        flows.append(_flow(model, legs, two_hop))
    return [flows]


def hybridep(model: "PlanMaker", direction: str, params: dict[str, float], group: tuple[int, ...]) -> "RawPlan":
    """HybridEP's dispatch (``in``) or combine (``out``), grouped by NVLink domain (module docstring): the
    legs of :func:`deepep` at the links' own calibrated rates, rows grown by the routing probabilities they
    carry (``probs``), and the two stages pipelined in 64-token chunks of ``tokens``: a first chunk of the
    first stage alone, the rest of both stages together, a last chunk of the second stage alone, so the
    call takes the slower stage plus one chunk of the faster (network/hybrid_ep.py ``time_of``)."""
    nodes, node_of, p_gpu, p_node, local = _routing(model, params, group)
    probs = bool(params.get("probs", 0.0))
    row = params.get("row", 0.0)
    f = chunk_fraction(params.get("tokens", 0.0))
    first: list["RawFlow"] = []
    both: list["RawFlow"] = []
    last: list["RawFlow"] = []
    for s in group:
        marked, two_hop = _relayed_legs(s, nodes, node_of, p_gpu, p_node)
        nvl: list["Hop"] = []
        rdma: list["Hop"] = []
        for a, b, x, cross in marked:  # each leg at its stage's row size (probabilities of the receiver's domain)
            scale = row_scales(row, local, len(nodes[node_of[b]]), probs)[1 if cross else 0]
            (rdma if cross else nvl).append((a, b, x * scale))
        if direction == "out":  # combine: NVLink to the peer (pre-reduced there), then RDMA home
            nvl, rdma = _reverse(nvl), _reverse(rdma)
            two_hop = [(b, r, a) for a, r, b in two_hop]
        if not (rdma and nvl):  # one stage: one NVLink domain, or one rank in each
            first.append(_flow(model, nvl + rdma, two_hop))
            continue
        stage1, stage2 = (rdma, nvl) if direction == "in" else (nvl, rdma)
        _hops, _vol, alpha, _merged = _flow(model, nvl + rdma, two_hop)
        first.append(([(a, b, x * f) for a, b, x in stage1], 1.0, alpha, []))
        if f < 1.0:
            both.append(([(a, b, x * (1.0 - f)) for a, b, x in stage1 + stage2], 1.0, 0.0, []))
        last.append(([(a, b, x * f) for a, b, x in stage2], 1.0, 0.0, []))
    return [phase for phase in (first, both, last) if phase]


Plan = Callable[["PlanMaker", str, dict[str, float], tuple[int, ...]], "RawPlan"]
BACKENDS: dict[str, Plan] = {"deepep": deepep, "hybridep": hybridep}  # moe_flex_dispatcher_backend → its plan
KINDS: dict[str, Plan] = {"all_to_all_v": all_to_all_v, **BACKENDS}


def dispatch(model: "PlanMaker", op: str, group: tuple[int, ...], root: int) -> "RawPlan":
    """The raw plan of a dispatch collective named by ``emulator.program.dispatch_op``."""
    parsed = parse_dispatch_op(op)
    if parsed is None:
        raise ValueError(f"not a dispatch collective: {op!r}")
    kind, direction, params = parsed
    if len(group) < 2:
        return []
    return KINDS[kind](model, direction, params, group)
