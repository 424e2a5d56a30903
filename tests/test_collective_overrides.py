"""`emulator collective` with overrides (issue 30): timed link faults are played on each size's run,
a gpu_slowdown is refused by name; and a timed failure of a whole spine goes round it, as ECMP does."""
import pytest

from emulator.errors import EmulatorError
from emulator.scenario import load_scenario_text
from emulator.tools.collective_bench import collective_table, fault_notes

SIZES = [2**29, 2**30]


def _bench(overrides="", sizes=SIZES):
    # 2 DGX A100 on a fat-tree of one node per leaf: 8 spines, each leaf–spine link 8 × 25 GB/s / 8 = 25 GB/s
    sc = load_scenario_text("name: s\ncluster: {nodes: 2, node: dgx-a100, fabric: {kind: fat_tree, leaf_size: 1}, "
                            f"overrides: [{overrides}]}}\n", "s.yaml")
    return collective_table(sc, "all_reduce", sizes)


def _slope(rows):
    """Seconds per extra 512 MiB: the bandwidth term alone (the latencies cancel)."""
    return rows[1]["time_s"] - rows[0]["time_s"]


def test_a_timed_spine_failure_goes_round_the_spine():
    # The ring's 8 channels each cross leaf0 -> leaf1 spread 1/8 over each spine: with rate r per channel a
    # leaf–spine link carries 8 · r/8 = r, as much as a NIC port, so both bind. With spine0 down the other 7
    # carry 8 · r/7 each: r falls to 7/8, and the bandwidth term grows by 8/7.
    healthy = _bench()
    timed = _bench("{kind: link_fail, target: spine0, at: 1 ns}")
    static = _bench("{kind: link_fail, target: spine0}")
    assert _slope(timed) == pytest.approx(_slope(healthy) * 8 / 7, rel=1e-9)
    # failing at 1 ns is failing from the start, as the static router (breadth-first ECMP round spine0) has it
    assert [r["time_s"] for r in timed] == pytest.approx([r["time_s"] for r in static], rel=1e-12)
    for row in timed:  # every flow went round (before: each stalled, "no way round ... deadlock")
        (fault,) = row["faults"]
        assert fault["rerouted"] > 0 and fault["stalled"] == 0
    assert fault_notes(timed) == ["link_fail spine0 from 1e-09 s for good (each size starts at 0 s): it moved "
                                  "the flows of 2 of 2 sizes"]


def test_a_timed_degrade_is_played_in_the_collective():
    # every link of nic0.0 at half its rate from 1 ns: ring channel 0 crosses nic0.0's port (its only
    # bottleneck, as a NIC port binds each channel), so it streams at half the rate, takes twice as long,
    # and the all-reduce ends with its last channel: the bandwidth term doubles
    healthy = _bench()
    half = _bench("{kind: link_degrade, target: nic0.0, factor: 0.5, at: 1 ns}")
    assert half[1]["faults"][0]["kind"] == "link_degrade"
    assert _slope(half) == pytest.approx(_slope(healthy) * 2, rel=1e-9)


def test_a_fault_after_the_collective_changes_nothing():
    # 1 GiB takes ~12 ms: a failure at 1 s comes after it, and the row says it moved no flow
    late = _bench("{kind: link_fail, target: spine0, at: 1 s}")
    assert [r["time_s"] for r in late] == [r["time_s"] for r in _bench()]
    assert late[0]["faults"][0]["rerouted"] == 0


def test_a_gpu_slowdown_is_refused_by_name():
    with pytest.raises(EmulatorError, match=r"s\.yaml: cluster\.overrides\[0\]: gpu_slowdown gpu:3 slows compute"):
        _bench("{kind: gpu_slowdown, target: 'gpu:3', factor: 2}")


def test_a_run_goes_round_a_spine_that_fails_in_the_middle():
    from emulator.run.simulation import simulate

    # gpt3-125m, dp 16 on the same two leaves: its gradient all-reduces cross the spines. Failing spine0 at
    # 1 ns is failing it from the start (the static router goes round it); at 5 ms it is mid-run, and the
    # flows on it go round (before: "no way round ... deadlock", exit 2)
    text = ("name: r\ncluster: {nodes: 2, node: dgx-a100, fabric: {kind: fat_tree, leaf_size: 1}, overrides: [OV]}\n"
            "model: {preset: gpt3-125m}\ntraining: {global_batch: 16, micro_batch: 1}\nparallel: {dp: 16}\n")

    def run(ov):
        return simulate(load_scenario_text(text.replace("OV", ov), "r.yaml"), record_links=False)

    static = run("{kind: link_fail, target: spine0}").iteration_time_s
    early = run("{kind: link_fail, target: spine0, at: 1 ns}")
    assert early.iteration_time_s == pytest.approx(static, rel=1e-12)
    mid = run("{kind: link_fail, target: spine0, at: 5 ms}")
    assert mid.faults[0].rerouted > 0 and mid.faults[0].stalled == 0


def test_a_rail_spine_that_fails_in_time_is_left_out_as_from_the_start():
    # rail-optimized, one node per rail group: rail switch i of each node joined by the 8 spines. The
    # spines are siblings (the same neighbours: every rail switch), so the even split over the 7 live ones
    # is the static router's split round spine3
    def rail(ov):
        sc = load_scenario_text("name: r\ncluster: {nodes: 2, node: dgx-a100, fabric: {kind: rail, leaf_size: 1}, "
                                f"overrides: [{ov}]}}\n", "r.yaml")
        return [r["time_s"] for r in collective_table(sc, "all_reduce", SIZES)]

    timed = rail("{kind: link_fail, target: spine3, at: 1 ns}")
    assert timed == pytest.approx(rail("{kind: link_fail, target: spine3}"), rel=1e-12)
    assert timed[1] > rail("")[1]
