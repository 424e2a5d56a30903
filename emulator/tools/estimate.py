"""A run's cost, estimated before it runs (``emulator run --estimate``).

It builds the workload (the cheap part) and counts what the engine will do: for
each communication instance (a collective call shared by its members, or a
send/recv pair) about two events — the start put off to its time, and the
completion (the latency timer too where its links are busy as it is matched:
``Fabric._ahead``) — or, for a direct all-to-all of n ranks, two per flow of
its n(n−1) flows. Compute ops cost none (the engine's timed ops), and neither
does a collective it runs as *private* (``emulator.engine``): here, one of a
group inside a node with one simulated member whose GPUs no other group or
transfer inside the node uses (tensor parallelism filling a node; the engine
also checks the links). The wall time
divides that by an event rate measured on the reference machine (2 cores).
For a model workload it also gives the closed-form iteration time that ``emulator
search`` ranks layouts by (studies/rank.py), so a user sees the answer's ballpark too.
"""
from __future__ import annotations

import time

from emulator.errors import EmulatorError
from emulator.folding import Stamped
from emulator.printable import printable
from emulator.program import COLLECTIVE, COMPUTE, SEND, Op, Program
from emulator.scenario.spec import Scenario

# start + completion, a flow alone started ahead of its latency (measured, 2026-12-04: 2.00 GPT 1T, 2.06
# GPT-3 1024, 1.90 Llama-3 70B, 2.01 quickstart per shared communication instance; 3.00, 3.02, 2.94 and
# 3.01 with a latency timer per flow)
EVENTS_PER_COMM = 2.0
EVENTS_PER_S = 100_000.0  # engine throughput on the reference 2-core machine (benchmarks/run.py)


def estimate(scenario: Scenario) -> str:
    """A few lines: ops, simulated ranks, expected events and wall time."""
    from emulator.scenario.units import format_time
    from emulator.simulation import build_workload

    if scenario.jobs:
        raise EmulatorError(f"{scenario.path or scenario.name}: --estimate covers one workload; this scenario has "
                            f"{len(scenario.jobs)} jobs (run it without --estimate; folding is off with jobs)")
    t0 = time.perf_counter()
    program, notes = build_workload(scenario, blocks=True)  # as the run builds it (timed so)
    build_s = time.perf_counter() - t0
    if any(op.parts for op in program.ops):
        program = program.expanded()  # the ops one by one, to count
    refused = _refusal(scenario, program)
    scale = 1.0  # the run's simulated ranks over the program's: > 1 where the run will refuse the fold
    if refused:  # the run then simulates every rank but the automorphisms' copies (not built here: slow)
        from emulator.folding import choose_fold

        fold, note = choose_fold(scenario, in_effect=False)
        kept = program.ranks if fold is None else sum(map(fold.is_representative, range(program.ranks)))
        scale = kept / len(program.simulated_ranks())
        notes = [f"{note}; replicas across leaves not folded: {refused}"]
        from emulator.folding import restamp

        if restamp(program, scenario) is None:  # else its replicas are stamped from this program
            build_s *= 1.0 + scale  # the folded program, then the run's (about ``scale`` times its size)
    # an unfolded run given as templates: copies' compute ops end together (one event),
    # each copy's collectives and sends are instances of their own
    if isinstance(program, Stamped):
        ops, copies = program.template, len(program.translations)
    else:
        ops, copies = program.ops, 1
    private = _private_groups(ops, program, scenario.cluster.node.gpus_per_node if scenario.cluster.node else 0)
    compute = comm = 0.0
    for op in ops:
        if op.kind is COMPUTE:
            compute += 1
        elif op.kind is SEND:
            comm += copies
        elif op.kind is COLLECTIVE and op.group not in private:
            simulated = sum(1 for r in op.group if (program.fold is None or program.fold.is_representative(r)))
            members = min(len(op.group), max(1, simulated) * copies)
            n = len(op.group)
            per = 2.0 * n * (n - 1) + 1 if op.collective == "all_to_all" else EVENTS_PER_COMM
            comm += per / EVENTS_PER_COMM * copies / members
    iterations = max(1, scenario.simulation.iterations)
    events = int(EVENTS_PER_COMM * comm * iterations * scale)
    ranks = int(len(program.simulated_ranks()) * scale)
    wall = build_s + events / EVENTS_PER_S
    lines = [f"scenario        {printable(scenario.name)}",
             f"GPUs            {program.ranks} ({ranks} simulated)",
             f"ops             {int(len(ops) * copies * iterations * scale):,} "
             f"({int(compute * copies * scale):,} compute per iteration)",
             f"events          ~{events:,}",
             f"wall time       ~{format_time(wall)} (build {format_time(build_s)}, at ~{EVENTS_PER_S:,.0f} events/s)"]
    closed = closed_form(scenario)
    if closed is not None:
        lines.append(f"iteration       ~{format_time(closed)} (closed form, no contention: studies/rank.py)")
    return "\n".join(lines + [f"note: {n}" for n in notes])


def _refusal(scenario: Scenario, program: Program) -> str:
    """Why the run would refuse the program's fold in effect (its plans prepared as the engine
    prepares them: a copy's transfer with other latencies than its representative's), or ""."""
    from emulator.program import FoldRefused
    from emulator.simulation import build_cluster

    if program.fold is None or isinstance(program, Stamped):
        return ""
    keys: set[tuple[str, tuple[int, ...], int]] = set()
    for op in program.ops:
        if op.kind is COLLECTIVE:
            keys.add((op.collective, op.group, op.root))
        elif op.kind is SEND:
            keys.add(("p2p", (op.rank, op.peer), op.rank))
    cluster = build_cluster(scenario, program.fold)
    try:
        cluster.collectives.prepare(sorted(keys, key=repr), cluster.topology.capacity)
    except FoldRefused as exc:
        return str(exc)
    return ""


def _private_groups(ops: list[Op], program: Program, gpus_per_node: int) -> set[tuple[int, ...]]:
    """The collective groups the engine will likely run as private: inside one node, one simulated
    member (the others folded), and no other group or transfer inside the node on their GPUs (they
    would share its NVLink ports). An estimate: the engine decides on the links themselves."""
    if not gpus_per_node or program.fold is None:
        return set()
    users: dict[int, set[tuple[int, ...]]] = {}  # GPU → the groups and transfers inside its node on it
    groups: set[tuple[int, ...]] = set()
    for op in ops:
        if op.kind is COLLECTIVE:
            g = op.group
            groups.add(g)
        elif op.kind is SEND:
            g = tuple(sorted((op.rank, op.peer)))
        else:
            continue
        if len({r // gpus_per_node for r in g}) == 1:
            for r in g:
                users.setdefault(r, set()).add(g)
    fold = program.fold
    return {g for g in groups if len({r // gpus_per_node for r in g}) == 1
            and sum(1 for r in g if fold.is_representative(r)) == 1 and all(users[r] == {g} for r in g)}


def closed_form(scenario: Scenario) -> float | None:
    """The closed-form iteration time of a model workload (studies/rank.py); None for traces,
    several jobs or a custom graph without a node type."""
    from emulator.studies.rank import estimate_iteration

    if scenario.model is None or scenario.workload.trace or scenario.cluster.node is None or scenario.jobs:
        return None
    return estimate_iteration(scenario).iteration_s
