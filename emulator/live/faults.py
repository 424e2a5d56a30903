"""The scenario's ``cluster.overrides`` in a live run: each one applied to the emulated ranks, or refused.

Pure Python (no torch). A live run measures the real ranks' compute and emulates the
rest, so an override acts only where the emulator decides:
- ``gpu_slowdown`` on an emulated rank: applied. That rank's compute is its mirror's
  measured compute × ``factor`` (``Session`` keeps how far it lags behind), so it
  arrives late at the collectives it joins and delays them, as a straggler does in
  ``emulator run``.
- ``gpu_slowdown`` on a real rank: refused — its compute is measured, not emulated
  (slow the script down, or put the straggler on an emulated rank).
- ``gpu_slowdown`` on a GPU outside the live world: refused — no rank runs there.
- ``link_degrade`` / ``link_fail`` from the start: applied. The emulated fabric is
  built with them (``emulator.run.faults.apply_faults``), so every emulated collective's
  flows are slowed or rerouted. (A collective among real ranks only runs on the real
  transport and is not affected; the report's notes say so.)
- a link fault in the middle of the run (``at`` / ``until``): refused — the live
  timeline is the real script's, not the emulated run's, so there is no run time to
  schedule it at.
- ``node_fail``: refused, as in ``emulator run``.
"""
from __future__ import annotations

from emulator.errors import EmulatorError
from emulator.network.topology import Topology
from emulator.run.faults import is_timed
from emulator.scenario.spec import Scenario


def _label(i: int, kind: str, target: str) -> str:
    return f"cluster.overrides[{i}] ({kind} {target})"


def live_faults(scenario: Scenario, topo: Topology, world: int, real: int) -> tuple[dict[int, float], list[str]]:
    """Per emulated rank, its compute slowdown factor; and one note per applied override.

    Raises EmulatorError naming the first override that cannot act in a live run.
    ``real``: world ranks 0..real−1 are real processes.
    """
    where = scenario.path or scenario.name
    slow: dict[int, float] = {}
    notes: list[str] = []
    for i, ov in enumerate(scenario.cluster.overrides):
        label = _label(i, ov.kind, ov.target)
        if is_timed(ov):
            raise EmulatorError(f"{where}: {label}: a fault in the middle of the run (at/until) cannot act in a "
                                "live run (its timeline is the real script's); give it from the start, or use "
                                "`emulator run`")
        if ov.kind == "gpu_slowdown":
            ranks = _target_ranks(topo, ov.target)
            outside = [r for r in ranks if r >= world]
            mine = [r for r in ranks if r < real]
            if mine:
                raise EmulatorError(f"{where}: {label}: rank {mine[0]} is a real process, whose compute is measured, "
                                    "not emulated; put the straggler on an emulated rank "
                                    f"({real}..{world - 1}) or slow the script itself")
            if len(outside) == len(ranks):
                raise EmulatorError(f"{where}: {label}: GPU {ranks[0]} is outside the live world of {world} ranks")
            for r in ranks:
                if r < world:
                    slow[r] = slow.get(r, 1.0) * ov.factor
            notes.append(f"{label}: applied: emulated rank(s) {_span(r for r in ranks if r < world)} compute "
                         f"×{ov.factor:g} and arrive late at the collectives they join")
        elif ov.kind in ("link_degrade", "link_fail"):
            what = "slowed" if ov.kind == "link_degrade" else "rerouted"
            notes.append(f"{label}: applied: the emulated collectives' flows are {what}"
                         + (" (collectives among real ranks only run on the real transport)" if real > 1 else ""))
        else:  # node_fail, or an unknown kind: build_cluster has refused it already
            raise EmulatorError(f"{where}: {label}: cannot act in a live run")
    return slow, notes


def _span(ranks) -> str:
    rs = sorted(ranks)
    if len(rs) > 2 and rs == list(range(rs[0], rs[-1] + 1)):
        return f"{rs[0]}..{rs[-1]}"
    return ",".join(map(str, rs))


def _target_ranks(topo: Topology, target: str) -> list[int]:
    """The GPUs of a ``gpu:R`` or ``node:N`` target (the scenario checks have validated it)."""
    kind, _, num = target.partition(":")
    if kind == "node" and topo.gpus_per_node:
        g = topo.gpus_per_node
        return list(range(int(num) * g, (int(num) + 1) * g))
    return [int(num)]
