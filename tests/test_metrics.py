"""The breakdown from spans, on hand-made timelines."""
import pytest

from emulator.outputs.metrics import breakdown, union_length
from emulator.spans import Span


def sp(rank, kind, start, end, xfer=None, category="fwd", stream="compute"):
    return Span(0, rank, stream, kind, "x", start, end, 0.0, 0.0, -1, -1, category,
                start if xfer is None else xfer)


def test_union_length():
    # [0,2) ∪ [1,3) ∪ [5,6) ∪ [5.5,5.7) = [0,3) + [5,6) = 4
    assert union_length([5, 0, 1, 5.5], [6, 2, 3, 5.7]) == pytest.approx(4.0)
    assert union_length([], []) == 0.0


def test_breakdown_parts_add_up():
    # one rank, T = 10: compute [0,4) and [6,8) = 6; a collective issued at 3, transfer [4,7):
    # comm-only time = [4,6) = 2 (the [6,7) part hides under compute); optimizer [8,9) = 1;
    # idle = 10 − 9 = 1. Not pipelined: other = optimizer 1 + idle 1 = 2.
    spans = [sp(0, "compute", 0, 4), sp(0, "compute", 6, 8), sp(0, "collective", 3, 7, xfer=4),
             sp(0, "compute", 8, 9, category="optimizer")]
    bd = breakdown(spans, 10.0, pipelined=False)
    assert (bd.compute, bd.exposed_comm, bd.bubble, bd.other) == pytest.approx((6, 2, 0, 2))
    # pipelined: the idle second is bubble
    bd = breakdown(spans, 10.0, pipelined=True)
    assert (bd.compute, bd.exposed_comm, bd.bubble, bd.other) == pytest.approx((6, 2, 1, 1))


def test_host_lane_is_not_compute_and_ranks_average():
    # rank 0 computes 4 of 10; rank 1 only has a host-lane op (not GPU work): compute (4 + 0)/2 = 2
    spans = [sp(0, "compute", 0, 4), sp(1, "compute", 0, 10, stream="cpu", category="host")]
    bd = breakdown(spans, 10.0, pipelined=False)
    assert bd.compute == pytest.approx(2.0) and bd.other == pytest.approx(8.0)
