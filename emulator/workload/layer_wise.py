"""Megatron-Core's ``LayerWiseDistributedOptimizer`` deals whole parameters out to the data-parallel ranks; this module
says which rank gets which, so that Muon's step can be costed on the rank that holds the most Newton–Schulz work.
Pure functions of parameter sizes (Megatron-LM @ d98e8a64dd, megatron/core/optimizer/layer_wise_optimizer.py):

- **The legacy path** (``_shard_params_ping_pong``; Megatron-Bridge's ``dist_muon`` without the distributed
  optimizer): every parameter of the rank's optimizers, Adam's too, sorted by ``numel`` (a stable sort), then dealt
  in the loop 0, 1, …, d − 1, d − 1, …, 0, 0, 1, … ("ping-pong style loop so memory is more balanced"), the expert
  parameters in a loop of their own over the expert-data-parallel group.
- **The layout path** (``_compute_per_buffer_param_layout``; ``--optimizer muon --use-distributed-optimizer``):
  per model chunk and buffer (dense, expert), the parameters walked in backprop order and cut into buckets of at
  least ``bucket_size`` elements (a soft minimum: a bucket past it keeps taking parameters while each fits the
  least-loaded shard without growing the bucket, ``_absorbs``); each bucket is bin-packed by LPT: sorted by the
  Newton–Schulz cost max(m, n)·min(m, n)² (``_ns_compute_cost``; a 1-D parameter its ``numel``), each to the shard
  of least accumulated cost among those under 1.3× the bucket's mean elements (``_NUMEL_EPSILON``), else to the
  shard of fewest elements. The costs persist across a chunk's buckets.

ASSUMPTION: the 64-element alignment of each parameter's start and the shard padding (``pad_param_start``,
``pad_to_divisor``) are left out; they move a shard's element count by at most 63 a parameter.
"""
from __future__ import annotations

from functools import lru_cache

NUMEL_EPSILON = 0.3  # _emit_bucket's per-bucket element cap over the mean
PADDING_FLOOR = 0.9  # the soft minimum's floor: d · the chunk's largest parameter · 0.9


def ping_pong_order(d: int) -> tuple[int, ...]:
    """The legacy loop over ``d`` ranks: 0 … d − 1, then d − 1 … 0."""
    return tuple(range(d)) + tuple(reversed(range(d)))


@lru_cache(maxsize=256)
def ping_pong(numels: tuple[int, ...], d: int) -> tuple[int, ...]:
    """The rank each of ``numels`` (in the optimizers' parameter order) goes to under the legacy ping-pong deal over
    ``d`` ranks: sorted by size, stable, then dealt round the loop."""
    loop = ping_pong_order(d)
    out = [0] * len(numels)
    for i, j in enumerate(sorted(range(len(numels)), key=lambda k: numels[k])):
        out[j] = loop[i % len(loop)]
    return tuple(out)


def ns_cost_key(rows: int, cols: int) -> int:
    """``_ns_compute_cost`` of a 2-D parameter stored ``rows`` × ``cols``: max·min²."""
    big, small = max(rows, cols), min(rows, cols)
    return big * small * small


def _chunks(numels: tuple[int, ...], d: int, bucket: int | None) -> list[list[int]]:
    """The buckets (lists of parameter indices) of one buffer, walked in backprop order (``numels`` in model order)
    with the soft minimum ``bucket`` elements (None: one bucket)."""
    out: list[list[int]] = []
    cur: list[int] = []
    total = biggest = 0
    loads = [0] * d
    for i in reversed(range(len(numels))):
        n = numels[i]
        if bucket is not None and cur and total >= max(bucket, int(d * biggest * PADDING_FLOOR)) \
                and min(loads) + n > max(loads):
            out.append(cur)
            cur, total, biggest, loads = [], 0, 0, [0] * d
        loads[loads.index(min(loads))] += n
        cur.append(i)
        total += n
        biggest = max(biggest, n)
    if cur:
        out.append(cur)
    return out


@lru_cache(maxsize=256)
def lpt_layout(numels: tuple[int, ...], costs: tuple[int, ...], d: int, bucket: int | None) -> tuple[int, ...]:
    """The shard each parameter (``numels`` and ``costs`` in model order, one buffer of one model chunk) gets under
    the layout path over ``d`` shards with buckets of at least ``bucket`` elements (None: one)."""
    out = [0] * len(numels)
    compute = [0] * d
    for chunk in _chunks(numels, d, bucket):
        cap = sum(numels[i] for i in chunk) / d * (1 + NUMEL_EPSILON)
        cursors = [0] * d
        for i in sorted(chunk, key=lambda k: -costs[k]):
            fits = [s for s in range(d) if cursors[s] + numels[i] <= cap]
            s = min(fits, key=lambda x: compute[x]) if fits else min(range(d), key=lambda x: cursors[x])
            out[i] = s
            cursors[s] += numels[i]
            compute[s] += costs[i]
    return tuple(out)


def heaviest(ranks: tuple[int, ...], loads: tuple[float, ...], d: int) -> int:
    """The rank of ``d`` whose items (``ranks[i]`` holds item i of load ``loads[i]``) sum to the most; the lowest
    such rank."""
    total = [0.0] * d
    for r, x in zip(ranks, loads):
        total[r] += x
    return total.index(max(total))
