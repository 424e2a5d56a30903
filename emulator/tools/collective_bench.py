"""nccl-tests on an emulated cluster: time one collective over a range of sizes.

For each size S: time t from the engine (one collective over the first N GPUs),
algbw = S/t and busbw = algbw × factor, with factor 2(n−1)/n for all-reduce,
(n−1)/n for reduce-scatter, all-gather and all-to-all, 1 for broadcast — as
nccl-tests reports them (GB/s = 1e9 B/s). Each row also names the algorithm that
ran (with ``collectives.algorithm: auto``, NCCL's pick for that size) and NCCL's
protocol for it (network/tuning.py; "" where NCCL has no table).

Overrides: link faults from the start are in the cluster (``build_cluster``); timed ones
(``at``/``until``) are played on each size's run, whose collective starts at 0 s, and each
row then lists what they did (``faults``: kind, target, at_s, until_s, rerouted,
stalled), as ``emulator run``'s summary does. A ``gpu_slowdown`` is refused by name: it
slows compute, and a collective alone runs none.
"""
from __future__ import annotations

from emulator.errors import EmulatorError
from emulator.network.routing import NoRouteError
from emulator.program import COLLECTIVE, COLLECTIVE_OPS, Op, Program
from emulator.result import FaultRecord
from emulator.run.engine import DeadlockError, Engine
from emulator.run.faults import FaultSchedule
from emulator.run.simulation import Cluster, build_cluster
from emulator.scenario.spec import Scenario


def bus_factor(op: str, n: int) -> float:
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op == "broadcast":
        return 1.0
    return (n - 1) / n


def size_range(text: str) -> list[float]:
    """'8B:8GiB' → 8, 16, 32, ... 8 GiB (doubling, as nccl-tests -f 2); 'A' → [A]."""
    from emulator.scenario.units import parse_bytes

    try:
        lo, _, hi = text.partition(":")
        a = parse_bytes(lo)
        b = parse_bytes(hi) if hi else a
    except ValueError as exc:
        raise EmulatorError(f"--sizes: {exc}") from None
    if a <= 0 or b < a:
        raise EmulatorError(f"--sizes: expected MIN:MAX with 0 < MIN <= MAX, got {text!r}")
    for end, value in (("MIN", a), ("MAX", b)):
        if value != int(value):  # a buffer holds whole bytes: "1.5B" would be run, and shown, as something else
            raise EmulatorError(f"--sizes: {end} is {value:g} B; expected a whole number of bytes, got {text!r}")
    out, s = [], a
    while s <= b * (1 + 1e-12):
        out.append(s)
        s *= 2
    return out


def collective_table(scenario: Scenario, op: str, sizes: list[float], gpus: int | None = None) -> list[dict]:
    """One row per size: bytes, time_s, algbw_GB_per_s, busbw_GB_per_s, algorithm, protocol."""
    if op not in COLLECTIVE_OPS:
        raise EmulatorError(f"--op: expected one of {', '.join(COLLECTIVE_OPS)}, got {op!r}")
    if gpus is not None and gpus < 2:  # checked before building the cluster; None (omitted): all GPUs
        raise EmulatorError(f"--gpus: expected at least 2 (the GPUs of the collective; omit it for all), got {gpus}")
    _refuse_slowdowns(scenario)
    cluster = build_cluster(scenario)
    topo = cluster.topology
    n = len(topo.gpus) if gpus is None else gpus
    if len(topo.gpus) < 2:
        raise EmulatorError(f"{scenario.path or scenario.name}: the cluster has {len(topo.gpus)} GPU; "
                            "a collective needs at least 2")
    if not 2 <= n <= len(topo.gpus):
        raise EmulatorError(f"--gpus: expected 2..{len(topo.gpus)} (the cluster's GPUs), got {n}")
    group = tuple(range(n))
    rows = []
    for size in sizes:
        ops = [Op(id=r, rank=r, kind=COLLECTIVE, stream="comm", collective=op, group=group, root=0, bytes=size)
               for r in group]
        t, records = _run(scenario, cluster, Program(n, ops), group)
        algbw = size / t / 1e9 if t > 0 else 0.0
        algorithm, protocol = cluster.collectives.choice(op, group, size)
        row = {"bytes": size, "time_s": t, "algbw_GB_per_s": algbw,
               "busbw_GB_per_s": algbw * bus_factor(op, n), "algorithm": algorithm, "protocol": protocol}
        if cluster.timed:
            row["faults"] = [{"kind": f.kind, "target": f.target, "at_s": f.at_s, "until_s": f.until_s,
                              "rerouted": f.rerouted, "stalled": f.stalled} for f in records]
        rows.append(row)
    return rows


def fault_notes(rows: list[dict]) -> list[str]:
    """One line per timed fault: when it happens and what it did over the sizes."""
    out = []
    for k, f in enumerate(rows[0].get("faults", []) if rows else []):
        acted = [r for r in rows if r["faults"][k]["rerouted"] or r["faults"][k]["stalled"]]
        until = f"until {f['until_s']:g} s" if f["until_s"] is not None else "for good"
        out.append(f"{f['kind']} {f['target']} from {f['at_s']:g} s {until} (each size starts at 0 s): "
                   f"it moved the flows of {len(acted)} of {len(rows)} sizes")
    return out


def _refuse_slowdowns(scenario: Scenario) -> None:
    for k, ov in enumerate(scenario.cluster.overrides):
        if ov.kind == "gpu_slowdown":
            raise EmulatorError(f"{scenario.path or scenario.name}: cluster.overrides[{k}]: gpu_slowdown "
                                f"{ov.target} slows compute ops, and emulator collective runs one collective and "
                                "no compute, so it would change nothing; remove it here (emulator run applies it)")


def _run(scenario: Scenario, cluster: Cluster, program: Program, group: tuple[int, ...]) -> tuple[float,
                                                                                                 list[FaultRecord]]:
    """One collective on the cluster, with its timed faults: (time, what each fault did)."""
    where = scenario.path or scenario.name
    try:
        engine = Engine(program, cluster.collectives, cluster.topology.capacity, cluster.gpus(group),
                        blocks=not cluster.timed)
        schedule = FaultSchedule(engine.env, engine.fabric, cluster.topology, cluster.timed,
                                 cluster.collectives.link_alias)
        schedule.start()
        spans, _events = engine.run()
    except NoRouteError as exc:
        raise EmulatorError(f"{where}: {exc}") from None
    except DeadlockError:
        stuck = [f for f in schedule.records if f.stalled and f.until_s is None]
        label = f"{stuck[0].label} at {stuck[0].at_s:g} s" if stuck else "a timed fault"
        raise EmulatorError(f"{where}: {label} stalled the collective's flows with no way round and never "
                            "recovers (give it until:)") from None
    return max(s.end_s for s in spans), schedule.records
