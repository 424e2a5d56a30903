"""Routes on leaf-switched fabrics composed from cached parts (up from a, switch paths, down to b).

The composed route must equal, link by link, the even split over all shortest paths that a
breadth-first search of the graph finds (an independent implementation: σ counts), with the
latency of the slowest path. dgx-a100: 8 GPUs, 8 NICs of 25 GB/s; NIC links 0.5 us, fabric 1 us.
"""
import pytest

from emulator.network.routing import Router
from emulator.network.topology import build_topology
from emulator.scenario import load_scenario_text

FABRICS = ["{kind: fat_tree, leaf_size: 2}", "{kind: rail, leaf_size: 2}",
           "{kind: fat_tree3, leaf_size: 2, pod_size: 2}", "{kind: multi_plane, leaf_size: 2, spines: 2}",
           "{kind: dragonfly, leaf_size: 1, group_size: 2, global_links: 2}", "{kind: single_switch}"]


def topo(fabric, nodes=8):
    sc = load_scenario_text(f"name: t\ncluster: {{nodes: {nodes}, node: dgx-a100, fabric: {fabric}}}\n", "t.yaml")
    return build_topology(sc.cluster)


@pytest.mark.parametrize("fabric", FABRICS)
def test_composed_routes_are_exactly_the_structured_paths(fabric):
    # the reference: the whole weighted path of structured_path, its links summed and its latency by
    # the longest-path DP (the router's way for ECMP hashing); equal to the last bit
    t = topo(fabric)
    fast, whole = Router(t), Router(t)
    whole.fast = False
    assert fast.fast
    for a in range(64):
        for b in range(64):
            assert fast.route(a, b) == whole.route(a, b), (a, b)


@pytest.mark.parametrize("fabric", [f for f in FABRICS if "fat_tree" in f or "single" in f])
def test_composed_routes_equal_the_breadth_first_even_split(fabric):
    # fat-trees route over every shortest path, so a breadth-first search of the graph (σ counts, the
    # router of custom graphs) must agree (rails and dragonflies use a routing policy instead)
    t = topo(fabric)
    fast, search = Router(t), Router(t)
    search.structured = search.fast = False
    for a in range(0, 64, 3):
        for b in range(64):
            links, weights, lat = fast.route(a, b)
            ref_links, ref_weights, ref_lat = search.route(a, b)
            assert links == ref_links, (a, b)
            assert weights == pytest.approx(ref_weights, rel=1e-12), (a, b)
            assert lat == pytest.approx(ref_lat, rel=1e-12), (a, b)


def test_composed_fat_tree3_route_by_hand():
    # 8 nodes, leaf_size 2 → leaves 0-3; pods of 2 leaves; 8 spines per pod, 2 cores per spine position.
    # GPU 0 (node 0, leaf 0, pod 0) → GPU 40 (node 5, leaf 2, pod 1): 8 spines × 2 cores = 16 paths.
    t = topo("{kind: fat_tree3, leaf_size: 2, pod_size: 2}")
    links, weights, lat = Router(t).route(0, 40)
    w = dict(zip((t.links[i] for i in links), weights))
    assert w[("gpu0", "nic0.0")] == 1.0 and w[("nic0.0", "leaf0")] == 1.0
    assert w[("leaf0", "spine0.3")] == 2 * (1 / 16)  # two cores below each pod-0 spine: 1/16 + 1/16
    assert w[("spine0.3", "core3.1")] == 1 / 16
    assert w[("leaf2", "nic5.0")] == 1.0 and w[("nic5.0", "gpu40")] == 1.0
    assert len(links) == 2 + 8 + 16 + 16 + 8 + 2  # up, leaf→spines, spine→cores, cores→spines, spines→leaf, down
    assert lat == pytest.approx(5e-6)  # 0 (PCIe) + 0.5 + 4 × 1 + 0.5 + 0 us
