"""Pipeline schedules: the order in which one pipeline stage runs its work.

A schedule is a small named plug-in (``SCHEDULES``: name → function). For stage ``s`` of
``p`` stages, ``m`` micro-batches and ``v`` model chunks per stage (virtual stages), it
returns the ordered list of :class:`Task` (phase, micro-batch, chunk). Phases: 'F' forward, 'B'
the whole backward; a zero-bubble schedule splits some backwards in two, 'I' (the input gradient:
the dgrad GEMMs and the rest of the backward, what the previous stage waits for; the paper's B)
and, later, 'W' (the weight gradient: the wgrad GEMMs).
Chunk c of stage s is virtual stage c·p + s; activations flow from virtual stage k to
k + 1 (so from the last stage's chunk c to the first stage's chunk c + 1).

- gpipe: all forwards, then all backwards (in reverse micro-batch order).
- 1f1b (PipeDream-Flush, Narayanan et al. SC21): p − s − 1 warm-up forwards, then
  one forward / one backward, then the cool-down backwards.
- interleaved-1f1b (Megatron-LM, ``forward_backward_pipelining_with_interleaving``):
  virtual micro-batch k runs chunk (k // p) mod v forward (v − 1 − that, backward) on
  micro-batch (k // (p·v))·p + k mod p; warm-up (p − s − 1)·2 + (v − 1)·p (all of
  them when m = p). Megatron requires m to be a multiple of p; so do we.

- zb-h1 (Qi et al., ICLR'24, "Zero Bubble Pipeline Parallelism", ZB-H1): 1F1B's warm-up and
  order; stage r > 0 splits the backwards of its first r steady-state micro-batches, its last
  steady one and its cool-down ones into I and W, holds the W back, and runs one held W after
  each of those backwards from the r-th on and the rest after its last backward: the input
  gradients reach stage 0 without waiting for weight gradients. The order is the authors' own,
  sail-sg/zero-bubble-pipeline-parallelism branch zb-h1-quick-start,
  megatron/core/pipeline_parallel/schedules.py ``forward_backward_pipelining_without_interleaving``
  (``WeightGradStore.split_bw = (i < rank or last_iteration) and rank > 0``; ``pop()`` after
  the last steady backward when i ≥ rank and after each cool-down one when
  num_microbatches_remaining + i ≥ rank; ``pop_all()`` at the end). The other backwards (all of
  stage 0's) are whole, as there: their TP reduce-scatter of dx stays under the wgrad GEMM.

With Megatron-Core's all-to-all overlap (``schedule(..., a2a_overlap=True)``) 1f1b and
interleaved-1f1b run one more warm-up forward, and ``combined_steps`` pairs each steady forward
with the backward after it, the combined step that the builder runs layer by layer.

Bubble with equal stage costs F, B (input gradient), W (weight gradient), the paper's Table 1:
(p − 1)(F + B + W) for gpipe and 1f1b, (p − 1)(F + B + W)/v interleaved, (p − 1)(F + B − W) zb-h1
(the step m(F + B + W) plus that). 1f1b keeps at most p − s micro-batches in flight on stage s;
gpipe m; zb-h1 p on every stage (a micro-batch is held from its F to its W: the paper's p·M_B,
1F1B's stage-0 peak, on every stage; an upper bound, as I frees what only dgrad needed).
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

from emulator.errors import ScenarioError


class Task(NamedTuple):
    phase: str  # 'F' | 'B' | 'I' | 'W'
    microbatch: int
    chunk: int = 0


ScheduleFn = Callable[[int, int, int, int], list[Task]]


def gpipe(stage: int, stages: int, microbatches: int, virtual: int = 1) -> list[Task]:
    """F0 … F(m−1), then B(m−1) … B0."""
    m = microbatches
    return [Task("F", i) for i in range(m)] + [Task("B", i) for i in reversed(range(m))]


def one_f_one_b(stage: int, stages: int, microbatches: int, virtual: int = 1, extra: int = 0) -> list[Task]:
    """Warm-up min(p−s−1 + extra, m) forwards, steady 1F1B, cool-down backwards."""
    m = microbatches
    warm = min(stages - stage - 1 + extra, m)
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


def interleaved(stage: int, stages: int, microbatches: int, virtual: int = 1, extra: int = 0) -> list[Task]:
    """Megatron's interleaved 1F1B over ``virtual`` chunks per stage (``extra`` more warm-up forwards)."""
    total = microbatches * virtual
    if microbatches == stages:
        warm = total
    else:
        warm = min((stages - stage - 1) * 2 + (virtual - 1) * stages + extra, total)
    tasks = [_interleaved_task(k, "F", stages, virtual) for k in range(warm)]
    for k in range(total - warm):
        tasks += [_interleaved_task(warm + k, "F", stages, virtual), _interleaved_task(k, "B", stages, virtual)]
    tasks += [_interleaved_task(k, "B", stages, virtual) for k in range(total - warm, total)]
    return tasks


def zb_h1(stage: int, stages: int, microbatches: int, virtual: int = 1) -> list[Task]:
    """ZB-H1: 1F1B's order, stage r > 0 splitting backwards into I and W and holding r W passes back."""
    m, r = microbatches, stage
    warm = min(stages - r - 1, m)
    rest = m - warm
    tasks = [Task("F", i) for i in range(warm)]
    held: list[int] = []  # deferred W passes, oldest first (WeightGradStore.weight_grad_queue)
    for i in range(rest):
        last = i == rest - 1
        tasks.append(Task("F", warm + i))
        if r > 0 and (i < r or last):
            tasks.append(Task("I", i))
            held.append(i)
            if last and i >= r:
                tasks.append(Task("W", held.pop(0)))
        else:
            tasks.append(Task("B", i))
    for i in range(warm):
        j = rest + i
        if r > 0:
            tasks.append(Task("I", j))
            held.append(j)
            if j >= r:
                tasks.append(Task("W", held.pop(0)))
        else:
            tasks.append(Task("B", j))
    return tasks + [Task("W", j) for j in held]


SCHEDULES: dict[str, ScheduleFn] = {"gpipe": gpipe, "1f1b": one_f_one_b, "interleaved-1f1b": interleaved,
                                    "zb-h1": zb_h1}


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


def schedule(name: str, stage: int, stages: int, microbatches: int, virtual: int = 1,
             a2a_overlap: bool = False) -> list[Task]:
    """The task order of ``stage`` under schedule ``name`` (validated). With ``a2a_overlap``
    (Megatron-Core's overlap_moe_expert_parallel_comm), one more warm-up forward, so that each steady
    forward and the backward after it are of different micro-batches and run as one combined step
    (schedules.py get_pp_rank_microbatches @ d98e8a64dd: "we schedule one extra micro-batch forward
    step before the 1f1b stages"; without pipelining, combined_1f1b.py
    ``combined_1f1b_schedule_for_no_pipelining``: the first forward alone, then forward i + 1 with
    backward i, then the last backward alone: 1F1B with one warm-up forward)."""
    check_schedule(name, stages, microbatches, virtual)
    if a2a_overlap and name in ("1f1b", "interleaved-1f1b"):
        fn = one_f_one_b if name == "1f1b" else interleaved
        return fn(stage, stages, microbatches, virtual, 1)
    return SCHEDULES[name](stage, stages, microbatches, virtual)


def combined_steps(tasks: list[Task]) -> list[tuple[Task, ...]]:
    """The tasks grouped as the all-to-all overlap runs them: a forward followed by a backward of another
    (micro-batch, chunk) is one combined step (a pair); every other task runs alone."""
    out: list[tuple[Task, ...]] = []
    i = 0
    while i < len(tasks):
        t = tasks[i]
        if (i + 1 < len(tasks) and t.phase == "F" and tasks[i + 1].phase == "B"
                and (tasks[i + 1].microbatch, tasks[i + 1].chunk) != (t.microbatch, t.chunk)):
            out.append((t, tasks[i + 1]))
            i += 2
        else:
            out.append((t,))
            i += 1
    return out


def max_in_flight(tasks: list[Task], weights: Sequence[float] | None = None) -> float:
    """Most (micro-batch, chunk) forwards whose whole backward (B) or weight gradient (W) has not run
    yet, over the list; with ``weights`` (one per chunk, e.g. its layers), the most of their summed
    weights. An input-gradient pass (I) frees nothing: its W still needs the layer inputs."""
    live = peak = 0.0
    for t in tasks:
        if t.phase == "I":
            continue
        w = 1.0 if weights is None else weights[t.chunk]
        live += w if t.phase == "F" else -w
        peak = max(peak, live)
    return peak
