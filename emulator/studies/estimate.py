"""A run's cost, estimated before it runs (``emulator run --estimate``).

It builds the workload (the cheap part) and counts what the engine will do: for
each communication instance (a collective call shared by its members, or a
send/recv pair) about two events — the start put off to its time, and the
completion (the latency timer too where its links are busy as it is matched:
``Fabric._ahead``) — or, for a direct all-to-all of n ranks, two per flow of
its n(n−1) flows. Compute ops cost none (the engine's timed ops), and neither
does a collective it runs as *private* (``emulator.run.engine``): here, one of a
group inside a node with one simulated member whose GPUs no other group or
transfer inside the node uses (tensor parallelism filling a node; the engine
also checks the links). The wall time
divides that by an event rate measured on the reference machine (2 cores).
For a model workload it also gives the closed-form iteration time that ``emulator
search`` ranks layouts by (studies/rank.py), so a user sees the answer's ballpark too.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

from emulator.outputs.printable import printable
from emulator.program import COLLECTIVE, COMPUTE, SEND, Op, Program
from emulator.run.folding import Stamped
from emulator.scenario.spec import Scenario

# start + completion, a flow alone started ahead of its latency (measured, 2026-12-04: 2.00 GPT 1T, 2.06
# GPT-3 1024, 1.90 Llama-3 70B, 2.01 quickstart per shared communication instance; 3.00, 3.02, 2.94 and
# 3.01 with a latency timer per flow)
EVENTS_PER_COMM = 2.0
EVENTS_PER_S = 100_000.0  # engine throughput on the reference 2-core machine (benchmarks/run.py)


def estimate(scenario: Scenario) -> str:
    """A few lines: ops, simulated ranks, expected events and wall time."""
    from emulator.run.simulation import build_workload
    from emulator.scenario.units import format_time

    if scenario.jobs:
        return estimate_jobs(scenario)
    t0 = time.perf_counter()
    program, notes = build_workload(scenario, blocks=True)  # as the run builds it (timed so)
    build_s = time.perf_counter() - t0
    if any(op.parts for op in program.ops):
        program = program.expanded()  # the ops one by one, to count
    refused = _refusal(scenario, program)
    scale = 1.0  # the run's simulated ranks over the program's: > 1 where the run will refuse the fold
    if refused:  # the run then simulates every rank but the automorphisms' copies (not built here: slow)
        from emulator.run.folding import choose_fold

        fold, note = choose_fold(scenario, in_effect=False)
        kept = program.ranks if fold is None else sum(map(fold.is_representative, range(program.ranks)))
        scale = kept / len(program.simulated_ranks())
        notes = [f"{note}; replicas across leaves not folded: {refused}"]
        from emulator.run.folding import restamp

        if restamp(program, scenario) is None:  # else its replicas are stamped from this program
            build_s *= 1.0 + scale  # the folded program, then the run's (about ``scale`` times its size)
    # an unfolded run given as templates: copies' compute ops end together (one event),
    # each copy's collectives and sends are instances of their own
    if isinstance(program, Stamped):
        ops, copies = program.template, len(program.translations)
    else:
        ops, copies = program.ops, 1
    compute, comm = _counts(program, ops, copies, scenario.cluster.node.domain if scenario.cluster.node else 0)
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


def _counts(program: Program, ops: list[Op], copies: int, gpus_per_node: int) -> tuple[float, float]:
    """(compute ops, communication instances) of one iteration of ``ops`` (``copies`` stamped copies)."""
    private = _private_groups(ops, program, gpus_per_node)
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
    return compute, comm


# A mix (emulator.run.mix) renumbers each job's ops to its GPUs and prepares an engine over them for the
# job alone and again for all jobs together, and builds the cluster's network for each of those runs.
# Measured on the reference 2-core machine (benchmarks/run.py, 2026-12-04, CPU seconds less the build,
# against the op counts below): jobs-2x70b-spread 4.8 s for 0.96M ops and 3 runs of 512 GPUs,
# jobs-32x64-stagger 3.4 s for 0.39M ops and 33 runs of 2,048, jobs-8x512-random 14.1 s for 1.75M ops
# and 9 runs of 4,096: ~5 µs per op run (4.2 to 6.9) and ~25 µs per GPU of the cluster per run; the
# peak memory, ~700 B per op of the shared run over an empty run's 60 MB (0.30, 0.20, 0.73 GB; 500 to
# 770 B).
SECONDS_PER_MIX_OP = 5e-6
SECONDS_PER_RUN_GPU = 25e-6
BYTES_PER_MIX_OP = 700.0
BASE_BYTES = 60e6  # an empty run: the interpreter, numpy, SimPy, the catalog (emulator run --json)


def estimate_jobs(scenario: Scenario) -> str:
    """``estimate`` of a scenario with jobs: each job's program under the fold the mix gives it
    (``emulator.run.mix.job_fold``), counted once alone and once in the shared run (one run for a single
    job at t = 0 on nodes 0..n−1), summed."""
    from emulator.run.mix import job_fold
    from emulator.run.simulation import build_workload
    from emulator.scenario.units import format_time
    from emulator.workload.builder import build_program
    from emulator.workload.jobs import gpu_map, job_scenario

    node = scenario.cluster.node
    assert node is not None  # the loader requires a node for jobs
    iterations = max(1, scenario.simulation.iterations)
    one = len(scenario.jobs) == 1 and scenario.jobs[0].start == 0
    t0 = time.perf_counter()
    built: dict[tuple[object, ...], tuple[float, float, float, int]] = {}
    ops_run = events = shared_ops = 0.0
    ranks = 0
    for job in scenario.jobs:
        fold = job_fold(scenario, job, gpu_map(job.nodes_assigned, node.gpus_per_node))
        key = (job.model, job.training, job.parallel, job.workload, len(job.nodes_assigned), fold)
        if key not in built:
            js = job_scenario(scenario, job)
            program = build_workload(js)[0] if fold is None else build_program(js, fold)
            ops, copies = (program.template, len(program.translations)) if isinstance(program, Stamped) \
                else (program.ops, 1)
            _compute, comm = _counts(program, ops, copies, node.domain)
            built[key] = (len(ops) * copies * iterations, EVENTS_PER_COMM * comm * iterations,
                          float(len(program.simulated_ranks())), program.ranks)
        n_ops, n_events, simulated, _world = built[key]
        runs = 1 if one else 2
        ops_run += n_ops * runs
        events += n_events * runs
        shared_ops += n_ops
        ranks += int(simulated)
    build_s = time.perf_counter() - t0
    prepare_s = ops_run * SECONDS_PER_MIX_OP + (1 if one else 1 + len(scenario.jobs)) * \
        scenario.cluster.nodes * node.gpus_per_node * SECONDS_PER_RUN_GPU
    wall = build_s + events / EVENTS_PER_S + prepare_s
    memory = BASE_BYTES + shared_ops * BYTES_PER_MIX_OP
    gpus = sum(len(j.nodes_assigned) for j in scenario.jobs) * node.gpus_per_node
    return "\n".join([
        f"scenario        {printable(scenario.name)}",
        f"jobs            {len(scenario.jobs)} on {gpus} GPUs ({ranks} simulated, each job folded as the mix folds "
        "it alone; the shared run may fold a job less)",
        f"ops             {int(ops_run):,} run ({int(shared_ops):,} in the shared run)",
        f"events          ~{int(events):,}",
        f"memory          ~{memory / 1e9:.2f} GB (peak, about {BYTES_PER_MIX_OP:.0f} B per op of the shared run)",
        f"wall time       ~{format_time(wall)} (build {format_time(build_s)}, placing and preparing "
        f"{format_time(prepare_s)}, at ~{EVENTS_PER_S:,.0f} events/s)"])


def _refusal(scenario: Scenario, program: Program) -> str:
    """Why the run would refuse the program's fold in effect (its plans prepared as the engine
    prepares them: a copy's transfer with other latencies than its representative's), or ""."""
    from emulator.program import FoldRefused
    from emulator.run.simulation import build_cluster

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


# ------------------------------------------------------------------ the warning before a slow run
# A pre-estimate from the scenario's keys alone, without building the workload (an unfolded build
# can itself take minutes: `emulator run --estimate` on gpt3-175b-1024-a100 with one override took 76
# CPU seconds). Per simulated rank, per layer it holds, per microbatch, per iteration, fitted on that
# scenario unfolded (`emulator run scenarios/gpt3-175b-1024-a100.yaml --estimate --set
# "cluster.overrides=[{kind: gpu_slowdown, target: 'gpu:3', factor: 2}]"`, 2026-12-06: 3,301,152 events
# and 21,702,144 ops for 1,024 ranks × 96 microbatches × 12 layers = 1,179,648 rank-layer-microbatches).
EVENTS_PER_RANK_LAYER_MB = 2.8  # 3,301,152 / 1,179,648
OPS_PER_RANK_LAYER_MB = 18.4  # 21,702,144 / 1,179,648
# --out's files per op (spans.csv, trace.json): issue #42 measured 1.3 GB for a run of that size (~21.7M ops)
OUT_BYTES_PER_OP = 60.0
SLOW_S = 30.0  # a run expected to take longer is announced
LARGE_OUT_BYTES = 1e9  # and so is an --out expected to write more


@dataclass(frozen=True)
class PreEstimate:
    """What the scenario's keys predict of a run: ranks it simulates, events, wall time, --out bytes."""

    ranks: int
    simulated: int
    events: float
    wall_s: float
    out_bytes: float
    fold_note: str


def pre_estimate(scenario: Scenario) -> PreEstimate | None:
    """The run's size from its keys (``choose_fold`` and the layout; nothing is built); None where
    the keys do not say it (a trace or profile workload, several jobs)."""
    from emulator.run.folding import choose_fold

    m, t, p = scenario.model, scenario.training, scenario.parallel
    if scenario.jobs or scenario.workload.trace or scenario.workload.profile or m is None or not m.layers:
        return None
    ranks = p.tp * p.pp * p.dp * p.cp
    fold, note = choose_fold(scenario)
    simulated = ranks if fold is None else max(1, ranks // fold.copies)
    microbatches = max(1, t.global_batch // max(1, t.micro_batch * p.dp))
    units = simulated * microbatches * math.ceil(m.layers / p.pp) * max(1, scenario.simulation.iterations)
    events = EVENTS_PER_RANK_LAYER_MB * units
    out_bytes = OUT_BYTES_PER_OP * OPS_PER_RANK_LAYER_MB * units
    return PreEstimate(ranks, simulated, events, events / EVENTS_PER_S, out_bytes, note)


def slow_warning(scenario: Scenario, out: bool = False) -> str | None:
    """One line for stderr when the run looks slow (over ``SLOW_S``) or, with ``out``, its files large:
    what makes it so and what to do; None otherwise."""
    from emulator.scenario.units import format_bytes, format_time

    pre = pre_estimate(scenario)
    if pre is None:
        return None
    slow, large = pre.wall_s > SLOW_S, out and pre.out_bytes > LARGE_OUT_BYTES
    if not (slow or large):
        return None
    what = []
    if slow:
        what.append(f"~{pre.events:,.0f} events, ~{format_time(pre.wall_s)} at ~{EVENTS_PER_S:,.0f} events/s")
    if large:
        what.append(f"--out would write ~{format_bytes(pre.out_bytes)}")
    if pre.simulated == pre.ranks and pre.ranks > 1:
        why = f"all {pre.ranks:,} GPUs are simulated ({pre.fold_note})"
        todo = ("to simulate a few ranks for all, remove what turns folding off (simulation.fold: auto; "
                "study faults and stragglers on a smaller cluster)")
    else:
        why = f"{pre.simulated:,} of {pre.ranks:,} GPUs simulated, over every microbatch and layer"
        todo = "fewer microbatches (training.global_batch) or iterations run faster"
    if large:
        todo += "; leave out --out (its spans.csv and trace.json hold every op)"
    return (f"warning: this run may be slow ({'; '.join(what)}): {why}; {todo}; "
            "`emulator run --estimate` builds the workload to count it closer")
