"""Today's AI-cluster fabrics (fat_tree3, multi_plane, dragonfly) and ECMP routing (spray | ecmp_hash).

dgx-a100: 8 GPUs and 8 NICs of 200 Gb/s = 25 GB/s per node; NIC links 0.5 us, fabric links 1 us.
"""
import json
import os
import subprocess
import sys

import pytest

from emulator.errors import ScenarioError
from emulator.network.routing import Router, ecmp_pick
from emulator.network.topology import build_topology
from emulator.run.simulation import simulate
from emulator.scenario import load_scenario, load_scenario_text

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def topo(fabric, nodes=8):
    sc = load_scenario_text(f"name: t\ncluster: {{nodes: {nodes}, node: dgx-a100, fabric: {fabric}}}\n", "t.yaml")
    return build_topology(sc.cluster)


def shares(t, a, b):
    links, weights, latency = Router(t).route(a, b)
    return dict(zip((t.links[l] for l in links), weights)), latency


# ------------------------------------------------------------------ fat_tree3


def test_fat_tree3_has_pods_spines_and_cores_at_the_stated_rates():
    # 8 nodes, 2 per leaf → 4 leaves; 2 leaves per pod → 2 pods; 8 spines per pod (one per NIC), cores = pod_size = 2
    t = topo("{kind: fat_tree3, leaf_size: 2, pod_size: 2}")
    kinds = [n for n, d in t.graph.nodes(data=True) if d["kind"] == "switch" and not n.startswith("nvsw")]
    assert len(kinds) == 4 + 2 * 8 + 8 * 2  # leaves + pod spines + cores
    # leaf–spine: 2 nodes × 8 NICs × 25 GB/s / 8 spines = 50 GB/s; spine–core: 2 leaves × 50 / 2 cores = 50 GB/s
    assert t.graph.edges["leaf3", "spine1.7"]["bandwidth"] == pytest.approx(50e9)
    assert t.graph.edges["spine1.7", "core7.1"]["bandwidth"] == pytest.approx(50e9)
    assert not t.graph.has_edge("spine0.0", "core1.0")  # spine k reaches the cores of plane k only


def test_fat_tree3_routes_through_the_lowest_common_level():
    t = topo("{kind: fat_tree3, leaf_size: 2, pod_size: 2}")
    w, lat = shares(t, 0, 16)  # node 0 (leaf 0) → node 2 (leaf 1), same pod: over the pod's 8 spines
    assert w[("leaf0", "spine0.3")] == pytest.approx(1 / 8) and w[("spine0.3", "leaf1")] == pytest.approx(1 / 8)
    assert lat == pytest.approx(3e-6)  # 0.5 + 1 + 1 + 0.5 us
    w, lat = shares(t, 0, 32)  # node 0 (pod 0) → node 4 (leaf 2, pod 1): 8 spines × 2 cores = 16 paths
    assert w[("leaf0", "spine0.5")] == pytest.approx(1 / 8)
    assert w[("spine0.5", "core5.1")] == pytest.approx(1 / 16) and w[("core5.1", "spine1.5")] == pytest.approx(1 / 16)
    assert w[("spine1.5", "leaf2")] == pytest.approx(1 / 8) and w[("leaf2", "nic4.0")] == 1.0
    assert lat == pytest.approx(5e-6)  # 0.5 + 4 × 1 + 0.5 us


# ------------------------------------------------------------------ multi_plane


def test_multi_plane_keeps_each_nic_index_on_its_own_plane():
    t = topo("{kind: multi_plane, leaf_size: 2, spines: 2}", nodes=4)
    for u, v in t.links:
        if u.startswith("plane") and v.startswith("plane"):
            assert u.split(".")[0] == v.split(".")[0]  # no link joins two planes
    # leaf–spine: 2 nodes × 25 GB/s / 2 spines = 25 GB/s
    assert t.graph.edges["plane5.leaf1", "plane5.spine1"]["bandwidth"] == pytest.approx(25e9)
    w, _ = shares(t, 0, 16)  # gpu0 (nic0.0) → gpu16 (node 2, nic2.0): plane 0, both spines
    assert w[("plane0.leaf0", "plane0.spine1")] == pytest.approx(0.5)


def test_multi_plane_crosses_nvlink_to_the_right_plane():
    t = topo("{kind: multi_plane, leaf_size: 2, spines: 2}", nodes=4)
    w, lat = shares(t, 0, 17)  # gpu0 (plane 0) → gpu17 (node 2, nic2.1, plane 1): via gpu1 and its nic0.1
    assert w[("gpu0", "nvsw0")] == 1.0 and w[("nvsw0", "gpu1")] == 1.0 and w[("gpu1", "nic0.1")] == 1.0
    assert w[("plane1.leaf0", "plane1.spine0")] == pytest.approx(0.5) and ("gpu0", "nic0.0") not in w
    # NVLink hops: 2 × 0.7 us (dgx-a100 intra_latency) ... plus 0.5 + 1 + 1 + 0.5 us of fabric
    node = load_scenario_text("name: t\ncluster: {nodes: 4, node: dgx-a100}\n", "t.yaml").cluster.node
    assert lat == pytest.approx(2 * node.intra_latency + 3e-6)


# ------------------------------------------------------------------ dragonfly


def test_dragonfly_groups_are_all_to_all_and_joined_by_global_links():
    # 16 nodes, one per router, 4 routers per group → 4 groups; one global link per pair of groups
    t = topo("{kind: dragonfly, leaf_size: 1, group_size: 4}", nodes=16)
    assert all(t.graph.has_edge(f"df2.{x}", f"df2.{y}") for x in range(4) for y in range(4) if x != y)
    # groups 0–2: in group 0, group 2 is the 2nd other group (rel 1) → router 1; in group 2, group 0 is rel 0 → router 0
    assert t.graph.has_edge("df0.1", "df2.0") and t.graph.has_edge("df2.0", "df0.1")
    global_links = [(u, v) for u, v in t.links if u.startswith("df") and v.startswith("df") and u[2] != v[2]]
    assert len(global_links) == 2 * 6  # 6 pairs of groups, a cable (2 links) each
    # every link has the NIC rate by default: 25 GB/s
    assert t.graph.edges["df0.1", "df2.0"]["bandwidth"] == pytest.approx(25e9)


def test_dragonfly_minimal_route_is_local_global_local():
    t = topo("{kind: dragonfly, leaf_size: 1, group_size: 4}", nodes=16)
    w, lat = shares(t, 3 * 8, 9 * 8)  # node 3 (df0.3) → node 9 (df2.1): df0.3 → df0.1 → df2.0 → df2.1
    fabric = {e for e in w if e[0].startswith("df") and e[1].startswith("df")}
    assert fabric == {("df0.3", "df0.1"), ("df0.1", "df2.0"), ("df2.0", "df2.1")}
    assert lat == pytest.approx(4e-6)  # 0.5 + 3 × 1 + 0.5 us
    t2 = topo("{kind: dragonfly, leaf_size: 1, group_size: 4, global_links: 2}", nodes=16)
    w, _ = shares(t2, 0, 4 * 8)  # group 0 → group 1 over links m = 0, 1: routers (0·2+m) of each → df0.0, df0.1
    assert w[("df0.0", "df1.0")] == pytest.approx(0.5) and w[("df0.1", "df1.1")] == pytest.approx(0.5)


# ------------------------------------------------------------------ ECMP hashing


def test_ecmp_hash_takes_one_spine_and_the_same_one_every_time():
    t = topo("{kind: fat_tree, leaf_size: 2, routing: ecmp_hash, seed: 7}", nodes=4)
    w, _ = shares(t, 0, 16)
    up = [e for e in w if e[0] == "leaf0"]
    assert len(up) == 1 and w[up[0]] == 1.0  # one path, all the flow
    k = ecmp_pick(7, 0, 16, "leaf0", 8)
    assert up == [("leaf0", f"spine{k}")]
    t2 = topo("{kind: fat_tree, leaf_size: 2, routing: ecmp_hash, seed: 7}", nodes=4)
    assert Router(t2).route(0, 16) == Router(t).route(0, 16)


def test_ecmp_hash_on_a_searched_graph_takes_one_path(tmp_path):
    t = topo("{kind: fat_tree, leaf_size: 2, routing: ecmp_hash, seed: 3}", nodes=4)
    t.failed = frozenset({("leaf0", "spine0")})  # a static failure: the breadth-first router
    links, weights, _ = Router(t).route(0, 16)
    assert set(weights) == {1.0}
    hops = [t.links[l] for l in links]
    assert ("leaf0", "spine0") not in hops and sum(1 for u, _v in hops if u == "leaf0") == 1


def _two_flows(folder, routing):
    """Ranks 0, 1 on node 0 (leaf 0) send S to ranks 2, 3 on node 1 (leaf 1) at once, over 2 spines."""
    trace = {"format": "emulator-trace", "version": 1, "ranks": 4, "ops": [
        {"id": 0, "rank": 0, "kind": "send", "deps": [], "peer": 2, "bytes": 1e9, "tag": 1},
        {"id": 1, "rank": 2, "kind": "recv", "deps": [], "peer": 0, "bytes": 1e9, "tag": 1},
        {"id": 2, "rank": 1, "kind": "send", "deps": [], "peer": 3, "bytes": 1e9, "tag": 2},
        {"id": 3, "rank": 3, "kind": "recv", "deps": [], "peer": 1, "bytes": 1e9, "tag": 2}]}
    with open(os.path.join(folder, "t.json"), "w") as fh:
        json.dump(trace, fh)
    path = os.path.join(folder, "s.yaml")
    with open(path, "w") as fh:
        fh.write("name: two\ncluster:\n  nodes: 2\n  node: {preset: dgx-a100, gpus_per_node: 2, nics: 2}\n"
                 f"  fabric: {{kind: fat_tree, leaf_size: 1, spines: 2, link_bandwidth: 100 Gb/s, {routing}}}\n"
                 "workload: {trace: t.json}\n")
    return path


def test_hashed_flows_that_collide_on_a_spine_take_twice_as_long(tmp_path):
    spray = simulate(load_scenario(_two_flows(str(tmp_path), "routing: spray"))).iteration_time_s
    node = load_scenario(_two_flows(str(tmp_path), "routing: spray")).cluster.node
    c = 12.5e9 * node.nic_efficiency  # a leaf–spine link: 100 Gb/s × the NIC efficiency (below the NIC's 25 GB/s)
    seen = set()
    for seed in range(6):
        t = simulate(load_scenario(_two_flows(str(tmp_path), f"routing: ecmp_hash, seed: {seed}"))).iteration_time_s
        collide = ecmp_pick(seed, 0, 2, "leaf0", 2) == ecmp_pick(seed, 1, 3, "leaf0", 2)
        seen.add(collide)
        # spray: each flow half on each spine → each uplink carries ½r + ½r = r ≤ c: r = c, t = S/c.
        # hashed apart: one flow per uplink, r = c: as spray. Together: two flows on one uplink, r = c/2:
        # S/(c/2) − S/c = S/c = 1e9/c longer.
        assert t - spray == pytest.approx(1e9 / c if collide else 0.0, abs=1e-12)
    assert seen == {True, False}  # seeds 0..5 give both cases


def test_a_seeded_hash_run_is_deterministic_across_processes(tmp_path):
    path = _two_flows(str(tmp_path), "routing: ecmp_hash, seed: 11")
    outs = []
    for hashseed in ("1", "2"):  # Python's own string hashing differs between these processes
        env = dict(os.environ, PYTHONPATH=ROOT, PYTHONHASHSEED=hashseed)
        proc = subprocess.run([sys.executable, "-m", "emulator", "run", path, "--json"], capture_output=True,
                              text=True, env=env, check=True)
        summary = json.loads(proc.stdout)
        summary["sim"].pop("wall_s")
        outs.append(json.dumps(summary, sort_keys=True))
    assert outs[0] == outs[1]


def test_folding_is_off_with_hashed_routing():
    from emulator.run.folding import choose_fold

    sc = load_scenario(os.path.join(ROOT, "scenarios", "llama3-70b-64-h100.yaml"),
                       ["cluster.fabric.routing=ecmp_hash"])
    fold, note = choose_fold(sc)
    assert fold is None and "ecmp_hash" in note


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize("fabric, key, words", [
    ("{kind: single_switch, spines: 4}", "cluster.fabric.spines", "only read with kind: fat_tree | rail"),
    ("{kind: fat_tree, pod_size: 4}", "cluster.fabric.pod_size", "only read with kind: fat_tree3"),
    ("{kind: fat_tree, group_size: 4}", "cluster.fabric.group_size", "only read with kind: dragonfly"),
    ("{kind: dragonfly, group_size: 2, global_links: 3}", "cluster.fabric.global_links", "at most group_size (2)"),
    ("{kind: fat_tree, seed: 4}", "cluster.fabric.seed", "only read with routing: ecmp_hash"),
    ("{kind: fat_tree, routing: hash}", "cluster.fabric.routing", "spray"),
    ("{kind: fat_tree3, pod_size: 0}", "cluster.fabric.pod_size", "an integer from 1 to"),
])
def test_bad_fabric_keys_name_the_file_line_and_key(fabric, key, words):
    text = f"name: t\ncluster:\n  nodes: 8\n  node: dgx-a100\n  fabric: {fabric}\n"
    with pytest.raises(ScenarioError) as err:
        load_scenario_text(text, "s.yaml")
    msg = str(err.value)
    assert msg.startswith("s.yaml:5: " + key) and words in msg and "\n" not in msg


@pytest.mark.parametrize("fabric", ["{kind: multi_plane, leaf_size: 1, spines: 2}",
                                    "{kind: fat_tree3, leaf_size: 1, pod_size: 2}",
                                    "{kind: dragonfly, leaf_size: 1, group_size: 2}"])
def test_folded_equals_unfolded_on_the_new_fabrics(fabric):
    # GPT-3 1.3B, TP 2 × PP 2 × DP 8 on 4 nodes: folding rotates GPUs inside nodes only (NIC i ↔ NIC j,
    # an automorphism of each of these fabrics); the folded run must give the unfolded one's time exactly
    path = os.path.join(ROOT, "scenarios", "quickstart.yaml")
    times = []
    for fold in ("auto", "off"):
        sc = load_scenario(path, ["cluster.nodes=4", "parallel.dp=8", f"cluster.fabric={fabric}",
                                  f"simulation.fold={fold}"])
        r = simulate(sc, record_links=False)
        times.append((r.iteration_time_s, r.ranks_simulated))
    assert times[0][0] == times[1][0] and times[0][1] < times[1][1] == 32


@pytest.mark.parametrize("fabric, nodes, a, b, paths", [
    ("{kind: fat_tree3, leaf_size: 2, pod_size: 2", 8, 0, 32, 16),  # 8 spines × 2 cores
    ("{kind: multi_plane, leaf_size: 2, spines: 4", 4, 0, 16, 4),
    ("{kind: dragonfly, leaf_size: 1, group_size: 4, global_links: 2", 16, 0, 32, 2),
    ("{kind: ring", 4, 0, 16, 2),  # node 0 → node 2 on a ring of 4: two ways round
])
def test_ecmp_hash_takes_one_of_the_sprayed_paths(fabric, nodes, a, b, paths):
    spray, _ = shares(topo(fabric + "}", nodes), a, b)
    hashed, _ = shares(topo(fabric + ", routing: ecmp_hash, seed: 5}", nodes), a, b)
    assert set(hashed.values()) == {1.0} and set(hashed) <= set(spray)
    # spray: the least share of any link is 1/paths (each path carries 1/paths of the flow)
    assert min(spray.values()) == pytest.approx(1 / paths)
