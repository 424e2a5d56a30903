"""NCCL's algorithms as flows: the double binary tree, CollNet (SHARP), `auto`, uneven nodes, broadcast."""
import json

import pytest

from emulator.cli import main
from emulator.errors import ScenarioError
from emulator.program import COLLECTIVE, Op, Program
from emulator.run.simulation import run_program
from emulator.scenario import load_scenario_text
from emulator.tools.collective_bench import collective_table

S = 2**30
# dgx-a100 (catalog): launch 6.05 us; a step inside the node 2 × 0.15 + 1.675 = 1.975 us; NIC 25 GB/s × 0.96
# = 24 GB/s. Across a single switch a step is NIC→sw 0.5 + sw→NIC 0.5 + 3 us software = 4 us; across a
# fat-tree's spine 0.5 + 1 + 1 + 0.5 + 3 = 6 us.
LAUNCH, INTRA, NIC = 6.05e-6, 1.975e-6, 24e9


def _scenario(nodes, fabric="single_switch", algorithm="ring", extra=""):
    text = (f"name: t\ncluster: {{nodes: {nodes}, node: dgx-a100, fabric: {{kind: {fabric}{extra}}}}}\n"
            f"collectives: {{algorithm: {algorithm}}}\n")
    return load_scenario_text(text, "t.yaml")


def _time(sc, n, op="all_reduce", nbytes=S, root=-1):
    g = tuple(range(n))
    ops = [Op(r, r, COLLECTIVE, collective=op, group=g, bytes=nbytes, root=root) for r in g]
    return run_program(Program(n, ops), sc, record_links=False).iteration_time_s


def test_eight_bytes_on_128_nodes_auto_beats_the_ring():
    # ring: 2·1023 = 2046 steps at the slowest hop (6 us, across the spine): 6.05 + 2046 × 6 = 12282.05 us
    # auto picks the tree (test_nccl_tuning): 2·(7 chain steps × 1.975 + depth log2 128 = 7 × 6 us) + 6.05
    #   = 6.05 + 2 × (13.825 + 42) = 117.70 us. The 8 bytes add < 1e-9 s to either.
    ring = _time(_scenario(128, "fat_tree"), 1024, nbytes=8)
    auto = _time(_scenario(128, "fat_tree", "auto"), 1024, nbytes=8)
    assert ring == pytest.approx(LAUNCH + 2046 * 6e-6, rel=1e-6)
    assert auto == pytest.approx(LAUNCH + 2 * (7 * INTRA + 7 * 6e-6), rel=1e-6)
    assert auto < ring


def test_on_two_nodes_auto_runs_the_faster_tree_where_nccl_would_pick_the_ring():
    # auto picks by the emulator's own cost (collectives.py). On 2 nodes the tree's halves cross the NICs once
    # each way, S/8 per NIC and direction; each ring channel carries 2·15/16·S/8 over its hop between the
    # nodes: the tree is faster at 1 GiB too (8.2 ms against 10.6 ms), where NCCL's model picks the ring
    # (tuning.choose: ring Simple). The protocol shown is NCCL's best for the tree.
    from emulator.network.tuning import Comm, choose, hardware

    sc = _scenario(2, algorithm="auto")
    rows = collective_table(sc, "all_reduce", [8, S])
    assert [(r["algorithm"], r["protocol"]) for r in rows] == [("tree", "LL"), ("tree", "Simple")]
    ring = collective_table(_scenario(2), "all_reduce", [S])[0]["time_s"]
    tree = collective_table(_scenario(2, algorithm="tree"), "all_reduce", [S])[0]["time_s"]
    assert rows[1]["time_s"] == tree < ring
    nccl = choose("all_reduce", S, Comm(16, 2, 8, NIC / 1e9), hardware(sc.cluster), ("ring", "tree"))
    assert nccl.algorithm == "ring"


def test_tree_all_reduce_on_four_nodes():
    # trees over 4 nodes: parents [-1, 2, 0, 2] and the mirror [1, 3, 1, -1]. Per channel (8, one per NIC)
    # one flow per tree, S/16 each. Node 2 is interior in tree 0: its NIC sends up to 0 and down to 1 and 3
    # (weight 3) and, a leaf of tree 1, once for it: 3·f0 + f1 ≤ 24 GB/s; node 1 the other way round:
    # f0 + 3·f1 ≤ 24 → f0 = f1 = 6 GB/s, S/16 at 6 GB/s. Latency 6.05 + 2·(7 × 1.975 + depth 2 × 4) us.
    t = _time(_scenario(4, algorithm="tree"), 32)
    assert t == pytest.approx(LAUNCH + 2 * (7 * INTRA + 2 * 4e-6) + S / 16 / 6e9, rel=1e-9)


def test_collnet_reduces_in_the_switch():
    # 4 nodes with SHARP, pipelined: per local position c one flow of S/8: the 7 other GPUs of each node
    # send it to member c (weight 1 on their NVLink uplinks), c sends it to the switch and back, c hands
    # the sum to the 7 (weight 7 on its uplink). Each GPU uplink: 7·r (its own channel) + 7 × r (the
    # others) = 14·r ≤ 230 GB/s, so r = 230/14 = 16.43 GB/s < 24 GB/s on the NIC, which carries the flow
    # once each way, on the first node too (merged in the switch; summed, 3·r ≤ 24 would bind at 8 GB/s).
    # Time: 6.05 + 2·(1.975 + 4) us + (S/8) / (230e9/14) = ... + 1.75·S / 230e9.
    t = _time(_scenario(4, algorithm="collnet", extra=", sharp: true"), 32)
    assert t == pytest.approx(LAUNCH + 2 * (INTRA + 4e-6) + 1.75 * S / 230e9, rel=1e-9)
    # the hierarchical ring across the 4 nodes: RS, 2·3/4·S/8 at 24 GB/s, AG, one after the other: slower
    hier = 2 * (LAUNCH + 7 * INTRA + 7 / 8 * S / 230e9) + LAUNCH + 6 * 4e-6 + 1.5 * S / 8 / NIC
    assert _time(_scenario(4, algorithm="hierarchical"), 32) == pytest.approx(hier, rel=1e-9)
    assert hier > t


def test_auto_may_choose_collnet_only_with_sharp():
    # 16 nodes, 256 MiB, NCCL's model: CollNet Direct 44 us + S / (8 × 24 × .5 = 96 GB/s) = 2840 us against
    # the ring's (8.4 + 224 × 3.4 + 30 × 14) × 1.4 = 1666 us + S / (192 × 128/254 = 96.76 GB/s) = 4440 us
    sharp = collective_table(_scenario(16, "fat_tree", "auto", ", sharp: true"), "all_reduce", [2**28])
    plain = collective_table(_scenario(16, "fat_tree", "auto"), "all_reduce", [2**28])
    assert sharp[0]["algorithm"] == "collnet" and plain[0]["algorithm"] != "collnet"
    assert sharp[0]["time_s"] < plain[0]["time_s"]


def test_uneven_split_uses_as_many_channels_as_the_smaller_node_allows():
    # 12 GPUs on 2 DGX A100 (8 + 4): 4 ring channels (one per GPU, and NIC, of the smaller node), each
    # 2·11/12·S/4 at 24 GB/s; 22 steps at 4 us. Before: one channel, 4 times slower (busbw 23.97 GB/s).
    (row,) = collective_table(_scenario(2), "all_reduce", [S], gpus=12)
    t = LAUNCH + 22 * 4e-6 + 2 * 11 / 12 * S / 4 / NIC
    assert row["time_s"] == pytest.approx(t, rel=1e-9)
    assert row["busbw_GB_per_s"] == pytest.approx(2 * 11 / 12 * S / t / 1e9, rel=1e-12)  # 95.56 GB/s


def test_broadcast_uses_every_ring_channel():
    # 16 GPUs on 2 DGX A100: 8 chains from the root along the 8 ring channels, S/8 each at 24 GB/s,
    # 15 steps at 4 us. Before: one chain, S at 24 GB/s (busbw 23.96 GB/s).
    (row,) = collective_table(_scenario(2), "broadcast", [S])
    t = LAUNCH + 15 * 4e-6 + S / 8 / NIC
    assert row["time_s"] == pytest.approx(t, rel=1e-9)
    assert row["busbw_GB_per_s"] == pytest.approx(S / t / 1e9, rel=1e-12)  # 189.76 GB/s


def test_auto_changes_nothing_but_all_reduce_and_ring_stays_the_default():
    assert load_scenario_text("name: t\ncluster: {nodes: 2, node: dgx-a100}\n", "t.yaml").collectives.algorithm \
        == "ring"
    for op in ("all_gather", "reduce_scatter", "broadcast", "all_to_all"):
        auto = collective_table(_scenario(4, algorithm="auto"), op, [2**20])
        ring = collective_table(_scenario(4), op, [2**20])
        assert [r["time_s"] for r in auto] == [r["time_s"] for r in ring]
        assert auto[0]["algorithm"] == ("direct" if op == "all_to_all" else "ring")


def test_collective_prints_the_algorithm_per_size(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("name: c\ncluster: {nodes: 2, node: dgx-a100}\ncollectives: {algorithm: auto}\n")
    assert main(["collective", str(path), "--sizes", "8B:1GiB"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].endswith("algorithm")
    assert lines[2].endswith("tree (LL)") and lines[-1].endswith("tree (Simple)")
    assert main(["collective", str(path), "--sizes", "1GiB", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["algorithm"] == "tree"


def test_sharp_and_collnet_are_checked():
    with pytest.raises(ScenarioError, match="cluster.fabric.sharp: in-network reduction needs switches"):
        _scenario(4, "ring", extra=", sharp: true")
    with pytest.raises(ScenarioError, match="collectives.algorithm: collnet reduces in the switches"):
        _scenario(4, algorithm="collnet")
    with pytest.raises(ScenarioError, match="sharp"):
        _scenario(4, extra=", sharp: 3")


def test_tree_runs_folded_as_unfolded():
    # a data-parallel GPT on 4 nodes with the tree: the folded run equals the rank-by-rank one
    text = ("name: f\ncluster: {nodes: 4, node: dgx-a100, fabric: {kind: fat_tree, leaf_size: 2}}\n"
            "model: {preset: gpt3-125m}\ntraining: {global_batch: 32, micro_batch: 1}\n"
            "parallel: {tp: 4, pp: 1}\ncollectives: {algorithm: tree}\nsimulation: {fold: FOLD}\n")
    from emulator.run.simulation import simulate

    on = simulate(load_scenario_text(text.replace("FOLD", "auto"), "f.yaml"), record_links=False)
    off = simulate(load_scenario_text(text.replace("FOLD", "off"), "f.yaml"), record_links=False)
    assert on.ranks_simulated < off.ranks_simulated == 32
    assert on.iteration_time_s == pytest.approx(off.iteration_time_s, rel=1e-12)


def test_a_forced_algorithm_that_nccl_would_not_run_has_no_protocol():
    # NVLS on an inline A100 node: NCCL's nvlsEfficiency for Ampere is 0 (no NVLS), so its table has no
    # protocol for it; the emulator runs it as asked and says so with an empty protocol
    text = ("name: n\ncluster:\n  nodes: 1\n  node: {preset: dgx-a100, nvls_busbw: 300 GB/s}\n"
            "collectives: {algorithm: nvls}\n")
    (row,) = collective_table(load_scenario_text(text, "n.yaml"), "all_reduce", [S])
    assert (row["algorithm"], row["protocol"]) == ("nvls", "")
