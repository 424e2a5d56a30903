"""A run's cost, estimated before it runs (``emulator run --estimate``).

It builds the workload and prepares the engine as the run does (both timed: on a large layout
they are seconds of the run), and counts, op by op, what the engine will put on SimPy's clock
(``events_of``): nothing for a kernel on a GPU it has alone, a private collective or a block op
(finished ahead of the clock); for a collective call or a transfer, one start and, per phase of
its flow plan, one end for a flow alone or a latency timer and an end for each of several flows
(a MoE dispatch, often one end only: run ahead of the clock); two for a kernel on a shared GPU.
The copies of a stamped (unfolded) program start together, one timeout for all of them.

The events do not all cost alike, which is why one rate of events per second (100,000/s) was off
by up to 4x (issue #42; CPU time, 2026-12-06): the unfolded GPT-3 on 1,024 GPUs (one straggler) runs
1.89M events in 74 s (26,000/s: a max-min solve of many ranks' flows per transfer), Qwen3 235B 1.84M
in 25 s (74,000/s), the quickstart 1,664 in 13 ms (128,000/s). The wall time
(``run_seconds``) is, on the reference machine (the team's 2-core machine, SimPy floor 0.69 µs
a timeout of CPU):

- ``STARTUP_S``: the interpreter, the imports and the summary (0.30 s, a trace of 4 ops);
- the build and the preparation, as timed here;
- ``SECONDS_PER_EVENT`` a SimPy event (5.7 µs: its callbacks, the engine's bookkeeping);
- ``SECONDS_PER_SOLVE`` × log2(2 × simulated ranks) per communication instance: the max-min solves
  of the fabric, over components that grow with the flows the simulated ranks keep in flight
  (3.5 µs: from 1 rank to 1,024, 0 to 11 doublings);
- ``SECONDS_PER_FLOW_EVENT`` × f² per flow event of a phase of several flows, f its flows per
  simulated member (9.7 ns: each end solves a phase's flows anew, ~f rounds of f flows; an
  all-to-all of 31 or 64 flows a rank).

The three rates are a least-squares fit (relative error) of the engine's CPU time on 16 runs
(``benchmarks/estimate_check.py``'s cases and the unfolded Llama-3 405B; 2026-12-06): folded and
unfolded, MoE and dense, 1 to 1,024 simulated ranks; each within 0.7-1.3x but DeepSeek-V2-Lite's
tiny run (0.4x, 36 ms). Scaled to this machine by a short SimPy floor timed here (``machine_factor``,
20,000 timeouts, ~14 ms), they give the wall time of a run on a machine it has to itself (its CPU
time; a shared machine stretches a run's wall time by its load, which no estimate sees).
``benchmarks/estimate_check.py`` measures every scenario against it (benchmarks/results/estimate.json).
Which MoE dispatches run ahead is read from the program (``_met``): a constant share (0.97) put
DeepSeek-V3 1024's 3% on the clock, flow by flow, where its run puts 0.05% there (2.3x its CPU time,
now 1.1x).

For a model workload it also gives the closed-form iteration time that ``emulator
search`` ranks layouts by (studies/rank.py), so a user sees the answer's ballpark too.
"""
from __future__ import annotations

import functools
import gc
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from emulator.outputs.printable import printable
from emulator.program import COLLECTIVE, COMPUTE, SEND, Op, Program
from emulator.run.folding import Stamped
from emulator.scenario.spec import Scenario

if TYPE_CHECKING:
    from emulator.network.collectives import CollectiveModel
    from emulator.network.flows import Plan
    from emulator.run.engine import Engine

# a mix's (``count_jobs``) communication instances: start + completion, a flow alone started ahead of its
# latency (measured, 2026-12-04: 2.00 GPT 1T, 2.06 GPT-3 1024, 1.90 Llama-3 70B, 2.01 quickstart per shared
# communication instance; 3.00, 3.02, 2.94 and 3.01 with a latency timer per flow)
EVENTS_PER_COMM = 2.0
# one of a group with one member simulated: where its plan is one flow it is handed to the fabric ahead of its
# start (``Engine._issue``: its end alone), else as above (measured, 2026-12-06: jobs-interleaved-4to1, whose
# DP all-reduces are all such, 16 events before ``_issue`` and 12 after, for the 8 instances counted here)
EVENTS_PER_SOLO = 1.5
# a kernel on a shared GPU (``emulator.run.shared_gpus``): its start put off to its time, its end
# (Llama-3 70B on B200, whose compute slows under communication: 54,362 counted, 53,765 run)
EVENTS_PER_SHARED_KERNEL = 2.0
# the costs on the reference machine (module docstring)
REFERENCE_TIMEOUT_S = 0.69e-6  # its SimPy floor: CPU seconds a timeout (benchmarks/run.py, 1M timeouts)
STARTUP_S = 0.30
SECONDS_PER_EVENT = 5.7e-6
SECONDS_PER_SOLVE = 3.5e-6
SECONDS_PER_FLOW_EVENT = 9.7e-9
FLOOR_TIMEOUTS = 20_000  # machine_factor's floor: ~14 ms
FLOOR_RUNS = 3  # machine_factor takes the least of these floors


@functools.cache
@functools.lru_cache(maxsize=1)
def machine_factor() -> float:
    """This machine's SimPy floor over the reference machine's: CPU seconds (this thread's) of one process waiting on
    ``FLOOR_TIMEOUTS`` timeouts (``benchmarks/run.py``'s floor, shortened), the least of FLOOR_RUNS, once per process.
    The collector is paused while it is timed: a full collection of the caller's heap (DeepSeek-V3 1024's 854k ops
    and what the estimate made beside them) had taken 1.6x the floor. One run alone put DeepSeek-V3 1024's estimate
    at 14.5 and 17.9 s a minute apart (2026-12-07), as ``benchmarks/run.py`` found of its own floor."""
    return max(1e-3, min(_floor() for _ in range(FLOOR_RUNS)) / FLOOR_TIMEOUTS / REFERENCE_TIMEOUT_S)


def _floor() -> float:
    """CPU seconds (this thread's) of one SimPy process waiting on ``FLOOR_TIMEOUTS`` timeouts, the collector paused."""
    import simpy

    env = simpy.Environment()

    def wait(env: simpy.Environment) -> Any:
        for _ in range(FLOOR_TIMEOUTS):
            yield env.timeout(1)

    env.process(wait(env))
    was = gc.isenabled()
    gc.disable()
    try:
        c0 = time.thread_time()  # this thread's: numpy's BLAS threads, spinning a while after a build's matrix
        env.run()  # work, count in the process's CPU time (2.3x on the quickstart's floor, 2026-12-06)
        spent = time.thread_time() - c0
    finally:
        if was:
            gc.enable()
    return spent


def run_seconds(clocked: "Clocked") -> float:
    """Seconds of the run on the clock (``clocked`` over every iteration), on this machine."""
    solves = clocked.instances * math.log2(2 * max(1, clocked.simulated))
    return (clocked.events * SECONDS_PER_EVENT + solves * SECONDS_PER_SOLVE +
            clocked.flow_events * SECONDS_PER_FLOW_EVENT) * machine_factor()


@dataclass(frozen=True)
class Estimate:
    """What ``--estimate`` predicts of a run (one scenario, or a mix of jobs)."""

    gpus: int
    simulated: int
    ops: int  # ops run over every iteration
    compute: int  # compute ops per iteration (a mix: 0)
    events: int
    build_s: float  # the workload built here, timed
    prepare_s: float  # the engine prepared here, timed (a mix: placing and preparing its runs, modelled)
    wall_s: float
    notes: tuple[str, ...]
    shared_ops: int = 0  # a mix: ops of its shared run
    memory_bytes: float = 0.0  # a mix: peak memory (modelled)


def count(scenario: Scenario, out: bool = False) -> Estimate:
    """The run's size and wall time: its workload built and its engine prepared as the run does
    both (``emulator.run.simulation``), its events counted op by op on the engine's own choice of
    what runs on the clock (``events_of``); nothing is run. ``out``: the run records every link's
    load (``emulator run --out``), which runs nothing ahead of the clock. The build and the
    preparation are timed in this thread's CPU seconds: the run's on a machine it has to itself."""
    if scenario.jobs:
        return count_jobs(scenario)
    from emulator.program import FoldRefused
    from emulator.run.folding import choose_fold, restamp
    from emulator.run.simulation import build_workload

    t0 = time.thread_time()
    program, notes = build_workload(scenario, blocks=True)  # as the run builds it (timed so)
    build_s = time.thread_time() - t0
    runs = 1
    try:
        prepared = _prepared(scenario, program)
    except FoldRefused as exc:  # the run's own refusal (a copy's transfer with other latencies)
        refused = str(exc)
        notes = [f"{choose_fold(scenario, in_effect=False)[1]}; replicas across leaves not folded: {refused}"]
        if scenario.simulation.fold_tolerance > 0:  # run twice, at the least and greatest latencies
            prepared, runs = _prepared(scenario, program, "least"), 2
            notes = [notes[0] + f"; twice within simulation.fold_tolerance {scenario.simulation.fold_tolerance:g}, "
                     "else once more unfolded"]
        else:
            stamped = restamp(program, scenario)  # every replica simulated, from the same ops
            if stamped is None:  # built again, folding the automorphisms only
                t1 = time.thread_time()
                program, _ = build_workload(scenario, refused=refused, blocks=True)
                build_s += time.thread_time() - t1
            else:
                program = stamped
            prepared = _prepared(scenario, program)
    engine, collectives, faulted, prepare_s = prepared
    iterations = max(1, scenario.simulation.iterations) // program.iterations  # drawn steps: built in already
    clocked = events_of(engine, collectives, faulted, on_clock=faulted or out)
    events = int(round(clocked.events * iterations * runs))
    wall = STARTUP_S * machine_factor() + build_s + prepare_s * runs + run_seconds(clocked) * iterations * runs
    copies = engine.copies.count
    ops = sum(len(op.parts) or 1 for op in engine.tops)
    compute = sum(len(op.parts) or 1 for op in engine.tops if op.kind is COMPUTE and not op.parts) + \
        sum(1 for op in engine.tops for p in op.parts if p.kind is COMPUTE)
    return Estimate(program.ranks, len(engine.simulated), ops * copies * iterations * runs, compute * copies,
                    events, build_s, prepare_s * runs, wall, tuple(notes))


def _prepared(scenario: Scenario, program: Program,
              spread: str = "refuse") -> tuple[Engine, CollectiveModel, bool, float]:
    """(engine, collective model, whether timed faults run, seconds) of the run's preparation: the
    cluster and the engine as ``run_program`` makes them (the run's plans prepared, its private
    collectives and block ops decided), not run. Raises FoldRefused as the run does."""
    from emulator.errors import EmulatorError
    from emulator.network.routing import NoRouteError
    from emulator.run.engine import Engine
    from emulator.run.simulation import build_cluster

    t0 = time.thread_time()
    was = gc.isenabled()
    gc.disable()  # as the run prepares it (``simulation._collector_paused``): no collection walks the new objects
    try:
        cluster = build_cluster(scenario, program.fold, spread)
        engine = Engine(program, cluster.collectives, cluster.topology.capacity,
                        cluster.gpus(program.simulated_ranks()), blocks=not cluster.timed)
    except NoRouteError as exc:
        raise EmulatorError(f"{scenario.path or scenario.name}: {exc} (failed links leave no path)") from None
    finally:
        if was:
            gc.enable()
    return engine, cluster.collectives, bool(cluster.timed), time.thread_time() - t0


@dataclass(frozen=True)
class Clocked:
    """What one iteration puts on the clock (``events_of``), by what it costs (``event_seconds``)."""

    events: float
    flow_events: float  # Σ events × flows of their phase, of phases of several flows (each end: a solve of them)
    instances: float  # communication instances on the clock (a max-min solve of the fabric each)
    simulated: int  # ranks simulated


def events_of(engine: Engine, collectives: CollectiveModel, faulted: bool, on_clock: bool = False) -> Clocked:
    """The events of one iteration of a prepared engine (``emulator.run.engine``), op by op:

    - a *timed* op costs none: a compute op on a GPU it has alone, a private collective, a
      block op (a layer's kernels and private collectives); with timed faults no collective is
      private (``Engine.run``);
    - a compute op on a shared GPU (several compute streams, or a GPU whose compute slows while
      it communicates) is on the clock: its start, put off to its time, and its end;
    - a collective call, or a send, is one *instance* shared by its group's simulated members:
      its start (one timeout for every op due at that time: the copies of an unfolded program start
      together, so one start for all of them; none for a collective of one simulated member and one
      flow, handed to the fabric ahead of its time, ``Engine._issue``), then per phase of its flow plan
      (``CollectiveModel.plans``; the mean over the algorithms ``auto`` may pick) a flow alone
      its end (started ahead of its latency: ``Fabric._ahead``), or several flows a latency timer
      and an end each;
    - a MoE token dispatch (``is_token_exchange``: a plain all_to_all too), of one phase or several
      (HybridEP's), and a layer's collective of one simulated member (``runs_ahead``: a CP all-gather over
      nodes folded whole), runs ahead of the clock where its links are free as it starts, one event for its
      end (``Fabric._run_ahead``), else flow by flow: on the clock where its rank has another
      collective in flight as it is issued (``_met``).

    With ``on_clock`` (timed faults, which rewrite routes mid-run, or listeners of every load change:
    ``--out``) nothing runs ahead: a flow alone has its latency timer too, a dispatch runs flow by flow.
    """
    from emulator.program import RECV, runs_ahead

    copies = engine.copies.count
    simulated = engine.simulated
    # one start for the copies of an unfolded program (alike but for stragglers); the replicas of a
    # refused fold (``folding.restamp``: other latencies) start apart
    starts = float(copies) if engine.fold is not None else 1.0
    per_key: dict[tuple[str, tuple[int, ...], int, bool, bool], tuple[float, float, bool]] = {}
    met = set() if on_clock else _met(engine)
    events = flow_events = instances = 0.0
    for t, op in enumerate(engine.tops):
        if engine.timed[t] or (engine.private[t] and not faulted) or op.kind is RECV:
            continue
        if op.kind is COMPUTE:
            events += EVENTS_PER_SHARED_KERNEL * copies
            continue
        key: tuple[str, tuple[int, ...], int]
        if op.kind is SEND:
            key = ("p2p", (op.rank, op.peer), op.rank)
            members = 1
        else:
            key = (op.collective, op.group, op.root)
            members = max(1, sum(1 for r in op.group if r in simulated))
        may_ahead = op.kind is not SEND and runs_ahead(op.collective, op.stream, members)
        ahead = not on_clock and may_ahead and t not in met
        meets = not may_ahead and t in met  # issued while another collective of its rank holds its links
        hit = per_key.get((*key, ahead, meets))
        if hit is None:
            hit = per_key[(*key, ahead, meets)] = _instance_events(collectives.plans(*key), ahead, on_clock or meets)
        ends, weighted, one_flow = hit
        ends += 1.0 if meets else 0.0  # the other's flows re-rated as it joins them
        early = one_flow and members == 1 and op.kind is not SEND and engine.early[t] and not meets
        events += ((0.0 if early else starts) + ends * copies) / members
        flow_events += weighted / members ** 2 * copies / members
        instances += copies / members
    return Clocked(events, flow_events, instances, len(simulated))


def _met(engine: Engine) -> set[int]:
    """The collectives of ``engine.tops`` that meet another of their rank's on its links: the token exchanges
    (``is_token_exchange``) that its run will likely put on the clock, flow by flow, and the other collectives
    on the fabric issued likewise (a ZeRO-3 parameter all-gather beside a gradient reduce-scatter on NVLink),
    whose lone flows are not rated at once but timed (a latency timer and an end) and re-rate the flows they
    join (one event more: ``events_of``). The token exchanges: those a rank issues while another of its
    collectives on the fabric is in flight
    on another stream (a gradient reduce-scatter bucket, a ZeRO parameter all-gather, a sequence-parallel
    collective), which holds links of the rank's GPU as the dispatch starts (``Fabric._run_ahead`` then
    refuses it) or meets it before its end (``_wake_plan``). A collective is in flight, in program
    order, from its place to that of its first successor on the rank on another stream (the op that waits
    for it); a successor on its own stream (the next bucket) is in flight after it, so it meets only the
    collectives of other streams (counted 2026-12-07: Nemotron-H 56B on 64 H100, 109 of its 110 gradient
    buckets were marked, each waiting on the stream for the one before; 493 events counted, 166 run). An upper
    bound of
    program order on the run's timing (counted 2026-12-06: 88 marked of 90,624 on DeepSeek-V3 1024, 48
    refused in its run; 52 of 208 on DeepSeek-V2-Lite, 33 refused, the last micro-batch's backward under
    the gradient reduce-scatters and the first forward under the parameter all-gathers). A rank's collective that
    its kernels have outlasted, each run alone in program order, no longer counts for its token exchanges
    (DeepSeek-V4-Flash on 128 GB200, whose MXFP8 parameter all-gathers end within the layer they prefetch for)."""
    from emulator.program import is_token_exchange

    tops, succ = engine.tops, engine.succ
    moe = {op.rank for op in tops if op.kind is COLLECTIVE and is_token_exchange(op.collective)}
    # rank → stream → the place up to which one of the rank's collectives on that stream is in flight; a
    # collective meets those of other streams only: its own stream's run before it (the buckets one by one)
    until: dict[int, dict[str, int]] = {}
    queued: dict[int, dict[str, int]] = {}  # the same for a collective nothing on another stream waits for
    # a rank with token exchanges: its compute seconds so far in program order (its kernels, and its exchanges,
    # which its layers wait for), and per stream the time its collectives there end, each run alone after the one
    # before; an exchange meets a collective still in flight in program order and in time (``_alone_s``)
    clock: dict[int, float] = {}
    busy: dict[int, dict[str, float]] = {}
    met: set[int] = set()
    for t, op in enumerate(tops):
        rank = op.rank
        if op.kind is COMPUTE and rank in moe:
            clock[rank] = clock.get(rank, 0.0) + _compute_s(op)
        if op.kind is not COLLECTIVE:
            continue
        mine = until.setdefault(rank, {})
        now = clock.get(rank, 0.0)
        if is_token_exchange(op.collective):
            ends = busy.get(rank, {})
            flying = {**queued.get(rank, {}), **mine}
            if any(u > t and ends.get(s, now) > now for s, u in flying.items() if s != op.stream):
                met.add(t)
            clock[rank] = now + _alone_s(engine, op)
            continue
        if engine.private[t] or engine.timed[t]:
            continue
        if any(u > t for s, u in mine.items() if s != op.stream):
            met.add(t)
        waits = [s for s in succ[t] if tops[s].rank == rank and tops[s].stream != op.stream]
        if waits:
            mine[op.stream] = max(mine.get(op.stream, -1), min(waits))
        elif rank in moe:  # nothing on another stream waits (a ZeRO-3 reduce-scatter but the step's last): for the
            # token exchanges, in flight until the next op on its stream
            waits = [s for s in succ[t] if tops[s].rank == rank]
            if waits:
                queued.setdefault(rank, {})[op.stream] = min(waits)
        if waits and rank in moe:
            on = busy.setdefault(rank, {})
            on[op.stream] = max(now, on.get(op.stream, 0.0)) + _alone_s(engine, op)
    return met


def _compute_s(op: Op) -> float:
    """A compute op's seconds as costed (a block op's: its kernels')."""
    if op.duration is not None:
        return op.duration
    return sum(p.duration or 0.0 for p in op.parts if p.kind is COMPUTE)


def _alone_s(engine: Engine, op: Op) -> float:
    """Collective ``op``'s seconds run alone on the idle fabric (the engine's cached runs)."""
    return engine.runs.alone_run(op.collective, op.group, op.root, op.bytes).duration


def _instance_events(plans: list[Plan], ahead: bool, on_clock: bool = False) -> tuple[float, float, bool]:
    """(events after its start, the same weighted by f² where f is the flows of their phase: see
    ``events_of`` for the members, whether each plan is one flow) of one collective or transfer instance
    on the clock (``events_of``); ``ahead``: a plan run ahead of the clock (``runs_ahead``), one event for its end
    where a plan has a phase of several flows."""
    if not plans:
        return 0.0, 0.0, False
    alone = 2.0 if on_clock else 1.0
    ends = weighted = 0.0
    for plan in plans:
        e = sum(alone if len(phase) == 1 else 2.0 * len(phase) for phase in plan)
        w = sum(2.0 * len(phase) ** 3 for phase in plan if len(phase) > 1)
        if ahead and any(len(phase) > 1 for phase in plan):  # its end alone
            e, w = 1.0, 0.0
        ends += e
        weighted += w
    one_flow = all(len(plan) == 1 and len(plan[0]) == 1 for plan in plans)
    return ends / len(plans), weighted / len(plans), one_flow


def estimate(scenario: Scenario, out: bool = False) -> str:
    """A few lines: ops, simulated ranks, expected events and wall time (``out``: of a run with --out)."""
    from emulator.scenario.units import format_time

    if scenario.jobs:
        return estimate_jobs(scenario)
    e = count(scenario, out)
    lines = [f"scenario        {printable(scenario.name)}",
             f"GPUs            {e.gpus} ({e.simulated} simulated)",
             f"ops             {e.ops:,} ({e.compute:,} compute per iteration)",
             f"events          ~{e.events:,}",
             f"wall time       ~{format_time(e.wall_s)} (build {format_time(e.build_s)}, prepare "
             f"{format_time(e.prepare_s)}, start {format_time(STARTUP_S * machine_factor())}, run "
             f"{format_time(e.wall_s - e.build_s - e.prepare_s - STARTUP_S * machine_factor())})"]
    closed = closed_form(scenario)
    if closed is not None:
        lines.append(f"iteration       ~{format_time(closed)} (closed form, no contention: studies/rank.py)")
    return "\n".join(lines + [f"note: {n}" for n in e.notes])


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
            # a direct all-to-all: a flow to each peer from each simulated member, a latency timer and an end each
            per = 2.0 * members * (n - 1) + 1 if op.collective == "all_to_all" else \
                EVENTS_PER_SOLO if members == 1 else EVENTS_PER_COMM
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


def count_jobs(scenario: Scenario) -> Estimate:
    """``count`` of a scenario with jobs: each job's program under the fold the mix gives it
    (``emulator.run.mix.job_fold``), counted once alone and once in the shared run (one run for a single
    job at t = 0 on nodes 0..n−1), summed. Its engines are not prepared here (one per placement and
    run): each communication instance is ~2 events, ~1.5 where one member of its group is simulated
    (``_counts``: private groups guessed from the nodes), a solve each, priced as ``run_seconds`` prices
    them, and the preparation is modelled. On a mix, the start and the preparation dominate
    (benchmarks/estimate_check.py: 0.3 s runs)."""
    from emulator.run.mix import job_fold
    from emulator.run.simulation import build_workload
    from emulator.workload.builder import build_program
    from emulator.workload.jobs import gpu_map, job_scenario

    node = scenario.cluster.node
    assert node is not None  # the loader requires a node for jobs
    iterations = max(1, scenario.simulation.iterations)
    one = len(scenario.jobs) == 1 and scenario.jobs[0].start == 0
    t0 = time.thread_time()
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
            repeats = iterations // program.iterations  # drawn MoE steps are built in already
            built[key] = (len(ops) * copies * repeats, EVENTS_PER_COMM * comm * repeats,
                          float(len(program.simulated_ranks())), program.ranks)
        n_ops, n_events, simulated, _world = built[key]
        runs = 1 if one else 2
        ops_run += n_ops * runs
        events += n_events * runs
        shared_ops += n_ops
        ranks += int(simulated)
    build_s = time.thread_time() - t0
    prepare_s = (ops_run * SECONDS_PER_MIX_OP + (1 if one else 1 + len(scenario.jobs)) *
                 scenario.cluster.nodes * node.gpus_per_node * SECONDS_PER_RUN_GPU) * machine_factor()
    clocked = Clocked(events, 0.0, events / EVENTS_PER_COMM, ranks)  # a solve an instance
    wall = STARTUP_S * machine_factor() + build_s + prepare_s + run_seconds(clocked)
    gpus = sum(len(j.nodes_assigned) for j in scenario.jobs) * node.gpus_per_node
    return Estimate(gpus, ranks, int(ops_run), 0, int(events), build_s, prepare_s, wall, (),
                    shared_ops=int(shared_ops), memory_bytes=BASE_BYTES + shared_ops * BYTES_PER_MIX_OP)


def estimate_jobs(scenario: Scenario) -> str:
    """``estimate`` of a scenario with jobs (``count_jobs``)."""
    from emulator.scenario.units import format_time

    e = count_jobs(scenario)
    return "\n".join([
        f"scenario        {printable(scenario.name)}",
        f"jobs            {len(scenario.jobs)} on {e.gpus} GPUs ({e.simulated} simulated, each job folded as the mix "
        "folds it alone; the shared run may fold a job less)",
        f"ops             {e.ops:,} run ({e.shared_ops:,} in the shared run)",
        f"events          ~{e.events:,}",
        f"memory          ~{e.memory_bytes / 1e9:.2f} GB (peak, about {BYTES_PER_MIX_OP:.0f} B per op of the shared "
        "run)",
        f"wall time       ~{format_time(e.wall_s)} (build {format_time(e.build_s)}, placing and preparing "
        f"{format_time(e.prepare_s)}, start {format_time(STARTUP_S * machine_factor())})"])


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
# A pre-estimate from the scenario's keys alone, without building the workload or preparing the engine
# (seconds on an unfolded layout), with the costs of ``run_seconds`` on the reference machine (no floor
# timed: every run asks). Per simulated rank, per layer it holds, per microbatch, per iteration, fitted
# on that scenario unfolded (`emulator run scenarios/gpt3-175b-1024-a100.yaml --estimate --set
# "cluster.overrides=[{kind: gpu_slowdown, target: 'gpu:3', factor: 2}]"`, 2026-12-06: 1,650,577 events,
# 1,650,576 communication instances, 21,702,144 ops, a build of 0.77 s and a preparation of 1.70 s, for
# 1,024 ranks × 96 microbatches × 12 layers = 1,179,648 rank-layer-microbatches; the run: 1,891,186 events).
# Dense layers only: a MoE layer's dispatches cost more (``events_of``), which only --estimate counts.
EVENTS_PER_RANK_LAYER_MB = 1.4  # 1,650,577 / 1,179,648
INSTANCES_PER_RANK_LAYER_MB = 1.4  # 1,650,576 / 1,179,648
BUILD_S_PER_RANK_LAYER_MB = 2.1e-6  # (0.77 + 1.70) s / 1,179,648
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
    solves = INSTANCES_PER_RANK_LAYER_MB * units * math.log2(2 * simulated)
    wall = STARTUP_S + BUILD_S_PER_RANK_LAYER_MB * units + events * SECONDS_PER_EVENT + solves * SECONDS_PER_SOLVE
    out_bytes = OUT_BYTES_PER_OP * OPS_PER_RANK_LAYER_MB * units
    return PreEstimate(ranks, simulated, events, wall, out_bytes, note)


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
        what.append(f"~{pre.events:,.0f} events, ~{format_time(pre.wall_s)}")
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
