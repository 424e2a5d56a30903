"""Collective algorithms as coupled flows: uncontended times equal the α-β formulas."""
import pytest
from helpers import custom_scenario, star

from emulator.program import COLLECTIVE, Op, Program
from emulator.run.simulation import run_program
from emulator.scenario import load_scenario_text

B, LAT, S = 50e9, 1e-6, 1e9  # star links: 50 GB/s, 1 us each; a hop GPU→switch→GPU has α = 2 us


def _run(tmp_path, n, collective, nbytes=S, root=-1, algorithm="auto"):
    sc = custom_scenario(star(tmp_path, n, bw=B, lat=LAT))
    g = tuple(range(n))
    ops = [Op(r, r, COLLECTIVE, collective=collective, group=g, bytes=nbytes, root=root) for r in g]
    return run_program(Program(n, ops), sc, record_links=False).iteration_time_s


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_gather"])
def test_ring_rs_ag(tmp_path, collective):
    # (n−1)·α + (n−1)/n·S/B = 7 × 2e-6 + 7/8 × 1e9/50e9 = 1.4e-5 + 0.0175 = 0.017514 s
    assert _run(tmp_path, 8, collective) == pytest.approx(0.017514, rel=1e-9)


def test_chain_broadcast(tmp_path):
    # pipelined chain from the root: (n−1)·α + S/B = 3 × 2e-6 + 0.02 = 0.020006 s
    assert _run(tmp_path, 4, "broadcast", root=2) == pytest.approx(0.020006, rel=1e-9)


def test_direct_all_to_all_shares_the_ports(tmp_path):
    # 4 ranks each send S/4 to each of 3 others: every GPU uplink carries 3 flows (and every
    # downlink 3), so each flow gets B/3; S/4 at B/3 takes 0.75·S/B = 0.015 s, after α = 2 us.
    assert _run(tmp_path, 4, "all_to_all") == pytest.approx(2e-6 + 0.015, rel=1e-9)


def test_hierarchical_all_reduce_on_two_nodes():
    # 2 DGX A100 on one switch, a 16-GPU all-reduce of S = 1 GiB, hierarchical:
    #   RS inside each node: 6.05 + 7 × 1.975 us + 7/8 × S / 230e9   (NVLink 300 GB/s × 230/300)
    #   AR across the 2 nodes per local rank (8 rings, S/8 each): 6.05 + 2 × (3 + 2×0.5 + 0) us ...
    # the inter-node step is the path latency (GPU→NIC 0, NIC→sw 0.5 us, sw→NIC 0.5 us, NIC→GPU 0)
    # plus the 3 us software step: α = 4 us; volume 2·1/2·(S/8) at 24 GB/s (25 × 0.96)
    #   AG inside each node: as RS.
    text = ("name: h\ncluster: {nodes: 2, node: dgx-a100, fabric: {kind: single_switch}}\n"
            "collectives: {algorithm: hierarchical}\n")
    sc = load_scenario_text(text, "h.yaml")
    S1 = 2**30
    intra = 6.05e-6 + 7 * 1.975e-6 + 7 / 8 * S1 / 230e9
    inter = 6.05e-6 + 2 * 4e-6 + 2 * (1 / 2) * (S1 / 8) / 24e9
    g = tuple(range(16))
    ops = [Op(r, r, COLLECTIVE, collective="all_reduce", group=g, bytes=S1) for r in g]
    t = run_program(Program(16, ops), sc, record_links=False).iteration_time_s
    assert t == pytest.approx(2 * intra + inter, rel=1e-9)


def test_multi_node_ring_uses_one_channel_per_rail():
    # 2 DGX A100, ring all-reduce over all 16 GPUs: 8 channels, each S/8, each crossing one NIC
    # pair between the nodes at 24 GB/s: busbw = 8 × 24 = 192 GB/s at large sizes (nccl.csv: 192).
    text = "name: r\ncluster: {nodes: 2, node: dgx-a100, fabric: {kind: fat_tree}}\n"
    sc = load_scenario_text(text, "r.yaml")
    from emulator.tools.collective_bench import collective_table

    (row,) = collective_table(sc, "all_reduce", [8 * 2**30])
    assert row["busbw_GB_per_s"] == pytest.approx(192.0, rel=0.005)


def test_nvls_all_reduce_reaches_the_measured_bus_bandwidth():
    # one DGX H100, NVLS all-reduce of S over 8 GPUs: each GPU sends S up and receives S down, two steps.
    # Link capacity 450 GB/s × 370/450 = 370 GB/s; volume 2·7/8 × 370/480 per byte, so
    #   t = 6.05 us + 2 × (2 × 0.15 + 1.675) us + 7/4 × S / 480e9      (busbw → 480, nccl.csv NVLS row)
    from emulator.tools.collective_bench import collective_table

    text = "name: n\ncluster: {nodes: 1, node: dgx-h100}\ncollectives: {algorithm: nvls}\n"
    sc = load_scenario_text(text, "n.yaml")
    S1 = 2**30
    g = tuple(range(8))
    ops = [Op(r, r, COLLECTIVE, collective="all_reduce", group=g, bytes=S1) for r in g]
    t = run_program(Program(8, ops), sc, record_links=False).iteration_time_s
    assert t == pytest.approx(6.05e-6 + 2 * 1.975e-6 + 7 / 4 * S1 / 480e9, rel=1e-9)
    (row,) = collective_table(sc, "all_reduce", [8 * 2**30])
    assert row["busbw_GB_per_s"] == pytest.approx(480.0, rel=0.001)
    # across two nodes (or for another op) NVLS does not apply: the ring of the same scenario
    two = load_scenario_text(text.replace("nodes: 1", "nodes: 2"), "n.yaml")
    ring = load_scenario_text(text.replace("nodes: 1", "nodes: 2").replace("nvls", "ring"), "n.yaml")
    assert collective_table(two, "all_reduce", [S1]) == collective_table(ring, "all_reduce", [S1])
    assert collective_table(sc, "all_gather", [S1]) == \
        collective_table(load_scenario_text(text.replace("nvls", "ring"), "n.yaml"), "all_gather", [S1])


def test_nvls_needs_a_node_that_has_it():
    from emulator.errors import ScenarioError

    with pytest.raises(ScenarioError, match="collectives.algorithm: nvls needs a catalog or inline node"):
        load_scenario_text("name: n\ncluster: {nodes: 1, node: dgx-a100}\ncollectives: {algorithm: nvls}\n", "n.yaml")


def test_disjoint_sum_by_hand():
    from emulator.network.collectives import _disjoint_sum

    # two routes on links {1, 5} and {3}: no link on both, so the flow is their union, sorted, each
    # link with its own weight (0.0 + w is w)
    assert _disjoint_sum([((1, 5), (1.0, 0.5), 0.0), ((3,), (0.25,), 0.0)]) == ((1, 3, 5), (1.0, 0.25, 0.5))
    # link 5 on both: None (the caller sums them in hop order)
    assert _disjoint_sum([((1, 5), (1.0, 0.5), 0.0), ((5,), (0.5,), 0.0)]) is None


@pytest.mark.parametrize("op,group,algorithm", [
    ("all_reduce", tuple(range(32)), "ring"), ("all_gather", (0, 1, 8, 9, 24, 25), "ring"),
    ("broadcast", tuple(range(0, 32, 4)), "ring"), ("all_to_all", (0, 9, 18, 27), "ring"),
    ("all_reduce", tuple(range(32)), "tree")])  # a tree's flow crosses a head's NIC port on several hops
def test_flows_are_their_hops_routes_summed_in_order(op, group, algorithm):
    # every flow of a plan carries, on each link, the sum of the weights its hops' routes put there, in
    # hop order (0.0 + w1 + w2 ...); 4 DGX A100 on a fat-tree with leaves of 2 nodes, no fold
    from emulator.network.collectives import CollectiveModel
    from emulator.network.raw_plan import StepCosts
    from emulator.network.routing import Router
    from emulator.network.topology import build_topology

    sc = load_scenario_text("name: f\ncluster: {nodes: 4, node: dgx-a100, fabric: {kind: fat_tree, leaf_size: 2}}\n",
                            "f.yaml")
    topo = build_topology(sc.cluster)
    model = CollectiveModel(Router(topo), topo.node_of, StepCosts(), algorithm)
    root = group[1] if op == "broadcast" else -1
    raw = model._raw(op, group, root, model.candidates(op, group)[0])
    plan = model.collective(op, group, root)
    for phase, raw_phase in zip(plan, raw):
        for flow, (hops, volume, latency, _merged) in zip(phase, raw_phase):
            sums: dict[int, float] = {}
            for a, b, scale in hops:
                links, weights, _lat = Router(topo).route(a, b)
                for link, w in zip(links, weights):
                    sums[link] = sums.get(link, 0.0) + w * scale
            assert flow.links == tuple(sorted(sums)) and flow.weights == tuple(sums[k] for k in sorted(sums))
            assert (flow.volume, flow.latency) == (volume, latency)
