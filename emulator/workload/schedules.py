"""Pipeline schedules: the order in which one pipeline stage runs its work.

A schedule is a small named plug-in (``SCHEDULES``: name → function). For stage ``s`` of
``p`` stages, ``m`` micro-batches and ``v`` model chunks per stage (virtual stages), it
returns the ordered list of :class:`Task` (phase 'F' or 'B', micro-batch, chunk).
Chunk c of stage s is virtual stage c·p + s; activations flow from virtual stage k to
k + 1 (so from the last stage's chunk c to the first stage's chunk c + 1).

- gpipe: all forwards, then all backwards (in reverse micro-batch order).
- 1f1b (PipeDream-Flush, Narayanan et al. SC21): p − s − 1 warm-up forwards, then
  one forward / one backward, then the cool-down backwards.
- interleaved-1f1b (Megatron-LM, ``forward_backward_pipelining_with_interleaving``):
  virtual micro-batch k runs chunk (k // p) mod v forward (v − 1 − that, backward) on
  micro-batch (k // (p·v))·p + k mod p; warm-up (p − s − 1)·2 + (v − 1)·p (all of
  them when m = p). Megatron requires m to be a multiple of p; so do we.

Bubble fraction with equal stage costs: (p − 1)/m for gpipe and 1f1b, (p − 1)/(v·m)
interleaved. 1f1b keeps at most p − s micro-batches in flight on stage s; gpipe m.
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

from emulator.errors import ScenarioError


class Task(NamedTuple):
    phase: str  # 'F' | 'B'
    microbatch: int
    chunk: int = 0


ScheduleFn = Callable[[int, int, int, int], list[Task]]


def gpipe(stage: int, stages: int, microbatches: int, virtual: int = 1) -> list[Task]:
    """F0 … F(m−1), then B(m−1) … B0."""
    m = microbatches
    return [Task("F", i) for i in range(m)] + [Task("B", i) for i in reversed(range(m))]


def one_f_one_b(stage: int, stages: int, microbatches: int, virtual: int = 1) -> list[Task]:
    """Warm-up min(p−s−1, m) forwards, steady 1F1B, cool-down backwards."""
    m = microbatches
    warm = min(stages - stage - 1, m)
    tasks = [Task("F", i) for i in range(warm)]
    for i in range(m - warm):
        tasks += [Task("F", warm + i), Task("B", i)]
    tasks += [Task("B", i) for i in range(m - warm, m)]
    return tasks


def _interleaved_task(k: int, phase: str, stages: int, virtual: int) -> Task:
    chunk = (k // stages) % virtual
    if phase == "B":
        chunk = virtual - 1 - chunk
    mb = (k // (stages * virtual)) * stages + k % stages
    return Task(phase, mb, chunk)


def interleaved(stage: int, stages: int, microbatches: int, virtual: int = 1) -> list[Task]:
    """Megatron's interleaved 1F1B over ``virtual`` chunks per stage."""
    total = microbatches * virtual
    if microbatches == stages:
        warm = total
    else:
        warm = min((stages - stage - 1) * 2 + (virtual - 1) * stages, total)
    tasks = [_interleaved_task(k, "F", stages, virtual) for k in range(warm)]
    for k in range(total - warm):
        tasks += [_interleaved_task(warm + k, "F", stages, virtual), _interleaved_task(k, "B", stages, virtual)]
    tasks += [_interleaved_task(k, "B", stages, virtual) for k in range(total - warm, total)]
    return tasks


SCHEDULES: dict[str, ScheduleFn] = {"gpipe": gpipe, "1f1b": one_f_one_b, "interleaved-1f1b": interleaved}


def check_schedule(name: str, stages: int, microbatches: int, virtual: int) -> None:
    """Raise ScenarioError for an unknown schedule or a shape it cannot run."""
    if name not in SCHEDULES:
        raise ScenarioError(f"unknown schedule {name!r}; expected one of {', '.join(SCHEDULES)}",
                            key="parallel.schedule")
    if microbatches < 1:
        raise ScenarioError(f"needs at least one micro-batch per pipeline, got {microbatches}",
                            key="training.global_batch")
    if virtual < 1:
        raise ScenarioError(f"must be at least 1, got {virtual}", key="parallel.virtual_stages")
    if name != "interleaved-1f1b" and virtual != 1:
        raise ScenarioError(f"virtual_stages {virtual} needs schedule interleaved-1f1b (schedule is {name})",
                            key="parallel.virtual_stages")
    if name == "interleaved-1f1b" and microbatches % stages:
        raise ScenarioError(f"interleaved-1f1b needs the micro-batches per pipeline ({microbatches}) to be a "
                            f"multiple of pp ({stages}), as Megatron-LM does", key="training.global_batch")


def schedule(name: str, stage: int, stages: int, microbatches: int, virtual: int = 1) -> list[Task]:
    """The task order of ``stage`` under schedule ``name`` (validated)."""
    check_schedule(name, stages, microbatches, virtual)
    return SCHEDULES[name](stage, stages, microbatches, virtual)


def max_in_flight(tasks: list[Task], weights: Sequence[float] | None = None) -> float:
    """Most (micro-batch, chunk) forwards whose backward has not run yet, over the list; with
    ``weights`` (one per chunk, e.g. its layers), the most of their summed weights."""
    live = peak = 0.0
    for t in tasks:
        w = 1.0 if weights is None else weights[t.chunk]
        live += w if t.phase == "F" else -w
        peak = max(peak, live)
    return peak
