"""Physics of the fabrics (issue 30): torus links by dimension size, a timed failure of a whole
switch, and the bandwidth floor of a degraded link."""
import pytest

from emulator.network.topology import build_topology, torus_links
from emulator.scenario import load_scenario_text
from emulator.tools.collective_bench import collective_table


def _scenario(fabric, nodes=4, extra=""):
    return load_scenario_text(f"name: t\ncluster: {{nodes: {nodes}, node: dgx-a100, fabric: {fabric}{extra}}}\n",
                              "t.yaml")


def _link_bw(fabric, nodes, a, b):
    return build_topology(_scenario(fabric, nodes).cluster).graph.edges[a, b]["bandwidth"]


# -- torus: a dimension of size 1 has no link, one of size 2 a single neighbour ---------------------
def test_torus_links_count_the_neighbours_of_one_router():
    # size 1: no neighbour; size 2: +1 and −1 are the same node (1 cable); size ≥ 3: two
    assert torus_links((4,)) == 2 and torus_links((4, 1)) == 2 and torus_links((2, 2)) == 2
    assert torus_links((2,)) == 1 and torus_links((1,)) == 0 and torus_links((4, 4, 2)) == 5


def test_a_trailing_one_leaves_the_link_rate_as_the_ring():
    # dgx-a100: 8 NICs × 200 Gb/s = 200 GB/s per node, over 2 ring links: 100 GB/s each ([4, 1] was 50)
    ring = _link_bw("{kind: torus, torus_dims: [4]}", 4, "tr0", "tr1")
    flat = _link_bw("{kind: torus, torus_dims: [4, 1]}", 4, "tr0", "tr1")
    assert ring == flat == pytest.approx(100e9)


def test_a_two_by_two_torus_is_a_four_ring():
    # [2, 2]: node 0 = (0, 0) has neighbours 1 = (0, 1) and 2 = (1, 0), one cable each: 200/2 = 100 GB/s
    assert _link_bw("{kind: torus, torus_dims: [2, 2]}", 4, "tr0", "tr1") == pytest.approx(100e9)
    assert _link_bw("{kind: torus, torus_dims: [2, 2]}", 4, "tr0", "tr2") == pytest.approx(100e9)
    # the same 4-cycle: an all-reduce over all 32 GPUs takes the time of the 4-node ring's
    size = 2**28
    ring = collective_table(_scenario("{kind: ring}"), "all_reduce", [size])[0]["time_s"]
    torus = collective_table(_scenario("{kind: torus, torus_dims: [2, 2]}"), "all_reduce", [size])[0]["time_s"]
    assert torus == pytest.approx(ring, rel=0.02)


def test_a_two_node_ring_is_one_cable_of_the_whole_nic_total():
    # 2 nodes: one neighbour, so the one cable carries the NIC total, 200 GB/s (it was 100)
    assert _link_bw("{kind: ring}", 2, "tr0", "tr1") == pytest.approx(200e9)
    # as single_switch: every NIC has its own 25 GB/s port; the cable between the routers never binds.
    # Big messages are bandwidth-bound, so the two agree to the extra hop's latency (1 us per step)
    size = 2**30
    switch = collective_table(_scenario("{kind: single_switch}", 2), "all_reduce", [size])[0]["time_s"]
    ring = collective_table(_scenario("{kind: ring}", 2), "all_reduce", [size])[0]["time_s"]
    assert ring == pytest.approx(switch, rel=0.01)


# -- the bandwidth floor of a degraded link ----------------------------------------------------------
def _degraded(*overrides):
    items = ", ".join(overrides)
    return load_scenario_text(f"name: d\ncluster: {{nodes: 2, node: dgx-a100, overrides: [{items}]}}\n", "d.yaml")


def test_a_degrade_below_the_bandwidth_floor_is_refused_by_key():
    from emulator.errors import EmulatorError

    # nic0.0 -> sw: 200 Gb/s × 1e-300 = 2e-289 b/s, far below the 1 Mb/s floor of every bandwidth key
    # (it printed a 298-digit iteration time); a timed one is refused the same way
    for timed in ("", ", at: 1 ms"):
        sc = _degraded(f'{{kind: link_degrade, target: "nic0.0->sw", factor: 1e-300{timed}}}')
        with pytest.raises(EmulatorError, match=r"d\.yaml: cluster\.overrides\[0\]\.factor: .*1 Mb/s.*"
                                                r"at least 5e-06, got 1e-300"):
            collective_table(sc, "all_reduce", [1e6])


def test_degrades_multiply_against_the_floor():
    from emulator.errors import EmulatorError

    # 25 GB/s × 1e-5 = 250 kB/s ≥ 125 kB/s (1 Mb/s): runs; × 1e-3 × 1e-3 = 25 kB/s: the second is refused
    collective_table(_degraded('{kind: link_degrade, target: "nic0.0->sw", factor: 1e-5}'), "all_reduce", [1e3])
    two = _degraded('{kind: link_degrade, target: "nic0.0->sw", factor: 1e-3}',
                    '{kind: link_degrade, target: "nic0.0<->sw", factor: 1e-3}')
    with pytest.raises(EmulatorError, match=r"overrides\[1\]\.factor: .*at least 0\.005, got 0\.001"):
        collective_table(two, "all_reduce", [1e6])


def test_a_trailing_one_changes_no_training_iteration():
    # issue 30: [4, 1] took 43.7 ms against 22.0 ms for [4] (its links had half the rate); now the same graph
    from emulator.run.simulation import simulate

    text = ("name: i\ncluster: {nodes: 4, node: dgx-h100, fabric: {kind: torus, torus_dims: DIMS}}\n"
            "model: {preset: gpt3-125m}\ntraining: {global_batch: 32, micro_batch: 1}\nparallel: {tp: 2, pp: 2}\n")
    ring, flat = (simulate(load_scenario_text(text.replace("DIMS", d), "i.yaml"), record_links=False).iteration_time_s
                  for d in ("[4]", "[4, 1]"))
    assert flat == ring
