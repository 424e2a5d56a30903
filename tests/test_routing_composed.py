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


@pytest.mark.parametrize("fabric", FABRICS)
def test_routes_in_bulk_equal_the_routes_one_by_one(fabric):
    # Router.routes routes the pairs it has not seen together (link ids looked up at once: the routes
    # inside a node, the parts up and down of the others); the tuples must be those of route(a, b)
    t = topo(fabric)
    pairs = [(a, b) for a in range(0, 64, 5) for b in range(64)] + [(9, 17), (9, 17), (3, 3)]
    bulk, one = Router(t), Router(t)
    assert bulk.routes(pairs) == [one.route(a, b) for a, b in pairs]
    assert bulk.routes(pairs) == [one.route(a, b) for a, b in pairs]  # now all from the cache


def test_ring_neighbour_routes_by_hand():
    # 8 DGX A100 on a fat-tree with leaves of 2 nodes (8 spines); a ring channel's three kinds of hop.
    # Latencies: GPU↔NVSwitch 0.15 us per link, GPU↔NIC 0 (PCIe), NIC↔leaf 0.5 us, leaf↔spine 1 us.
    t = topo("{kind: fat_tree, leaf_size: 2}")

    def names(links):
        return [t.links[i] for i in links]

    (inside, across_leaf, across_spine) = Router(t).routes([(3, 4), (15, 16), (31, 32)])
    # GPU 3 → GPU 4 on node 0: up to nvsw0 and down, 0.15 + 0.15 = 0.3 us
    assert names(inside[0]) == [("gpu3", "nvsw0"), ("nvsw0", "gpu4")] and inside[1] == (1.0, 1.0)
    assert inside[2] == pytest.approx(0.3e-6, rel=1e-12)
    # GPU 15 (node 1, local 7, nic1.7) → GPU 16 (node 2, local 0, nic2.0): nodes 0-1 are leaf0 and
    # nodes 2-3 leaf1, so this hop crosses the spines: 0 + 0.5 + 1 + 1 + 0.5 + 0 = 3 us, and each of
    # the 8 leaf→spine and spine→leaf links carries 1/8
    w = dict(zip(names(across_leaf[0]), across_leaf[1]))
    assert w[("gpu15", "nic1.7")] == w[("nic1.7", "leaf0")] == w[("leaf1", "nic2.0")] == w[("nic2.0", "gpu16")] == 1.0
    assert [w[("leaf0", f"spine{k}")] for k in range(8)] == [1 / 8] * 8
    assert [w[(f"spine{k}", "leaf1")] for k in range(8)] == [1 / 8] * 8
    assert len(w) == 4 + 16 and across_leaf[2] == pytest.approx(3e-6, rel=1e-12)
    # GPU 31 (node 3, local 7) → GPU 32 (node 4, local 0): node 3 is on leaf1, node 4 on leaf2: across
    # the spines too; GPU 23 → 24 (nodes 2 → 3) stays on leaf1: 0 + 0.5 + 0.5 + 0 = 1 us, 4 links
    assert len(across_spine[0]) == 20 and across_spine[2] == pytest.approx(3e-6, rel=1e-12)
    (same_leaf,) = Router(t).routes([(23, 24)])
    assert names(same_leaf[0]) == sorted([("gpu23", "nic2.7"), ("nic2.7", "leaf1"), ("leaf1", "nic3.0"),
                                          ("nic3.0", "gpu24")])
    assert same_leaf[1] == (1.0,) * 4 and same_leaf[2] == pytest.approx(1e-6, rel=1e-12)
