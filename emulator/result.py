"""The Result record: what one simulation produced, for every report.

Outputs (summary, spans.csv, Perfetto, Gantt, link plots) and studies read a ``Result``; none of
them imports the run stage (``emulator.run``) that makes it. Beside it, the records a Result
holds: one job of a multi-job run (``JobRun``), what a timed fault did (``FaultRecord``) and what a fault in force from
the start reached (``OverrideRecord``).

May import: emulator.program (the IR), emulator.spans (the records), and the types a Result
carries: emulator.scenario (the scenario as run) and emulator.network (its topology).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from emulator.network.topology import Topology
from emulator.program import Program
from emulator.scenario.spec import JobSpec, Scenario
from emulator.spans import Span, SpanTable


@dataclass
class FaultRecord:
    """What a timed fault did, for the reports: when, and how many flows it rerouted or stalled
    (those on the link when it failed, and those that started on it while it was down)."""

    kind: str
    target: str
    at_s: float
    until_s: float | None
    rerouted: int = 0
    stalled: int = 0

    @property
    def label(self) -> str:
        return f"{self.kind} {self.target}"


@dataclass
class OverrideRecord:
    """A fault or straggler in force for the whole run (an override without ``at``/``until``) and
    what it reached: the GPUs a slowdown slows, the directed links a degrade or failure changes."""

    kind: str
    target: str
    factor: float
    extra_latency_s: float
    gpus: int = 0
    links: int = 0


@dataclass
class JobRun:
    """One job of a multi-job run: where it ran, and its iteration time shared and alone."""

    job: JobSpec
    gpus: tuple[int, ...]  # cluster GPU of each job rank
    program: Program  # the job's own Program (its rank numbering), for its workload facts
    iteration_time_s: float  # on the shared fabric, from its start
    alone_iteration_time_s: float  # alone on the same nodes, same cluster
    link_bytes: list[float]  # bytes per link per iteration, alone (the same flows as shared)

    @property
    def slowdown(self) -> float:
        return self.iteration_time_s / self.alone_iteration_time_s if self.alone_iteration_time_s > 0 else 1.0


@dataclass
class Result:
    """What one simulation produced; reports read this, never the live engine."""

    scenario: Scenario
    program: Program
    topology: Topology
    spans: Sequence[Span]  # a SpanTable from the engine: a read-only sequence of Span, made on access
    iteration_time_s: float
    events: int
    wall_s: float
    notes: list[str] = field(default_factory=list)
    link_series: dict[int, list[tuple[float, float]]] = field(default_factory=dict)
    link_bytes: list[float] = field(default_factory=list)
    jobs: list[JobRun] = field(default_factory=list)  # a multi-job scenario's jobs, in scenario order
    faults: list[FaultRecord] = field(default_factory=list)  # the timed faults and what they did
    overrides: list[OverrideRecord] = field(default_factory=list)  # the faults in force from the start
    # a fold in effect over copies with other latencies: the iteration time with each transfer at the
    # least and at the greatest latency of its copies (``simulate``); None: exact
    fold_bounds_s: tuple[float, float] | None = None

    @property
    def ranks_simulated(self) -> int:
        spans = self.spans
        if isinstance(spans, SpanTable):
            return spans.rank_count()
        return len({s.rank for s in spans})
