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

- zb-v (Qi et al., "Zero Bubble Pipeline Parallelism" ZB-V / "Pipeline Parallelism with Controllable
  Memory"): two chunks per stage in a V (stage r holds virtual stages r and 2p − 1 − r:
  scenario/stages.py ``virtual_stage``), every backward split into I and W, in the order of the authors'
  greedy V scheduler (zbv.py, run with equal F, B, W: :func:`_zbv_orders`).
- dualpipev (deepseek-ai/DualPipe dualpipev.py, Sea AI Lab's "cut-in-half" DualPipe): the same V, DualPipe's
  eight steps; a forward of one chunk and a backward of the other run as one overlapped pair
  (:func:`dualpipev_steps`), some backwards split. Needs m ≥ 2p.
- dualpipe (deepseek-ai/DualPipe dualpipe.py): two directions, m/2 micro-batches each; stage r runs its own
  stage for the forward direction (chunk 0) and stage p − 1 − r for the reverse one (chunk 1), so every rank
  holds two stages' parameters. DualPipeV's steps on the half ranks (:func:`dualpipe_steps`). Needs an even
  p and an even m ≥ 2p.

With Megatron-Core's all-to-all overlap (``schedule(..., a2a_overlap=True)``) 1f1b and
interleaved-1f1b run one more warm-up forward, and ``combined_steps`` pairs each steady forward
with the backward after it, the combined step that the builder runs layer by layer.

Bubble with equal stage costs F, B (input gradient), W (weight gradient), the paper's Table 1:
(p − 1)(F + B + W) for gpipe and 1f1b, (p − 1)(F + B + W)/v interleaved, (p − 1)(F + B − W) zb-h1
(the step m(F + B + W) plus that). Per chunk of a V (F, B, W a chunk's, 2m of each a stage): zb-v with
F = B = W leaves only the V's fill, (p − 1)F; dualpipev (p − 1)(F&B + B + W − 3W) with F&B a pair and B + W
a whole backward (DualPipe README, (PP/2 − 1)(F&B + B − 3W) over PP = 2p chunks), dualpipe (p/2 − 1)(F&B +
B + W − 3W) over p stages. 1f1b keeps at most p − s micro-batches in flight on stage s;
gpipe m; zb-h1 p on every stage (a micro-batch is held from its F to its W: the paper's p·M_B,
1F1B's stage-0 peak, on every stage; an upper bound, as I frees what only dgrad needed); zb-v 2p chunks (p
stages' worth, the paper's p·M_B); dualpipev and dualpipe PP + 1 (the DualPipe README: 2p + 1 chunks, p + 1
stages).
"""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple, Sequence

from emulator.errors import ScenarioError
from emulator.scenario.stages import V_SHAPED


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


# --- ZB-V ----------------------------------------------------------------------------------------
# The authors' greedy V scheduler (sail-sg/zero-bubble-pipeline-parallelism
# megatron/core/pipeline_parallel/zerobubble/scheduler/zbv.py, ``PipelineGraph.try_v_schedule`` and
# ``create_schedule``), run with the costs the authors' runtime gives its fixed V schedules (runtime.py,
# ``zbv_greedy.PipelineGraph(nstages, nmb, ..., 1000, 1000, 1000, 1)``: F = B = W = 1000, comm 1) and
# its memory units (runtime.py: f_mem = 34h + 5·a·s, w_mem = −32h, b_mem = −f_mem − w_mem; here with
# flash attention's a·s term dropped: 34, −2, −32), the limit its default 2·p·f_mem (1F1B's p stage-
# micro-batches). Costs: the paper's ZB-V assumes equal F, B, W per chunk; the builder then plays the
# order out with the real costs.
_ZBV_COST = (1000, 1000, 1000)
_ZBV_COMM = 1
_ZBV_MEM = (34, -2, -32)


class _ZBVGraph:
    """zbv.py's ``PipelineGraph`` (the greedy, kept in the authors' structure and names)."""

    def __init__(self, n_stage: int, n_micro: int) -> None:
        self.n_stage, self.n_micro = n_stage, n_micro
        self.n_node = 6 * n_stage * n_micro
        self.fbw_cost, self.c_cost, self.fbw_mem = _ZBV_COST, _ZBV_COMM, _ZBV_MEM
        self.max_mem = _ZBV_MEM[0] * n_stage * 2

    def get_id(self, cat: int, chunk: int, stage: int, micro: int) -> int:
        n, m = self.n_stage, self.n_micro
        return cat * 2 * n * m + chunk * n * m + stage * m + micro

    def try_v_schedule(self, fill_f: bool = True, fill_b: bool = True,
                       approved_bubble: list[int] | None = None) -> tuple[list[list[tuple[int, int, int]]], int]:
        n, m = self.n_stage, self.n_micro
        count = [[0] * 6 for _ in range(n)]
        end_time = [-1] * self.n_node
        cur_time = [0] * n
        mem = [0] * n
        stage_bubble = [0] * n
        pending_w: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]
        sched: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]
        approved = approved_bubble if approved_bubble is not None else [-1] * n
        max_approved = max(approved)

        def max_stage_bubble(stage: int = -1) -> int:
            b = max(stage_bubble + [0])
            return max(b, max_approved - approved[stage]) if stage >= 0 else b

        def put(cat: int, chunk: int, stage: int) -> None:
            tmp = no_bubble = cur_time[stage] + self.fbw_cost[cat]
            cnt = count[stage][cat * 2 + chunk]
            assert cnt < m and mem[stage] + self.fbw_mem[cat] <= self.max_mem
            if chunk == 1 and cat < 2 and stage < n - 1:
                tmp = max(tmp, end_time[self.get_id(cat, chunk, stage + 1, cnt)] + self.c_cost + self.fbw_cost[cat])
            if chunk == 0 and cat < 2 and stage > 0:
                tmp = max(tmp, end_time[self.get_id(cat, chunk, stage - 1, cnt)] + self.c_cost + self.fbw_cost[cat])
            if count[stage][0] > 0:
                stage_bubble[stage] += tmp - no_bubble
            end_time[self.get_id(cat, chunk, stage, cnt)] = tmp
            cur_time[stage] = tmp
            mem[stage] += self.fbw_mem[cat]
            sched[stage].append((cat, chunk, cnt))
            if cat == 1:
                pending_w[stage].append((2, chunk, cnt))
            count[stage][cat * 2 + chunk] += 1

        def put_w(stage: int) -> None:
            _, chunk, _ = pending_w[stage].pop(0)
            put(2, chunk, stage)

        for i in range(n):
            put(0, 0, i)
        for i in range(n - 1, -1, -1):
            if i == n - 1:
                put(0, 1, i)
                continue
            tmp = end_time[self.get_id(0, 1, i + 1, 0)] + self.c_cost
            while (mem[i] + self.fbw_mem[0] * (2 + i * 2) <= self.max_mem and cur_time[i] + self.fbw_cost[0] <= tmp
                   and count[i][0] < m):
                for j in range(i + 1):
                    put(0, 0, j)
            put(0, 1, i)
        iter_chunk = 0
        for i in range(1, n):
            while count[i][0] + count[i][1] < count[i - 1][0] + count[i - 1][1] or count[i][1] <= count[i - 1][1] < m:
                for j in range(n - 1, i - 1, -1):
                    if count[j][iter_chunk] < m:
                        put(0, iter_chunk, j)
                iter_chunk = 1 - iter_chunk
        for _ in range(2 * m):
            for i in range(n):  # check mem before putting b
                while mem[i] + self.fbw_mem[1] > self.max_mem:
                    put_w(i)
            b0_ranks, b1_ranks = [], []
            for i in range(n):
                if count[i][3] >= count[i][2]:
                    b0_ranks.append(i)
                elif i == n - 1:
                    b1_ranks.append(i)
                elif end_time[self.get_id(1, 1, i + 1, count[i][3])] >= 0 or count[i][2] >= m:
                    b1_ranks.append(i)
                else:
                    b0_ranks.append(i)
            for i, chunk in [(i, 1) for i in reversed(b1_ranks)] + [(i, 0) for i in b0_ranks]:
                fa_id = -1
                if chunk == 1 and i < n - 1:
                    fa_id = self.get_id(1, 1, i + 1, count[i][3])
                if chunk == 0 and i > 0:
                    fa_id = self.get_id(1, 0, i - 1, count[i][2])
                while pending_w[i] and fa_id >= 0 and end_time[fa_id] + self.c_cost >= cur_time[i] + self.fbw_cost[2]:
                    put_w(i)  # fill the bubble
                if pending_w[i] and end_time[fa_id] + self.c_cost - cur_time[i] > max_stage_bubble(i) - stage_bubble[i]:
                    if chunk == 1 or fill_b:
                        put_w(i)
                put(1, chunk, i)
            for i in range(n):  # put f
                if count[i][1] >= m:
                    continue
                item = None
                if count[i][1] >= count[i][0]:
                    item = 0
                elif i == n - 1:
                    item = 1
                elif end_time[self.get_id(0, 1, i + 1, count[i][1])] >= 0:
                    item = 1
                elif count[i][0] < m and (i == 0 or end_time[self.get_id(0, 0, i - 1, count[i][0])] >= 0):
                    item = 0
                if item is None:
                    continue
                while mem[i] + self.fbw_mem[0] > self.max_mem:  # check mem before putting f
                    put_w(i)
                fa_id = -1
                if item == 0 and i > 0:
                    fa_id = self.get_id(0, 0, i - 1, count[i][0])
                if item == 1 and i < n - 1:
                    fa_id = self.get_id(0, 1, i + 1, count[i][1])
                while pending_w[i] and fa_id >= 0 and end_time[fa_id] + self.c_cost >= cur_time[i] + self.fbw_cost[2]:
                    put_w(i)  # fill the bubble
                if pending_w[i] and end_time[fa_id] + self.c_cost - cur_time[i] > max_stage_bubble(i) - stage_bubble[i]:
                    if fill_f:
                        put_w(i)
                put(0, item, i)
        for i in range(n):
            while pending_w[i]:
                put_w(i)
        max_bubble = max_stage_bubble()
        if max_approved < 0 or max_bubble < max_approved:
            again, again_bubble = self.try_v_schedule(fill_f, fill_b, stage_bubble)
            if again_bubble < max_bubble:
                return again, again_bubble
        return sched, max_bubble


@functools.lru_cache(maxsize=64)
def _zbv_orders(stages: int, microbatches: int) -> tuple[tuple[Task, ...], ...]:
    """Every stage's ZB-V order: the best of the greedy's four fill settings (``create_schedule``), its
    (cat, chunk, micro) read as the authors' ``ScheduledNode``: F of chunk c, and B (our I) and W of
    chunk 1 − c (the greedy counts backward chunks in the order they run, from the V's tip)."""
    best: list[list[tuple[int, int, int]]] | None = None
    best_bubble = -1
    graph = _ZBVGraph(stages, microbatches)
    for fill_b in (True, False):
        for fill_f in (True, False):
            sched, bubble = graph.try_v_schedule(fill_f, fill_b)
            if best is None or bubble < best_bubble:
                best, best_bubble = sched, bubble
    assert best is not None
    return tuple(tuple(Task("FIW"[cat], mb, chunk if cat == 0 else 1 - chunk) for cat, chunk, mb in stage)
                 for stage in best)


def zb_v(stage: int, stages: int, microbatches: int, virtual: int = 2) -> list[Task]:
    """ZB-V: two chunks in a V, every backward split into I and W, in the authors' greedy order."""
    return list(_zbv_orders(stages, microbatches)[stage])


# --- DualPipeV -------------------------------------------------------------------------------------
def dualpipev_steps(stage: int, stages: int, microbatches: int, virtual: int = 2) -> list[tuple[Task, ...]]:
    """DualPipeV's order on ``stage`` as steps: a pair (F of one chunk, B of the other) is one overlapped
    forward-backward chunk (``_forward_backward_chunk``), every other task runs alone.

    deepseek-ai/DualPipe dualpipe/dualpipev.py ``DualPipeV.step``, its eight steps for rank r of p and
    m micro-batches (phase 0 = chunk 0, phase 1 = chunk 1; each phase counts its micro-batches):
    1 (p − r − 1)·2 × F0; 2 (r + 1) × [F0, F1]; 3 (p − r − 1) × [B1 split (I), W, F1];
    4 (m − 2p + r + 1) × [F0&B1, F1&B0] (the last rank runs its first F0 and B1 apart); 5 (p − r − 1) ×
    [B1, F1&B0]; 6 (r + 1) × [B1, B0], split from the middle on (zero bubble); 7 (p − r − 1) × [W, B0
    split]; 8 (r + 1) × W. A W runs the oldest held weight gradient (``WeightGradStore.pop``: FIFO)."""
    p, r, m = stages, stage, microbatches
    f_next, b_next = [0, 0], [0, 0]  # current_f_chunk_id, current_b_chunk_id per phase
    held: list[Task] = []
    out: list[tuple[Task, ...]] = []

    def f(phase: int) -> Task:
        f_next[phase] += 1
        return Task("F", f_next[phase] - 1, phase)

    def b(phase: int, zb: bool = False) -> Task:
        b_next[phase] += 1
        t = Task("I" if zb else "B", b_next[phase] - 1, phase)
        if zb:
            held.append(Task("W", t.microbatch, phase))
        return t

    def w() -> Task:
        return held.pop(0)

    out += [(f(0),) for _ in range((p - r - 1) * 2)]  # step 1
    for _ in range(r + 1):  # step 2
        out += [(f(0),), (f(1),)]
    for _ in range(p - r - 1):  # step 3
        out += [(b(1, True),), (w(),), (f(1),)]
    for i in range(m - 2 * p + r + 1):  # step 4
        if i == 0 and r == p - 1:  # "We don't overlap these two chunks to further reduce bubble size"
            out += [(f(0),), (b(1),)]
        else:
            out.append((f(0), b(1)))
        out.append((f(1), b(0)))
    for _ in range(p - r - 1):  # step 5
        out += [(b(1),), (f(1), b(0))]
    zb = False
    for i in range(r + 1):  # step 6
        if i == (r + 1) // 2 and r % 2 == 1:
            zb = True
        out.append((b(1, zb),))
        if i == (r + 1) // 2 and r % 2 == 0:
            zb = True
        out.append((b(0, zb),))
    for _ in range(p - r - 1):  # step 7
        out += [(w(),), (b(0, True),)]
    out += [(w(),) for _ in range(r + 1)]  # step 8
    assert not held and f_next == [m, m] and b_next == [m, m]
    return out


def dualpipev(stage: int, stages: int, microbatches: int, virtual: int = 2) -> list[Task]:
    """DualPipeV's order (:func:`dualpipev_steps`), one task after another."""
    return [t for step in dualpipev_steps(stage, stages, microbatches, virtual) for t in step]


# --- DualPipe --------------------------------------------------------------------------------------
def dualpipe_steps(stage: int, stages: int, microbatches: int, virtual: int = 1) -> list[tuple[Task, ...]]:
    """DualPipe's order on ``stage``, as steps (pairs: overlapped forward-backward chunks).

    deepseek-ai/DualPipe dualpipe/dualpipe.py ``DualPipe.step`` runs DualPipeV's eight steps with
    half_rank = min(r, p − 1 − r) of p/2 and m/2 micro-batches a direction, the middle ranks (p/2 − 1,
    p/2) as DualPipeV's last; its phases are the rank's modules, swapped on the second half of the ranks
    (``phase ^= self.is_in_second_half``). Chunk 0 is module 0, the rank's own stage r in the forward
    direction (micro-batches 0 … m/2 − 1 enter at rank 0); chunk 1 is module 1, stage p − 1 − r in the
    reverse direction (micro-batches m/2 … m − 1 enter at rank p − 1)."""
    p, r, half = stages, stage, microbatches // 2
    second = int(r >= p // 2)
    out: list[tuple[Task, ...]] = []
    for step in dualpipev_steps(min(r, p - 1 - r), p // 2, half):
        out.append(tuple(Task(t.phase, t.microbatch + half * (t.chunk ^ second), t.chunk ^ second) for t in step))
    return out


def dualpipe(stage: int, stages: int, microbatches: int, virtual: int = 1) -> list[Task]:
    """DualPipe's order (:func:`dualpipe_steps`), one task after another."""
    return [t for step in dualpipe_steps(stage, stages, microbatches, virtual) for t in step]


SCHEDULES: dict[str, ScheduleFn] = {"gpipe": gpipe, "1f1b": one_f_one_b, "interleaved-1f1b": interleaved,
                                    "zb-h1": zb_h1, "zb-v": zb_v, "dualpipev": dualpipev,
                                    "dualpipe": dualpipe}


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
    if name in V_SHAPED and virtual != 2:
        raise ScenarioError(f"{name} places two chunks on each pipeline rank in a V: virtual_stages must be 2 "
                            f"(or unset), got {virtual}", key="parallel.virtual_stages")
    if name == "dualpipe" and stages % 2:
        raise ScenarioError(f"dualpipe needs an even pp (rank i and pp-1-i hold the same two stages), got {stages} "
                            f"(deepseek-ai/DualPipe dualpipe.py: num_ranks % 2 == 0)", key="parallel.pp")
    if name == "dualpipe" and (microbatches < 2 * stages or microbatches % 2):
        raise ScenarioError(f"dualpipe needs an even number of micro-batches per pipeline, at least 2*pp = "
                            f"{2 * stages}, got {microbatches} (deepseek-ai/DualPipe dualpipe.py: num_chunks % 2 "
                            f"== 0 and num_chunks >= num_ranks * 2)", key="training.global_batch")
    if name not in V_SHAPED and name != "interleaved-1f1b" and virtual != 1:
        raise ScenarioError(f"virtual_stages {virtual} needs schedule interleaved-1f1b (schedule is {name})",
                            key="parallel.virtual_stages")
    if name == "dualpipev" and microbatches < 2 * stages:
        raise ScenarioError(f"dualpipev needs at least 2*pp = {2 * stages} micro-batches per pipeline, got "
                            f"{microbatches} (deepseek-ai/DualPipe dualpipev.py: num_chunks >= num_ranks * 2)",
                            key="training.global_batch")
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


def max_in_flight(tasks: list[Task], weights: Sequence[float] | None = None, combined: bool = False) -> float:
    """Most (micro-batch, chunk) forwards whose whole backward (B) or weight gradient (W) has not run
    yet, over the list; with ``weights`` (one per chunk, e.g. its layers), the most of their summed
    weights. An input-gradient pass (I) frees nothing: its W still needs the layer inputs.

    ``combined`` (the all-to-all overlap, :func:`combined_steps`), with layer ``weights``: a forward of wF
    layers run with a backward of wB layers as one step interleaves them a layer at a time (Megatron-Core
    model_chunk_schedule_plan.py @ d98e8a64dd, ``TransformerModelChunkSchedulePlan.run``: forward layer i with
    the backward's next, each backward layer's state released after it, then the rest of the longer alone),
    so the step holds at most one layer, or wF − wB, more than before it, not wF."""
    live = peak = 0.0
    groups = combined_steps(tasks) if combined and weights is not None else [(t,) for t in tasks]
    for group in groups:
        if len(group) == 2:
            f, b = weights[group[0].chunk], weights[group[1].chunk]  # type: ignore[index]
            peak = max(peak, live + min(f, max(1.0, f - b)))
            live += f - b
            continue
        t = group[0]
        if t.phase == "I":
            continue
        w = 1.0 if weights is None else weights[t.chunk]
        live += w if t.phase == "F" else -w
        peak = max(peak, live)
    return peak
