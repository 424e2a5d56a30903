"""The closed form's price of a MoE token exchange (studies/rank.py): its plan, as the fabric runs it alone,
on ideal nodes.

network/dispatch.py builds a dispatch's or combine's flows (NCCL all-to-all-v, DeepEP, HybridEP) against a
``PlanMaker``; the fabric routes them. Here the maker is the expert-parallel group's NVLink domains with no
fabric between them: each GPU has its NVLink port (``intra_bandwidth`` × ``intra_efficiency``) and its share
of its node's NICs (``nics`` × ``nic_bandwidth`` × ``nic_efficiency`` / ``gpus_per_node``), each way, as
network/hybrid_ep.py ``links_of`` has them. A leg inside a domain loads the sender's NVLink out and the
receiver's NVLink in; a leg between domains the sender's NIC share out and the receiver's in. Every flow of a
phase runs at the pace of its most loaded link, so the phase ends when its busiest link has carried its load:

    time = Σ over phases [ the largest latency of its flows + S · max over links (Σ its legs' bytes per byte
           of S / the link's rate) ]

The plain ``all_to_all`` of the alltoall dispatcher (every rank the mean) is NCCL's all-to-all-v with every
share 1/n. Pricing an all-to-all as a ring (``(n − 1)/n · S`` over the NIC share times the members on each
node, rank.py ``inter_link``) takes each member's own traffic for the whole node's, and leaves out the top-k
copies and DeepEP's forwarding: DeepSeek-V3's DeepEP dispatch on 1,024 H100 came to 0.54 ms a call that way,
where the fabric runs it alone in about 1.8 ms (``tests/test_rank.py``).

Its faults: no fabric (a fat tree's oversubscription, a rail's spine) and no other traffic; the search
simulates its best layouts for that.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from emulator.network.collectives import ALLTOALL_PEER_S
from emulator.network.dispatch import KINDS
from emulator.network.raw_plan import RawPlan, StepCosts
from emulator.program import parse_dispatch_op
from emulator.scenario.spec import NodeSpec


@dataclass(frozen=True)
class EpNodes:
    """An expert-parallel group on ideal nodes: the ``PlanMaker`` network/dispatch.py builds plans against."""

    group: tuple[int, ...]  # world ranks, in the group's order
    domain: int  # GPUs of one NVLink domain: ranks r // domain share one
    nvlink: float  # B/s of a GPU's NVLink port, each way
    rdma: float  # B/s of a GPU's share of its node's NICs, each way
    alpha_nvlink: float  # s: one step over NVLink (two link latencies and the software step)
    alpha_rdma: float  # s: one step over the NICs
    launch: float  # s: a collective's launch

    @property
    def steps(self) -> StepCosts:
        return StepCosts(launch=self.launch, peer=ALLTOALL_PEER_S)

    def node_of(self, rank: int) -> int:
        return rank // self.domain

    def alpha(self, a: int, b: int) -> float:
        return self.alpha_nvlink if self.node_of(a) == self.node_of(b) else self.alpha_rdma

    def by_node(self, group: tuple[int, ...]) -> list[list[int]]:
        nodes: dict[int, list[int]] = {}
        for r in group:
            nodes.setdefault(self.node_of(r), []).append(r)
        return list(nodes.values())


def ep_nodes(group: tuple[int, ...], node: NodeSpec) -> EpNodes:
    """``group`` on nodes of ``node``'s kind (its NVLink domain, its NICs: hybrid_ep.py ``links_of``'s figures)."""
    rdma = node.nics * node.nic_bandwidth * node.nic_efficiency / node.gpus_per_node
    return EpNodes(group, node.domain, node.intra_bandwidth * node.intra_efficiency, rdma,
                   2 * node.intra_latency + node.step_latency_intra, 2 * node.nic_latency + node.step_latency_inter,
                   node.collective_launch)


def _plan(op: str, nodes: EpNodes) -> RawPlan:
    """The raw plan of token exchange ``op`` on ``nodes`` (a plain all_to_all: all-to-all-v, every share 1/n)."""
    parsed = parse_dispatch_op(op)
    if parsed is None:  # the plain all_to_all (program.is_token_exchange)
        return KINDS["all_to_all_v"](nodes, "in", {"load": 1.0}, nodes.group)
    kind, direction, params = parsed
    return KINDS[kind](nodes, direction, params, nodes.group)


def phase_times(plan: RawPlan, nodes: EpNodes) -> list[tuple[float, float]]:
    """(latency, seconds per byte of S) of each phase of ``plan`` on ``nodes`` (module docstring)."""
    out = []
    for phase in plan:
        load: dict[tuple[bool, bool, int], float] = {}  # (across domains, out, GPU) → bytes per byte of S
        latency = 0.0
        for hops, volume, alpha, _merged in phase:
            latency = max(latency, alpha)
            for a, b, x in hops:
                cross = nodes.node_of(a) != nodes.node_of(b)
                load[(cross, True, a)] = load.get((cross, True, a), 0.0) + x * volume
                load[(cross, False, b)] = load.get((cross, False, b), 0.0) + x * volume
        per_byte = max((v / (nodes.rdma if key[0] else nodes.nvlink) for key, v in load.items()), default=0.0)
        out.append((latency, per_byte))
    return out


@lru_cache(maxsize=4096)
def exchange_time(op: str, nbytes: float, nodes: EpNodes) -> float:
    """Seconds of token exchange ``op`` (a dispatch collective or a plain all_to_all) of ``nbytes`` per rank
    on ``nodes``, alone (module docstring); 0 on a group of one."""
    if len(nodes.group) < 2 or nbytes <= 0:
        return 0.0
    return sum(latency + nbytes * per_byte for latency, per_byte in phase_times(_plan(op, nodes), nodes))
