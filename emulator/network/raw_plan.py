"""The vocabulary of a collective's plan before routing: legs (``Hop``), flows (``RawFlow``),
phases of flows (``RawPlan``), the software step costs (``StepCosts``), and what an algorithm
family needs of the model that builds plans (``PlanMaker``).

The algorithm families (network/collectives.py for rings, trees, NVLS and point-to-point;
network/dispatch.py for MoE token dispatch) build raw plans against ``PlanMaker``; the
``CollectiveModel`` of network/collectives.py is one, and routes, compresses and caches them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

Hop = tuple[int, int, float]  # (src, dst, scale): one routed leg of a flow, its bytes scaled
# (hops, volume per byte of S, latency, merged hops): merged hops are reduced in the switches, so a
# link on several of them carries the flow once (the most any of them puts on it), not their sum
RawFlow = tuple[list[Hop], float, float, list[Hop]]
RawPlan = list[list[RawFlow]]  # phases of flows, before routing


@dataclass(frozen=True)
class StepCosts:
    """Software costs of a collective (calibrated per node preset; zero on custom graphs)."""

    launch: float = 0.0
    intra: float = 0.0
    inter: float = 0.0
    nvls: float = 0.0  # NVLS: (intra link capacity) / (NVLS all-reduce bus bandwidth); 0: none
    peer: float = 0.0  # an NCCL all-to-all's latency per peer beyond the first (collectives.ALLTOALL_PEER_S)


class PlanMaker(Protocol):
    """What an algorithm family reads of the model that builds its plans."""

    @property
    def steps(self) -> StepCosts:
        """The software step costs of the node kind."""
        ...

    def node_of(self, rank: int) -> int:
        """The node of rank ``rank`` (−1 on a custom graph without nodes)."""
        ...

    def alpha(self, a: int, b: int) -> float:
        """The latency of one step from rank ``a`` to rank ``b``."""
        ...

    def by_node(self, group: tuple[int, ...]) -> list[list[int]]:
        """The ranks of ``group``, one list per node."""
        ...
