"""Placement: Megatron rank order and the parallel groups."""
import pytest

from emulator.errors import ScenarioError
from emulator.scenario import ParallelSpec
from emulator.workload.placement import ORDER, Layout


def layout(**kw) -> Layout:
    par = ParallelSpec(**kw)
    return Layout.from_parallel(par, par.tp * par.pp * par.dp * par.cp)


def test_megatron_order():
    lo = layout(tp=2, cp=2, dp=2, pp=2)
    assert lo.order == ORDER == ("pp", "dp", "cp", "tp")
    # rank = ((pp·DP + dp)·CP + cp)·TP + tp: (1, 1, 0, 1) → ((1·2 + 1)·2 + 0)·2 + 1 = 13
    assert lo.rank(pp=1, dp=1, cp=0, tp=1) == 13
    assert lo.coords(13) == {"pp": 1, "dp": 1, "cp": 0, "tp": 1}
    assert all(lo.rank(**lo.coords(r)) == r for r in range(16))


def test_groups():
    lo = layout(tp=2, cp=2, dp=2, pp=2)  # 16 ranks
    assert lo.tp_group(13) == (12, 13)
    assert lo.cp_group(13) == (13, 15)  # cp stride TP = 2; 13 has cp 0
    assert lo.dp_group(13) == (9, 13)  # dp stride TP·CP = 4
    assert lo.pp_group(13) == (5, 13)  # pp stride TP·CP·DP = 8
    assert lo.dp_cp_group(13) == (9, 11, 13, 15)


def test_expert_groups():
    # tp 1, dp 4, ep 2: u = dp; EP groups {0,1},{2,3}; expert-data-parallel {0,2},{1,3}.
    lo = layout(dp=4, ep=2)
    assert lo.ep_group(3) == (2, 3)
    assert lo.edp_group(3) == (1, 3)
    # with tp 2, dp 4, ep 4 the EP group is the 4 DP ranks of a TP lane: 1, 3, 5, 7
    lo = layout(tp=2, dp=4, ep=4)
    assert lo.ep_group(5) == (1, 3, 5, 7)
    assert lo.edp_group(5) == (5,)


def test_tp8_pp8_dp16_shape():
    lo = layout(tp=8, pp=8, dp=16)
    assert lo.shape == (8, 16, 1, 8)
    assert lo.world == 1024
    assert lo.tp_group(0) == tuple(range(8))  # TP inside a node of 8
    assert lo.pp_group(0) == tuple(range(0, 1024, 128))


def test_order_override_and_errors():
    lo = Layout.from_parallel(ParallelSpec(tp=2, dp=2), 4, order=("pp", "cp", "tp", "dp"))
    assert lo.dp_group(0) == (0, 1) and lo.tp_group(0) == (0, 2)
    with pytest.raises(ScenarioError, match="cluster has 8 GPUs"):
        Layout.from_parallel(ParallelSpec(tp=2, dp=2), 8)
    with pytest.raises(ScenarioError, match="ep 3 must divide"):
        Layout.from_parallel(ParallelSpec(dp=4, ep=3), 4)
    with pytest.raises(ScenarioError, match="permutation"):
        Layout.from_parallel(ParallelSpec(), 1, order=("pp", "dp", "tp", "tp"))
