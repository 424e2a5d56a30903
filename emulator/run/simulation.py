"""Simulation: Scenario → (Program, Topology) → Engine → Result.

This is the one place that wires the pieces together (DESIGN.md, "Data flows one
way"): the workload front end (builder or trace importer) makes the Program,
the topology builder makes the network, the engine runs them, and the Result
holds the spans and facts that every report reads.

A multi-job scenario (``jobs:``) runs every job's Program on its own nodes in one engine
over the shared fabric, and each job again alone on the same nodes, so each job's slowdown
is measured in the same command (``JobRun``; ``emulator.run.mix``).

An unfolded model run (every rank simulated) is a ``Stamped`` program: the
representatives' ops plus the translations that copy them, which the engine runs
without materialising 21M ops at 1024 GPUs; its spans are a ``SpanTable`` that
makes Span tuples on access.
"""
from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Collection, Iterable, Iterator, Sequence

from emulator.devices.gpu import Gpu
from emulator.errors import EmulatorError
from emulator.network.collectives import ALLTOALL_PEER_S, CollectiveModel
from emulator.network.placed import PlacedRouter, placed_node_of
from emulator.network.raw_plan import StepCosts
from emulator.network.routing import NoRouteError, Router
from emulator.network.topology import Topology, build_topology
from emulator.network.tuning import hardware
from emulator.program import Fold, FoldRefused, Program
from emulator.result import Result
from emulator.run.engine import DeadlockError, Engine
from emulator.run.faults import FaultSchedule, TimedFault, applied_overrides, apply_faults, timed_faults
from emulator.run.mix import Runner, simulate_jobs
from emulator.scenario.spec import GpuSpec, Scenario

Progress = Callable[[float, int], None]


def build_workload(scenario: Scenario, refused: str = "", blocks: bool = False) -> tuple[Program, list[str]]:
    """The Program of a scenario (model workload or trace), and notes about it (``refused``: why a
    fold checked in effect was refused; the program then folds automorphisms only). With
    ``blocks``, a folded program's units are block ops where they can be (``Op.parts``: for the
    engine, which runs them as one op or opens them; every other reader wants ops)."""
    if scenario.workload.trace:
        from emulator.importers import load_workload

        return load_workload(scenario), ["folding off: trace workloads are simulated rank by rank"]
    from emulator.run.folding import choose_fold, program_fold, unfold
    from emulator.workload.builder import build_program

    fold, note = choose_fold(scenario, in_effect=not refused)
    if refused:  # the symmetries that are automorphisms still hold
        note = _refused_note(note, refused)
    pr = scenario.workload.profiled
    if scenario.workload.profile is not None and (pr is None or not pr.peak_memory):
        note += ("; memory of a profiled workload: the model-shape estimate (a kernel profile does not record "
                 "the script's own allocations; give workload.profiled.peak_memory to scale the measured peak)")
    notes = [note, *_overlap_notes(scenario), *_layer_wise_notes(scenario)]
    if scenario.parallel.one_queue():
        notes.append("one hardware queue a GPU (parallel.cuda_device_max_connections: 1): an op waiting for its "
                     "stream or a dep holds back every op issued after it")
    with _collector_paused():
        if fold is None:  # simulate every rank; build the representatives once and stamp the copies
            pfold = program_fold(scenario)
            if pfold is not None:
                return unfold(build_program(scenario, pfold), pfold), notes
        return build_program(scenario, fold, blocks=blocks and fold is not None), notes


def _overlap_notes(scenario: Scenario) -> list[str]:
    """Why ``parallel.tp_comm_overlap`` changes nothing in the steps, where it does not (workload/layer.py,
    "Userbuffers")."""
    from emulator.workload.models import is_mla, resolve

    par = scenario.parallel
    if not par.tp_comm_overlap or scenario.model is None:
        return []
    if par.tp == 1:
        return ["parallel.tp_comm_overlap: no effect at tp 1 (no TP communication to overlap)"]
    if is_mla(resolve(scenario.model)):
        return ["parallel.tp_comm_overlap: no overlap in the steps (Megatron-Core's TELinear turns it off for the "
                "whole model when it builds MLA's down-projections); its Userbuffers are still allocated"]
    return []


def _layer_wise_notes(scenario: Scenario) -> list[str]:
    """Under Megatron-Core's layer-wise optimizer (workload/layer_wise.py), how uneven the deal of whole parameters
    is: the pipeline rank whose heaviest data-parallel rank runs the most Newton–Schulz work, against its mean share."""
    from emulator.scenario.units import format_time
    from emulator.workload import models as M
    from emulator.workload import muon as MU
    from emulator.workload.memory import expert_dp, held_stages, muon_chunks

    tr, par, node = scenario.training, scenario.parallel, scenario.cluster.node
    if scenario.model is None or node is None or not (MU.is_muon(tr) and MU.layer_wise(tr, par)):
        return []
    from emulator.workload.plan import grad_reduce_bytes

    m, d, d_exp = M.resolve(scenario.model), par.dp * par.cp, expert_dp(par)
    bucket = MU.layout_bucket(par, grad_reduce_bytes(tr.precision, tr.grad_reduce))
    heavy, mean, r = max((MU.rank_ns(c, tr, par, node.gpu, d, d_exp, bucket).seconds,
                          MU.mean_ns_seconds(c, tr, par, node.gpu, d, d_exp), r)
                         for r, c in ((r, muon_chunks(scenario, m, held_stages(par, r))) for r in range(par.pp)))
    if not mean:
        return []
    return [f"training.optimizer {tr.optimizer}: Megatron-Core's layer-wise optimizer deals whole parameters; the "
            f"heaviest rank of pipeline rank {r} runs {format_time(heavy)} of Newton-Schulz a step, the mean share "
            f"{format_time(mean)} ({heavy / mean:.2f}x)"]


def _refused_note(note: str, refused: str) -> str:
    return f"{note}; replicas across leaves not folded: {refused}"


# how many gen-1 collections make a full one while the engine runs (Python's default: 10)
RUN_FULL_COLLECTION_EVERY = 1000


@contextmanager
def _full_collections_rare() -> Iterator[None]:
    """Full collections 100 times rarer while the engine runs; the young generations are collected as
    before. A run keeps what it records (spans, link loads: 10⁶-10⁷ tuples with ``--out``), and each
    full collection walks all of it again: a third of DeepSeek-V3's run at global batch 1024 with
    ``--out`` (48.0 -> 33.6 s of CPU, the same peak memory; the run's garbage cycles are young ones)."""
    g0, g1, g2 = gc.get_threshold()
    gc.set_threshold(g0, g1, RUN_FULL_COLLECTION_EVERY)
    try:
        yield
    finally:
        gc.set_threshold(g0, g1, g2)


@contextmanager
def _collector_paused(set_aside: bool = False) -> Iterator[None]:
    """Python's cyclic garbage collector off while a program, a cluster or an engine is built;
    with ``set_aside``, what exists when it ends is set aside (``gc.freeze``) until the run ends
    (``run_program`` gives it back, ``gc.unfreeze``).

    Building allocates 10⁵-10⁶ long-lived objects (ops and their tuples, links, routes, the
    engine's lists) and no garbage cycles. With the collector on, each time the youngest
    generation filled it walked them again, every op built so far at each full collection (a
    third of the GPT-3 1024-GPU build, half of its engine preparation, 0.8 s of the Llama-3 16k
    run); re-enabled over them it walks them all once more, unless they are set aside. Set
    aside, they are never walked: reference counting still frees them as usual, and the run's
    own garbage is collected as before. A build outside ``simulate`` (``--estimate``, export)
    only pauses the collector."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
        if set_aside:  # not after an error: nothing may follow that gives it back
            gc.freeze()
    finally:
        if was:
            gc.enable()


def step_costs(scenario: Scenario) -> StepCosts:
    node = scenario.cluster.node
    if scenario.cluster.fabric.kind == "custom" or node is None:
        return StepCosts()
    nvls = node.intra_bandwidth * node.intra_efficiency / node.nvls_busbw if node.nvls_busbw else 0.0
    return StepCosts(node.collective_launch, node.step_latency_intra, node.step_latency_inter, nvls, ALLTOALL_PEER_S)


def simulate(scenario: Scenario, progress: Progress | None = None, record_links: bool = True) -> Result:
    """Build and run a scenario."""
    if scenario.jobs:
        runner = Runner(run_program, build_workload, _collector_paused)
        result: Result = simulate_jobs(scenario, runner, progress=progress, record_links=record_links)
        return result
    with _collector_paused(set_aside=True):  # until run_program ends
        program, notes = build_workload(scenario, blocks=True)
    try:
        return run_program(program, scenario, progress=progress, record_links=record_links, notes=notes)
    except FoldRefused as exc:  # a fold in effect whose copies are not all alike
        refused = str(exc)  # (handled outside this block, so that the traceback's engine is freed first)
    if scenario.simulation.fold_tolerance > 0:
        bounded = _bounded(program, scenario, progress, record_links, notes, refused)
        if bounded is not None:
            return bounded
    from emulator.run.folding import choose_fold, restamp

    stamped = restamp(program, scenario)
    if stamped is not None:  # the same ops, every replica simulated: no second build
        stamped.checked = True  # its template is the program the refused run validated
        notes = [_refused_note(choose_fold(scenario, in_effect=False)[1], refused)]
        return run_program(stamped, scenario, progress=progress, record_links=record_links, notes=notes)
    del program
    with _collector_paused(set_aside=True):  # automorphisms only
        program, notes = build_workload(scenario, refused=refused, blocks=True)
    return run_program(program, scenario, progress=progress, record_links=record_links, notes=notes)


def _bounded(program: Program, scenario: Scenario, progress: Progress | None, record_links: bool,
             notes: list[str], refused: str) -> Result | None:
    """A fold in effect whose copies' transfers have other latencies, run twice: each transfer at the
    least and at the greatest latency of its copies. Where the two iteration times agree to
    ``simulation.fold_tolerance``, the second is the result, with both as its bounds
    (``Result.fold_bounds_s``); else None (the fold is refused).

    Every copy's latencies lie between the two, so the unfolded run does too where the iteration time
    grows with each latency: the folded replicas sit on a non-blocking fabric (``emulator.run.folding``:
    no leaf–spine link is a flow's only bottleneck), where a latency moves a transfer, not the
    share of bandwidth it gets. Checked against ``fold: off`` (tests/test_folding_effect.py)."""
    least = run_program(program, scenario, progress=progress, record_links=False, notes=notes, spread="least")
    most = run_program(program, scenario, progress=progress, record_links=record_links, notes=notes,
                       spread="greatest")
    lo, hi = least.iteration_time_s, most.iteration_time_s
    if not lo <= hi <= lo * (1.0 + scenario.simulation.fold_tolerance):
        return None
    note = most.notes[0].replace("every copy checked to have the same latencies", "copies with other latencies "
                                 "bounded")
    most.notes[0] = (f"{note}; {refused}: the iteration time lies between {lo:.9g} s (each transfer at the least "
                     f"latency of its copies) and {hi:.9g} s (the greatest, reported), within "
                     f"simulation.fold_tolerance {scenario.simulation.fold_tolerance:g}")
    most.fold_bounds_s = (lo, hi)
    return most


@dataclass
class Cluster:
    """A scenario's cluster, built once: topology (with faults applied), per-rank GPU
    slowdowns, and the collective model on its routes. ``run_program``, the nccl-tests
    style ``collective`` command and the live backend all run engines on it."""

    topology: Topology
    slowdown: dict[int, float]
    collectives: CollectiveModel
    gpu_spec: GpuSpec | None
    timed: list[TimedFault] = field(default_factory=list)  # link faults in the middle of the run

    def gpus(self, ranks: Iterable[int]) -> dict[int, Gpu]:
        return {r: Gpu(r, self.gpu_spec, self.slowdown.get(r, 1.0)) for r in ranks}


def build_cluster(scenario: Scenario, fold: Fold | None = None, spread: str = "refuse",
                  gpu_of: Sequence[int] | None = None) -> Cluster:
    """The topology, faults and collective model of ``scenario`` (``fold``: the program's symmetry;
    ``spread``: what a fold in effect does with copies of other latencies, ``CollectiveModel``;
    ``gpu_of``: the program's rank r runs on cluster GPU ``gpu_of[r]``, ``emulator.network.placed``)."""
    topo = build_topology(scenario.cluster)
    try:
        slowdown = apply_faults(topo, scenario.cluster.overrides)
        timed = timed_faults(topo, scenario.cluster.overrides)
    except EmulatorError as exc:
        raise EmulatorError(f"{scenario.path or scenario.name}: {exc}") from None
    router: Router | PlacedRouter = Router(topo)
    node_of: Callable[[int], int] = topo.node_of
    if gpu_of is not None:  # a job on its GPUs: ranks seen as their GPUs
        router, node_of = PlacedRouter(Router(topo), gpu_of), placed_node_of(topo, gpu_of)
        slowdown = {r: slowdown[g] for r, g in enumerate(gpu_of) if g in slowdown}
    model = CollectiveModel(router, node_of, step_costs(scenario), scenario.collectives.algorithm,  # type: ignore[arg-type]
                            fold, hardware(scenario.cluster), spread)
    return Cluster(topo, slowdown, model, scenario.cluster.node.gpu if scenario.cluster.node else None, timed)


def run_program(program: Program, scenario: Scenario, progress: Progress | None = None,
                record_links: bool = True, notes: list[str] | None = None, repeat: bool = True,
                spread: str = "refuse", gpu_of: Sequence[int] | None = None,
                queued: Collection[int] | None = None) -> Result:
    """Run a Program on the scenario's cluster (``repeat``: run simulation.iterations copies
    of it back to back; False: the program already holds them; ``spread``, ``gpu_of``: ``build_cluster``;
    ``queued``: the ranks whose GPU has one hardware queue, None: every rank where the scenario sets
    ``parallel.cuda_device_max_connections`` 1, for a model workload)."""
    t0 = time.perf_counter()
    if queued is None:
        queued = range(program.ranks) if scenario.parallel.one_queue() and not scenario.workload.trace else ()
    try:
        return _run_program(program, scenario, progress, record_links, notes, repeat, t0, spread, gpu_of, queued)
    finally:
        gc.unfreeze()  # what the build and the preparation set aside is the collector's again


def _run_program(program: Program, scenario: Scenario, progress: Progress | None, record_links: bool,
                 notes: list[str] | None, repeat: bool, t0: float, spread: str = "refuse",
                 gpu_of: Sequence[int] | None = None, queued: Collection[int] = ()) -> Result:
    with _collector_paused(set_aside=True):
        try:
            program.validate()
        except ValueError as exc:
            raise EmulatorError(f"{scenario.path or scenario.name}: invalid workload: {exc}") from None
        cluster = build_cluster(scenario, program.fold, spread, gpu_of)
        topo, model = cluster.topology, cluster.collectives
        if program.ranks > (len(topo.gpus) if gpu_of is None else len(gpu_of)):
            raise EmulatorError(f"{scenario.path or scenario.name}: the workload has {program.ranks} ranks but the "
                                f"cluster has only {len(topo.gpus)} GPUs")
        iterations = max(1, scenario.simulation.iterations)
        if iterations > 1 and repeat:
            program = program.repeated(iterations)
        gpus = cluster.gpus(program.simulated_ranks())
    series: dict[int, list[tuple[float, float]]] = {}

    def record(now: float, loads: dict[int, float]) -> None:
        for link, load in loads.items():
            s = series.setdefault(link, [])
            if s and s[-1][0] == now:
                s[-1] = (now, load)
            elif not s or s[-1][1] != load:
                s.append((now, load))

    try:  # routes are worked out while the engine prepares its plans, and while it runs
        with _collector_paused(set_aside=True):
            engine = Engine(program, model, topo.capacity, gpus, progress, blocks=not cluster.timed, queued=queued)
            if record_links:
                engine.fabric.listeners.append(record)
            schedule = FaultSchedule(engine.env, engine.fabric, topo, cluster.timed, model.link_alias)
            schedule.start()
        with _full_collections_rare():
            spans, events = engine.run()
    except NoRouteError as exc:
        raise EmulatorError(f"{scenario.path or scenario.name}: {exc} (failed links leave no path)") from None
    except DeadlockError as exc:
        stuck = [f for f in schedule.records if f.stalled and f.until_s is None]
        if stuck:  # a timed failure with no way round and no recovery: say so first
            raise DeadlockError(f"{scenario.path or scenario.name}: {stuck[0].label} at {stuck[0].at_s:g} s stalled "
                                f"{stuck[0].stalled} flows with no way round and never recovers (give it until:); "
                                f"{exc}") from None
        raise
    makespan = max(engine.end, default=0.0)  # = max span end, without making the spans
    alias = {} if cluster.timed else model.link_alias  # timed faults ran every flow on all its links
    return Result(scenario, program, topo, spans, makespan / iterations, events, time.perf_counter() - t0,
                  list(notes or []), *_alias_traffic(alias, series, engine.fabric.bytes_on_link),
                  faults=schedule.records, overrides=applied_overrides(topo, scenario.cluster.overrides))


def _alias_traffic(alias: dict[int, int], series: dict[int, list], link_bytes: list[float]) -> tuple[dict, list]:
    """Give each link that compression dropped the traffic of the link kept in its place."""
    link_bytes = list(link_bytes)
    for link, kept in alias.items():
        if link != kept:
            link_bytes[link] = link_bytes[kept]
            if kept in series:
                series[link] = series[kept]
    return series, link_bytes
