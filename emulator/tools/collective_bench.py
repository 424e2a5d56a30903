"""nccl-tests on an emulated cluster: time one collective over a range of sizes.

For each size S: time t from the engine (one collective over the first N GPUs),
algbw = S/t and busbw = algbw × factor, with factor 2(n−1)/n for all-reduce,
(n−1)/n for reduce-scatter, all-gather and all-to-all, 1 for broadcast — as
nccl-tests reports them (GB/s = 1e9 B/s). Each row also names the algorithm that
ran (with ``collectives.algorithm: auto``, NCCL's pick for that size) and NCCL's
protocol for it (network/tuning.py; "" where NCCL has no table).
"""
from __future__ import annotations

from emulator.engine import Engine
from emulator.errors import EmulatorError
from emulator.network.routing import NoRouteError
from emulator.program import COLLECTIVE, COLLECTIVE_OPS, Op, Program
from emulator.scenario.spec import Scenario
from emulator.simulation import build_cluster


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
        try:
            engine = Engine(Program(n, ops), cluster.collectives, topo.capacity, cluster.gpus(group))
            spans, _events = engine.run()
        except NoRouteError as exc:
            raise EmulatorError(f"{scenario.path or scenario.name}: {exc}") from None
        t = max(s.end_s for s in spans)
        algbw = size / t / 1e9 if t > 0 else 0.0
        algorithm, protocol = cluster.collectives.choice(op, group, size)
        rows.append({"bytes": size, "time_s": t, "algbw_GB_per_s": algbw,
                     "busbw_GB_per_s": algbw * bus_factor(op, n), "algorithm": algorithm, "protocol": protocol})
    return rows
