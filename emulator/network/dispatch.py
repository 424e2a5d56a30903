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
  (combine): rank b sends S·q_b back to each a.
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

``BACKENDS`` maps a flex backend to its plan: the plug-in point for another backend.
"""
from __future__ import annotations

import math
from functools import lru_cache
from itertools import combinations
from typing import TYPE_CHECKING, Callable

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
        total += math.comb(m - a, top_k) / math.comb(m, top_k) if m - a >= top_k else 0.0
        subsets += 1
    return total / subsets


def use_probability(experts: int, top_k: int, groups: int, group_topk: int, members: tuple[int, ...]) -> float:
    """P(a token has at least one of its top_k experts among ``members``)."""
    return 1.0 - _no_use(experts, top_k, max(1, groups), max(1, group_topk), members)


def _local_experts(i: int, local: int) -> tuple[int, ...]:
    """EP rank i's experts (Megatron-Core moe_layer.py: ``local_expert_indices_offset``)."""
    return tuple(range(i * local, (i + 1) * local))


def _flow(model: "PlanMaker", hops: list["Hop"], two_hop: list[tuple[int, int, int]]) -> "RawFlow":
    """One rank's flow over ``hops``; its latency: launch + the slowest leg's α (a forwarded leg's two)."""
    alphas = [model.alpha(a, b) for a, b, _s in hops]
    alphas += [model.alpha(a, r) + model.alpha(r, b) for a, r, b in two_hop]
    return hops, 1.0, model.steps.launch + max(alphas, default=0.0), []


def all_to_all_v(model: "PlanMaker", direction: str, params: dict[str, float],
                 group: tuple[int, ...]) -> "RawPlan":
    """NCCL all-to-all-v: one flow per rank over its legs to (``in``) or from (``out``) every other rank."""
    n = len(group)
    load = params.get("load", 1.0)
    busiest = load / n
    rest = (1.0 - busiest) / (n - 1)
    share = {b: (busiest if i == 0 else rest) for i, b in enumerate(group)}
    flows = []
    for a in group:
        if direction == "in":
            hops = [(a, b, share[b]) for b in group if b != a]
        else:  # rank a returns to each b what b sent it
            hops = [(a, b, share[a]) for b in group if b != a]
        flows.append(_flow(model, hops, []))
    return [flows]


def deepep(model: "PlanMaker", direction: str, params: dict[str, float], group: tuple[int, ...]) -> "RawPlan":
    """DeepEP's normal dispatch (``in``) or combine (``out``): per token owner, RDMA once per remote node to
    the relay of the owner's local index, NVLink forwarding inside each node (module docstring)."""
    n = len(group)
    experts, top_k = int(params["experts"]), int(params["top_k"])
    groups, group_topk = int(params.get("groups", 1)), int(params.get("group_topk", 1))
    load = params.get("load", 1.0)
    local = max(1, experts // n)
    index = {r: i for i, r in enumerate(group)}
    nodes = model.by_node(group) if model.node_of(group[0]) >= 0 else [list(group)]
    node_of = {r: k for k, members in enumerate(nodes) for r in members}
    p_gpu = {r: use_probability(experts, top_k, groups, group_topk, _local_experts(index[r], local)) for r in group}
    p_gpu[group[0]] = min(1.0, p_gpu[group[0]] * load)  # the busiest receiver (all_to_all_v's convention)
    p_node = [use_probability(experts, top_k, groups, group_topk,
                              tuple(e for r in members for e in _local_experts(index[r], local))) for members in nodes]
    nvl = DEEPEP_NVLINK[direction]
    rdma = rdma_fraction(len(nodes), direction)
    flows = []
    for s in group:
        home = node_of[s]
        j = nodes[home].index(s)
        legs: list[tuple[int, int, float]] = [(s, g, p_gpu[g] / nvl) for g in nodes[home] if g != s]
        two_hop: list[tuple[int, int, int]] = []
        for k, members in enumerate(nodes):
            if k == home:
                continue
            relay = members[j % len(members)]
            legs.append((s, relay, p_node[k] / rdma))
            for g in members:
                if g != relay:
                    legs.append((relay, g, p_gpu[g] / nvl))
                    two_hop.append((s, relay, g))
        if direction == "out":
            legs = [(b, a, x) for a, b, x in legs]
            two_hop = [(b, r, a) for a, r, b in two_hop]
        flows.append(_flow(model, legs, two_hop))
    return [flows]


Plan = Callable[["PlanMaker", str, dict[str, float], tuple[int, ...]], "RawPlan"]
BACKENDS: dict[str, Plan] = {"deepep": deepep}  # moe_flex_dispatcher_backend → its plan
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
