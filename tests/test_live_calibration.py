"""The gloo calibration's arithmetic (benchmarks/live_gloo_calibration.py): no processes, no torch."""
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import live_gloo_calibration as bench  # noqa: E402  (found through the path set just above)


def test_fit_recovers_alpha_and_bandwidth_of_an_exact_ring():
    # n = 4: t = 2(n-1)·α + 2(n-1)/n·S/B = 6α + 1.5·S/B; α = 1 ms, B = 1.5 GB/s
    # → t = 6 ms + S / (1 GB/s): 1 MiB → 6 ms + 1.048576 ms = 7.048576 ms
    rows = [{"bytes": s, "time_s": 6e-3 + s / 1e9} for s in (1 << 10, 1 << 16, 1 << 20, 1 << 22)]
    assert rows[2]["time_s"] == pytest.approx(7.048576e-3, rel=1e-12)
    assert bench.ring_time(1e-3, 1.5e9, 1 << 20) == pytest.approx(7.048576e-3, rel=1e-12)
    alpha, bandwidth = bench.fit(rows)
    assert alpha == pytest.approx(1e-3, rel=1e-9)
    assert bandwidth == pytest.approx(1.5e9, rel=1e-9)


def test_loaded_row_separates_transport_from_arrival_skew():
    # 4 ranks, 2 rounds of (call, return) times in seconds.
    # round 1: calls at 0, 1, 2, 3; returns at 10, 10, 11, 11 → last call 3;
    #   after arrival = mean(10, 10, 11, 11) − 3 = 7.5; skew = 3 − 0 = 3
    # round 2: calls at 20, 20, 20, 24; returns at 30, 30, 30, 30 → after = 30 − 24 = 6; skew = 4
    # span (last return − last call): round 1 11 − 3 = 8, round 2 30 − 24 = 6
    # medians over the 2 rounds: after (7.5 + 6)/2 = 6.75, skew (3 + 4)/2 = 3.5, span (8 + 6)/2 = 7
    # call (each rank's median of return − call, then the mean over ranks):
    #   rank0 (10, 10) → 10; rank1 (9, 10) → 9.5; rank2 (9, 10) → 9.5; rank3 (8, 6) → 7 → mean 9.0
    calls = [[(0, 10), (20, 30)], [(1, 10), (20, 30)], [(2, 11), (20, 30)], [(3, 11), (24, 30)]]
    row = bench._loaded_row(tuple({"bytes": 1024, "calls": c} for c in calls))
    assert row["after_arrival_s"] == pytest.approx(6.75)
    assert row["skew_s"] == pytest.approx(3.5)
    assert row["span_s"] == pytest.approx(7.0)
    assert row["call_s"] == pytest.approx(9.0)
    assert row["time_s"] == row["after_arrival_s"]  # what the fit uses


def test_written_scenario_is_a_star_with_half_alpha_per_link(tmp_path):
    from emulator.live.cost import CommCost
    from emulator.scenario import load_scenario

    path = tmp_path / "cal.yaml"
    bench.write_scenario(1e-3, 1.5e9, [{"bytes": 1024, "time_s": 6e-3}], scenario=str(path))
    graph = json.loads((tmp_path / "cal.graph.json").read_text())
    assert {(ln["latency"], ln["bandwidth"]) for ln in graph["links"]} == {(0.5e-3, 1.5e9)}
    assert len(graph["links"]) == 8  # 4 ranks × 2 directions to the switch
    # the emulated ring all-reduce of 1 MiB: 6 steps × 2 links × 0.5 ms + 1.5 × 2^20 / 1.5e9 = 6 ms + 1.048576 ms
    cost = CommCost(load_scenario(str(path)), 4).collective("all_reduce", (0, 1, 2, 3), 1 << 20)
    assert cost == pytest.approx(7.048576e-3, rel=1e-12)
