"""Mix: several jobs on one cluster's fabric (``jobs:``), each also alone on its nodes (issue 29).

Each job alone runs its own Program on its GPUs: through a rank map (``emulator.network.placed``)
with its single-job fold where its nodes embed like a cluster of its own size
(``workload.jobs.embeds_alike``), else renumbered to its GPUs (``workload.jobs.place``) with its
tensor-parallel peers folded. Together, every job's ops are renumbered to its GPUs and merged, each
job folded by its own fold where its copies load the other jobs' links alike
(``folding.JobsFold``), less where not. A job that meets no other on its links while it runs
reports its alone time (``_isolated``).
"""
from __future__ import annotations

import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from emulator.errors import EmulatorError
from emulator.program import Fold, FoldRefused, Program
from emulator.result import JobRun, Result
from emulator.scenario.spec import JobSpec, Scenario
from emulator.spans import Span, SpanTable

JOBS_NOTE = ("folding off: no job's fold holds on the shared fabric (traces, faults, or placements that "
             "no symmetry maps onto themselves), so each job is simulated rank by rank")


Progress = Callable[[float, int], None]


@dataclass(frozen=True)
class Runner:
    """What a mix needs from ``emulator.run.simulation`` (the layer above, which calls it): run a Program
    on the scenario's cluster (``run_program``), build a scenario's workload (``build_workload``), and
    pause the garbage collector while a program is built (``_collector_paused``)."""

    run: Callable[..., Result]
    build: Callable[..., tuple[Program, list[str]]]
    paused: Callable[..., AbstractContextManager[None]]


def simulate_jobs(scenario: Scenario, runner: Runner, progress: Progress | None = None,
                  record_links: bool = True) -> Result:
    """Run every job of ``scenario`` together on the shared fabric, and each alone on the same nodes.

    A job's iteration time is (its last op's end − its start) / iterations; its slowdown is that
    over the same job's alone time. Its link bytes come from the alone run: routes do not depend
    on timing, so a job moves the same bytes over the same links shared or alone.

    Alone, a job runs its own Program on its GPUs (``emulator.network.placed``), folded where its
    nodes embed like a cluster of its own size (``jobs.embeds_alike``): its single-job run, folded.
    A single job at t = 0 on nodes 0..n−1 has nothing to share the fabric with: that run is the
    result. A job whose links no other job uses while it runs (``_isolated``) ran exactly as alone:
    its shared time is its alone time.
    """
    from emulator.workload.jobs import gpu_map

    t0 = time.perf_counter()
    node = scenario.cluster.node
    assert node is not None  # the loader requires a node for jobs
    placer = _Placer(scenario, runner)
    iterations = max(1, scenario.simulation.iterations)
    job0 = scenario.jobs[0]
    if len(scenario.jobs) == 1 and job0.start == 0 and job0.nodes_assigned == tuple(
            range(len(job0.nodes_assigned))):
        result, own = _alone(scenario, 0, placer)  # ranks = the cluster's first GPUs: spans in cluster numbering
        result.scenario = scenario
        runs = [JobRun(job0, gpu_map(job0.nodes_assigned, node.gpus_per_node), own, result.iteration_time_s,
                       result.iteration_time_s, [b / iterations for b in result.link_bytes])]
    else:
        alone = []
        for j in range(len(scenario.jobs)):  # kept: its time and link loads (not its spans and network)
            res, own = _alone(scenario, j, placer)
            alone.append((AloneRun(res.iteration_time_s, res.link_bytes, res.events), own))
            del res
        result, runs = _shared(scenario, alone, placer, progress, record_links)
        result.events += sum(a.events for a, _own in alone)  # the command's events: alone runs and shared
    result.jobs = runs
    result.iteration_time_s = max(r.iteration_time_s for r in runs)
    result.wall_s = time.perf_counter() - t0
    return result


def _alone(scenario: Scenario, j: int, placer: "_Placer") -> tuple[Result, Program]:
    """``job`` alone on its GPUs of the cluster, and its Program (for its workload facts).

    Where its nodes embed like a cluster of its own size (``jobs.embeds_alike``), its Program in its own
    numbering runs through a rank map (``emulator.network.placed``) with its single-job fold: its
    single-job run, folded. Elsewhere its ops are renumbered to its GPUs (``jobs.place``) and only its
    tensor-parallel peers fold (a node's interior is symmetric wherever the node is)."""
    from emulator.run.folding import JobsFold, JobsProgram, restamp
    from emulator.workload.jobs import embeds_alike, job_scenario

    job, gpus = scenario.jobs[j], placer.gpus[j]
    iterations = max(1, scenario.simulation.iterations)
    fold = placer.folds[j]
    alike = embeds_alike(scenario.cluster, job.nodes_assigned) and list(gpus) == sorted(gpus)
    while not alike and (fold is not None or list(gpus) != sorted(gpus)):
        ops = placer.placed(j, fold)
        program = ops if fold is None else JobsProgram(ops.ranks, ops.ops, JobsFold([gpus], [fold], [frozenset()]))
        try:
            return placer.runner.run(program, scenario, record_links=False, repeat=False,
                                     queued=gpus if _one_queue(job) else ()), placer.facts[j]
        except FoldRefused:  # a fold in effect whose copies have other latencies
            fold = placer.folds[j] = _less(fold)
    js = job_scenario(scenario, job, fold=scenario.simulation.fold if alike else "off", iterations=iterations)
    key = (job.model, job.training, job.parallel, job.workload, len(gpus), js.simulation.fold)
    if key not in placer.own:  # jobs of one workload (count copies) share its program
        with placer.runner.paused(set_aside=True):
            placer.own[key] = placer.runner.build(js, blocks=True)
    program, notes = placer.own[key]
    if program.ranks > len(gpus):
        raise EmulatorError(f"{scenario.path or scenario.name}: job {job.name!r}: the workload has {program.ranks} "
                            f"ranks but the job has {len(gpus)} GPUs")
    queued = range(len(gpus)) if _one_queue(job) else ()  # in the job's own numbering
    try:
        return placer.runner.run(program, scenario, notes=notes, gpu_of=gpus, queued=queued), program
    except FoldRefused:
        pass
    stamped = restamp(program, js)
    if stamped is not None:
        stamped.checked = True
        return placer.runner.run(stamped, scenario, notes=notes, gpu_of=gpus, queued=queued), program
    off = job_scenario(scenario, job, fold="off", iterations=iterations)
    program, notes = placer.runner.build(off, blocks=True)
    return placer.runner.run(program, scenario, notes=notes, gpu_of=gpus, queued=queued), program


def _one_queue(job: JobSpec) -> bool:
    """Whether a job's GPUs have one hardware queue (its ``parallel.cuda_device_max_connections`` 1)."""
    return job.parallel.one_queue() and not job.workload.trace


@dataclass(frozen=True)
class AloneRun:
    """What the mix keeps of a job's run alone: its iteration time, and its bytes on each link."""

    iteration_time_s: float
    link_bytes: list[float]
    events: int


def _shared(scenario: Scenario, alone: list[tuple[AloneRun, Program]], placer: "_Placer", progress: Progress | None,
            record_links: bool) -> tuple[Result, list[JobRun]]:
    """Every job's ops on its GPUs (``jobs.place``), merged, run on the shared fabric; each job folded
    by its own fold where its copies load the other jobs' links alike (``folding.JobsFold``), else
    by its tensor-parallel axis alone, else rank by rank (tried in that order, job by job: the
    collective model refuses a fold while it prepares the plans, before the run)."""
    iterations = max(1, scenario.simulation.iterations)
    used = [frozenset(i for i, b in enumerate(res.link_bytes) if b > 0) for res, _own in alone]
    others = [frozenset().union(*(u for k, u in enumerate(used) if k != j)) for j in range(len(used))]
    folds = list(placer.folds)
    queued = [g for j, job in enumerate(scenario.jobs) if _one_queue(job) for g in placer.gpus[j]]
    while True:
        program = placer.together(folds, others)
        try:
            result = placer.runner.run(program, scenario, progress=progress, record_links=record_links,
                                       notes=[_jobs_note(scenario, folds)], repeat=False, queued=queued)
            break
        except FoldRefused:
            j = getattr(program.fold, "last", -1)
            if j < 0 or folds[j] is None:
                raise
            folds[j] = _less(folds[j])
        finally:
            del program
    last_end = _last_ends(result.spans)
    runs = []
    for job, g, (res, own) in zip(scenario.jobs, placer.gpus, alone):
        end = max((last_end.get(x, 0.0) for x in g), default=0.0)
        runs.append(JobRun(job, g, own, (end - job.start) / iterations, res.iteration_time_s,
                           [b / iterations for b in res.link_bytes]))
    _isolated(runs, iterations)
    return result, runs


def _last_ends(spans: Sequence[Span]) -> dict[int, float]:
    """Each rank's last span end (from a SpanTable's columns, without making the spans)."""
    if isinstance(spans, SpanTable):
        pairs: Iterable[tuple[int, float]] = zip(spans.ranks(), spans.times()[1])
    else:
        pairs = ((s.rank, s.end_s) for s in spans)
    last: dict[int, float] = {}
    for rank, end in pairs:
        if end > last.get(rank, 0.0):
            last[rank] = end
    return last


class _Placer:
    """Each job's ops on its GPUs (``jobs.place``) under a given fold, made once and kept: a job's alone
    run and the shared run use the same ops (ids disjoint across jobs), and jobs of one workload
    (``count`` copies, a mix of two layouts) are built once per fold."""

    def __init__(self, scenario: Scenario, runner: Runner) -> None:  # noqa: D107
        from emulator.workload.jobs import gpu_map

        node = scenario.cluster.node
        assert node is not None
        self.scenario = scenario
        self.runner = runner
        self.world = scenario.cluster.nodes * node.gpus_per_node
        self.iterations = max(1, scenario.simulation.iterations)
        self.gpus = [gpu_map(job.nodes_assigned, node.gpus_per_node) for job in scenario.jobs]
        self.folds = [job_fold(scenario, job, g) for job, g in zip(scenario.jobs, self.gpus)]
        self.facts: list[Program] = [Program(0, [])] * len(scenario.jobs)  # each job's workload facts
        self._built: dict[tuple[object, ...], Program] = {}
        self.own: dict[tuple[object, ...], tuple[Program, list[str]]] = {}  # alone programs in job numbering
        self._placed: dict[int, tuple[Fold | None, Program]] = {}
        self._next = 0  # the next free op id

    def placed(self, j: int, fold: Fold | None) -> Program:
        """Job ``j``'s ops on its GPUs under ``fold`` (its iterations repeated), ids from a free base."""
        from emulator.workload.builder import build_program
        from emulator.workload.jobs import id_span, job_scenario, place

        hit = self._placed.get(j)
        if hit is not None and hit[0] == fold:
            return hit[1]
        job = self.scenario.jobs[j]
        key = (job.model, job.training, job.parallel, job.workload, len(job.nodes_assigned), fold)
        with self.runner.paused():
            own = self._built.get(key)
            if own is None:
                js = job_scenario(self.scenario, job)
                built = self.runner.build(js)[0] if fold is None else build_program(js, fold, blocks=True)
                own = self._built[key] = built.repeated(self.iterations)
            self.facts[j] = Program(own.ranks, [], None, own.meta)
            try:
                out = place(own, self.gpus[j], self.world, self._next)
            except ValueError as exc:
                raise EmulatorError(f"{self.scenario.path or self.scenario.name}: job {job.name!r}: {exc}") from None
        self._next = id_span(out)
        self._placed[j] = (fold, out)
        return out

    def together(self, folds: list[Fold | None], others: list[frozenset[int]]) -> Program:
        """Every job's ops under ``folds``, each after its start offset, in one Program."""
        from emulator.run.folding import JobsFold, JobsProgram
        from emulator.workload.jobs import delayed, id_span, merge

        parts = []
        for j, (job, fold) in enumerate(zip(self.scenario.jobs, folds)):
            shared = delayed(self.placed(j, fold), job.start, self._next)
            self._next = max(self._next, id_span(shared))
            parts.append(shared)
        together = merge(parts, self.world)
        if all(f is None for f in folds):
            return together
        return JobsProgram(self.world, together.ops, JobsFold(self.gpus, folds, others))


def job_fold(scenario: Scenario, job: JobSpec, gpus: tuple[int, ...]) -> Fold | None:
    """A job's own fold (``folding.choose_fold`` on a cluster of its size) where its nodes embed alike
    (``jobs.embeds_alike``); elsewhere its tensor-parallel axis alone; None with folding off or faults."""
    from emulator.run.folding import choose_fold
    from emulator.workload.jobs import embeds_alike, fold_holds, job_scenario

    if scenario.simulation.fold == "off" or scenario.cluster.overrides:
        return None
    full = choose_fold(job_scenario(scenario, job, fold=scenario.simulation.fold))[0]
    if full is None:
        return None
    from emulator.network.domain import network_cluster, spans_nodes

    node = scenario.cluster.node
    assert node is not None
    if spans_nodes(node):  # jobs on trays of shared NVLink domains: the domains must map onto domains
        return full if fold_holds(full, gpus, network_cluster(scenario.cluster), node.domain) else _tp_only(full)
    if embeds_alike(scenario.cluster, job.nodes_assigned) and list(gpus) == sorted(gpus):
        return full
    return full if fold_holds(full, gpus, scenario.cluster, node.gpus_per_node) else _tp_only(full)


def _tp_only(fold: Fold | None) -> Fold | None:
    """``fold``'s tensor-parallel axis alone (its last, ``folding.choose_fold``), or None."""
    if fold is None or not fold.folded[-1]:
        return None
    return Fold(fold.shape, (False,) * (len(fold.shape) - 1) + (True,))


def _less(fold: Fold | None) -> Fold | None:
    """The next fold to try where ``fold`` was refused: its tensor-parallel axis alone, then none."""
    if fold is None or not any(fold.folded[:-1]):
        return None
    return _tp_only(fold)


def _jobs_note(scenario: Scenario, folds: list[Fold | None]) -> str:
    if scenario.simulation.fold == "off":
        return "folding off (simulation.fold: off): every job simulated rank by rank, shared and alone"
    if all(f is None for f in folds):
        return JOBS_NOTE
    by_copies: dict[int, list[str]] = {}
    for job, f in zip(scenario.jobs, folds):
        by_copies.setdefault(f.copies if f is not None else 1, []).append(job.name)
    parts = [f"{', '.join(names) if len(names) <= 4 else f'{len(names)} jobs'} {n}"
             for n, names in sorted(by_copies.items(), reverse=True)]
    return ("folding per job on the shared fabric (ranks per simulated rank: " + "; ".join(parts) + "); alone, "
            "each job folds as a single job does on its nodes")


def _isolated(runs: list[JobRun], iterations: int) -> None:
    """A job that shares no link with any job running in its window ran exactly as alone: flows share
    bandwidth only with the flows of their links' connected component (max-min, ``network.maxmin``),
    and jobs share no GPU. Its shared time, measured from the run's absolute clock (an error of a few
    ulps of the start), is set to its alone time, so its slowdown is 1 exactly."""
    links = [{i for i, b in enumerate(r.link_bytes) if b > 0} for r in runs]
    windows = [(r.job.start, r.job.start + max(r.iteration_time_s, r.alone_iteration_time_s) * iterations)
               for r in runs]
    for j, run in enumerate(runs):
        a0, a1 = windows[j]
        met = any(k != j and links[j] & links[k] and a0 < windows[k][1] and windows[k][0] < a1
                  for k in range(len(runs)))
        if not met:
            run.iteration_time_s = run.alone_iteration_time_s
