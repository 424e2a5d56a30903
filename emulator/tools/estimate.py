"""A run's cost, estimated before it runs (``emulator run --estimate``).

It builds the workload (the cheap part) and counts what the engine will do:
one event per compute op, and for each communication instance (a collective
call shared by its members, or a send/recv pair) about three events — the
latency timer, the completion and the rate re-solve — or, for a direct
all-to-all of n ranks, two per flow of its n(n−1) flows. The wall time
divides that by an event rate measured on the reference machine (2 cores).
For a model workload it also gives the closed-form iteration time that ``emulator
search`` ranks layouts by (studies/rank.py), so a user sees the answer's ballpark too.
"""
from __future__ import annotations

import time

from emulator.errors import EmulatorError
from emulator.folding import Stamped
from emulator.printable import printable
from emulator.program import COLLECTIVE, COMPUTE, SEND
from emulator.scenario.spec import Scenario

EVENTS_PER_COMM = 3.0  # latency timer + completion + re-solve (measured: 2.6–3.4 on the benchmark cases)
EVENTS_PER_S = 100_000.0  # engine throughput on the reference 2-core machine (benchmarks/run.py)


def estimate(scenario: Scenario) -> str:
    """A few lines: ops, simulated ranks, expected events and wall time."""
    from emulator.scenario.units import format_time
    from emulator.simulation import build_workload

    if scenario.jobs:
        raise EmulatorError(f"{scenario.path or scenario.name}: --estimate covers one workload; this scenario has "
                            f"{len(scenario.jobs)} jobs (run it without --estimate; folding is off with jobs)")
    t0 = time.perf_counter()
    program, notes = build_workload(scenario)
    build_s = time.perf_counter() - t0
    # an unfolded run given as templates: copies' compute ops end together (one event),
    # each copy's collectives and sends are instances of their own
    if isinstance(program, Stamped):
        ops, copies = program.template, len(program.translations)
    else:
        ops, copies = program.ops, 1
    compute = comm = 0.0
    for op in ops:
        if op.kind is COMPUTE:
            compute += 1
        elif op.kind is SEND:
            comm += copies
        elif op.kind is COLLECTIVE:
            simulated = sum(1 for r in op.group if (program.fold is None or program.fold.is_representative(r)))
            members = min(len(op.group), max(1, simulated) * copies)
            n = len(op.group)
            per = 2.0 * n * (n - 1) + 1 if op.collective == "all_to_all" else EVENTS_PER_COMM
            comm += per / EVENTS_PER_COMM * copies / members
    iterations = max(1, scenario.simulation.iterations)
    events = int((compute + EVENTS_PER_COMM * comm) * iterations)
    ranks = len(program.simulated_ranks())
    wall = build_s + events / EVENTS_PER_S
    lines = [f"scenario        {printable(scenario.name)}",
             f"GPUs            {program.ranks} ({ranks} simulated)",
             f"ops             {len(ops) * copies * iterations:,} ({int(compute) * copies:,} compute per iteration)",
             f"events          ~{events:,}",
             f"wall time       ~{format_time(wall)} (build {format_time(build_s)}, at ~{EVENTS_PER_S:,.0f} events/s)"]
    closed = closed_form(scenario)
    if closed is not None:
        lines.append(f"iteration       ~{format_time(closed)} (closed form, no contention: studies/rank.py)")
    return "\n".join(lines + [f"note: {n}" for n in notes])


def closed_form(scenario: Scenario) -> float | None:
    """The closed-form iteration time of a model workload (studies/rank.py); None for traces,
    several jobs or a custom graph without a node type."""
    from emulator.studies.rank import estimate_iteration

    if scenario.model is None or scenario.workload.trace or scenario.cluster.node is None or scenario.jobs:
        return None
    return estimate_iteration(scenario).iteration_s
