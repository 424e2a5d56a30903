"""``Program.meta``: the facts a Program carries for the reports, never for the engine.

Two front ends write them:
- the workload builder: ``WorkloadFacts`` (FLOPs, tokens and samples of one iteration,
  the parallel layout);
- the trace importers: ``TraceFacts`` (where the trace came from, what it measured,
  and the importer's warnings).

``ProgramMeta`` holds either (or neither). Its flat dict form (``to_dict`` /
``from_dict``: the workload fields, then ``source``, ``measured``, ``warnings``) is
what the Chakra exporter stores as JSON and reads back; it round-trips exactly.

May import: nothing of the emulator (the bottom layer).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, TypedDict


@dataclass(frozen=True, slots=True)
class WorkloadFacts:
    """What the workload builder knows of one iteration (``emulator.workload.builder``)."""

    model_flops: float  # FLOPs of the model's math (6·N·tokens and attention), per iteration
    hardware_flops: float  # FLOPs the GPUs execute (with recomputation)
    tokens: int  # per iteration
    samples: int  # per iteration (the global batch)
    pp: int
    microbatches: int
    tp: int
    dp: int
    cp: int
    ep: int
    virtual_stages: int
    schedule: str
    params: int  # of the whole model

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> WorkloadFacts:
        """From the flat form; a partial mapping (a hand-made program) gets the reports'
        defaults: zero FLOPs, tokens, samples and parameters, hardware FLOPs equal to
        the model FLOPs, a size of 1 on every axis, no schedule."""
        model_flops = d.get("model_flops", 0.0)
        return cls(model_flops=model_flops, hardware_flops=d.get("hardware_flops", model_flops),
                   tokens=d.get("tokens", 0), samples=d.get("samples", 0), pp=d.get("pp", 1),
                   microbatches=d.get("microbatches", 1), tp=d.get("tp", 1), dp=d.get("dp", 1),
                   cp=d.get("cp", 1), ep=d.get("ep", 1), virtual_stages=d.get("virtual_stages", 1),
                   schedule=d.get("schedule", ""), params=d.get("params", 0))


@dataclass(frozen=True, slots=True)
class TraceSource:
    """Where an imported trace came from."""

    format: str  # "kineto" | "chakra"
    path: str
    files: tuple[str, ...] = ()  # the per-rank files read (Kineto)
    iteration: int | None = None  # the ProfilerStep imported (Kineto)
    mirror: int = 0  # a one-rank trace replayed as this many ranks (Kineto)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["files"] = list(self.files)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TraceSource:
        return cls(format=d["format"], path=d["path"], files=tuple(d.get("files", ())),
                   iteration=d.get("iteration"), mirror=d.get("mirror", 0))


# What a Kineto trace measured. These nested records stay typed mappings rather than
# dataclasses: the importer fills them in place (each collective's own cost and wait are
# matched across ranks after all ranks are read), they round-trip through the Chakra
# JSON as they are, and the replay report and the tests read them by key; a dataclass
# tree would rewrite the importer and every reader for no gain in what is checked.

class CollectiveMeasure(TypedDict):
    """One communication kernel of a rank, as measured (times from the common origin)."""

    op_id: int
    collective: str  # one of COLLECTIVE_OPS, or "send" / "recv"
    group: list[int]
    bytes: float
    start_s: float
    end_s: float
    duration_s: float
    own_s: float | None  # end minus the last member's arrival (shared clock only)
    wait_s: float | None  # arrival to the last member's arrival (shared clock only)


class RankMeasure(TypedDict):
    """One rank's measured step."""

    rank: int
    file: str
    span_s: float  # first to last GPU op
    start_s: float
    end_s: float
    step_start_s: float
    cpu_step_s: float
    collectives: list[CollectiveMeasure]


class Measured(TypedDict):
    """The measured timeline of an imported step, per rank (a list indexed by rank)."""

    iteration: int | None
    shared_clock: bool
    ranks: list[RankMeasure]
    span_s: float


@dataclass(frozen=True, slots=True)
class TraceFacts:
    """What a trace importer records besides the ops."""

    source: TraceSource
    measured: Measured | None = None  # Kineto only
    warnings: tuple[str, ...] = ()


_WORKLOAD_KEYS = tuple(f.name for f in fields(WorkloadFacts))
_TRACE_KEYS = ("source", "measured", "warnings")


@dataclass(frozen=True, slots=True)
class ProgramMeta:
    """The report facts of a Program: a workload's, a trace's, or none."""

    workload: WorkloadFacts | None = None
    trace: TraceFacts | None = None

    @property
    def measured(self) -> Measured | None:
        """The measured timeline of an imported trace, if any."""
        return self.trace.measured if self.trace is not None else None

    def to_dict(self) -> dict[str, Any]:
        """The flat form: the workload fields, then source, measured, warnings (JSON-ready)."""
        out: dict[str, Any] = {}
        if self.workload is not None:
            out.update(asdict(self.workload))
        if self.trace is not None:
            out["source"] = self.trace.source.to_dict()
            if self.trace.measured is not None:
                out["measured"] = self.trace.measured
            out["warnings"] = list(self.trace.warnings)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ProgramMeta:
        """Parse the flat form; ValueError on a key it does not know."""
        unknown = [k for k in d if k not in _WORKLOAD_KEYS and k not in _TRACE_KEYS]
        if unknown:
            raise ValueError(f"program meta: unknown keys {', '.join(map(repr, unknown))}")
        workload = WorkloadFacts.from_dict(d) if any(k in d for k in _WORKLOAD_KEYS) else None
        trace = None
        if any(k in d for k in _TRACE_KEYS):
            source = d.get("source") or {"format": "", "path": ""}
            trace = TraceFacts(TraceSource.from_dict(source), d.get("measured"), tuple(d.get("warnings", ())))
        return cls(workload, trace)
