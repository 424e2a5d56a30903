"""Topology builders and routing: link rates, oversubscription, ECMP splits, custom graphs."""
import pytest
from helpers import write_graph

from emulator.errors import EmulatorError
from emulator.network.routing import Router
from emulator.network.topology import build_topology, load_graph
from emulator.scenario import load_scenario_text


def topo(fabric, nodes=4):
    sc = load_scenario_text(f"name: t\ncluster: {{nodes: {nodes}, node: dgx-a100, fabric: {fabric}}}\n", "t.yaml")
    return build_topology(sc.cluster)


def test_node_interior_is_an_nvswitch_with_one_port_per_gpu():
    t = topo("{kind: single_switch}", nodes=1)
    d = t.graph.edges["gpu3", "nvsw0"]
    # 300 GB/s line rate, efficiency 230/300 (nccl.csv): capacity 230 GB/s
    assert d["bandwidth"] == 300e9 and t.capacity[t.link_ids[("gpu3", "nvsw0")]] == pytest.approx(230e9)
    assert t.nic_of(3) == "nic0.3"


def test_fat_tree_uplinks_follow_the_oversubscription():
    # leaves of 2 nodes × 8 NICs × 25 GB/s = 400 GB/s down; 2:1 → 200 GB/s up over 8 spines = 25 GB/s each
    t = topo("{kind: fat_tree, leaf_size: 2, oversubscription: 2}")
    assert t.spines == 8 and t.graph.edges["leaf0", "spine3"]["bandwidth"] == pytest.approx(25e9)


def test_ecmp_splits_evenly_over_the_spines():
    t = topo("{kind: fat_tree, leaf_size: 2, oversubscription: 1}")
    links, weights, latency = Router(t).route(0, 16)  # node 0 (leaf 0) → node 2 (leaf 1)
    w = dict(zip((t.links[l] for l in links), weights))
    assert w[("gpu0", "nic0.0")] == 1.0 and w[("nic0.0", "leaf0")] == 1.0
    assert all(w[("leaf0", f"spine{k}")] == pytest.approx(1 / 8) for k in range(8))
    # latency: nic→leaf 0.5 us + leaf→spine 1 us + spine→leaf 1 us + leaf→nic 0.5 us = 3 us
    assert latency == pytest.approx(3e-6)


def test_ring_splits_a_tie_both_ways():
    # 4 nodes on a ring: node 0 → node 2 is two hops either way; each way carries half
    t = topo("{kind: ring}")
    links, weights, _ = Router(t).route(0, 16)
    w = dict(zip((t.links[l] for l in links), weights))
    assert w[("tr0", "tr1")] == pytest.approx(0.5) and w[("tr0", "tr3")] == pytest.approx(0.5)


def test_custom_graph_bfs_ecmp(tmp_path):
    # a diamond: g0 → {a, b} → g1; two equal paths, half each
    nodes = [{"id": i, "kind": k} for i, k in (("g0", "gpu"), ("g1", "gpu"), ("a", "switch"), ("b", "switch"))]
    links = [{"src": s, "dst": d, "bandwidth": "10 GB/s", "latency": "1 us"}
             for s, d in (("g0", "a"), ("g0", "b"), ("a", "g1"), ("b", "g1"))]
    t = load_graph(write_graph(tmp_path, nodes, links))
    links_, weights, latency = Router(t).route(0, 1)
    assert sorted(weights) == [0.5] * 4 and latency == pytest.approx(2e-6)


def test_custom_graph_errors_name_the_problem(tmp_path):
    path = write_graph(tmp_path, [{"id": "g0", "kind": "gpu"}], [{"src": "g0", "dst": "zz", "bandwidth": 1e9}])
    with pytest.raises(EmulatorError, match=r"links\[0\]: unknown node 'zz'"):
        load_graph(path)


def test_a_disconnected_graph_is_a_clear_error(tmp_path):
    from emulator.tools.collective_bench import collective_table

    path = write_graph(tmp_path, [{"id": "a", "kind": "gpu"}, {"id": "b", "kind": "gpu"}], [])
    sc = load_scenario_text(f"name: d\ncluster: {{fabric: {{kind: custom, graph: {path}}}}}\n", "d.yaml")
    with pytest.raises(EmulatorError, match="d.yaml: no route from a to b"):
        collective_table(sc, "all_reduce", [1e6])
