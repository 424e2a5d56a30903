"""Symmetry folding gives the same iteration as the unfolded run (DESIGN.md, "Speed")."""
import pytest

from emulator.run.folding import choose_fold
from emulator.run.simulation import simulate
from emulator.scenario import load_scenario_text

BASE = """
name: fold
cluster: {{nodes: {nodes}, node: dgx-a100, fabric: {{kind: {fabric}, oversubscription: {os}, leaf_size: {leaf}}}}}
model: {{preset: gpt3-1.3b, layers: 8, experts: {experts}, top_k: {top_k}}}
training: {{global_batch: {gb}, micro_batch: 1}}
parallel: {{tp: {tp}, pp: {pp}, dp: {dp}, ep: {ep}, zero: {zero}, schedule: {sched}, virtual_stages: {v}}}
"""
MOE = dict(experts=0, top_k=0, ep=1)
CASES = {
    # 64 GPUs: TP 8 × PP 2 × DP 4 on an oversubscribed fat-tree, leaves of 2 nodes
    "64-tp-pp-dp-oversub": dict(nodes=8, fabric="fat_tree", os=2, leaf=2, gb=32, tp=8, pp=2, dp=4, zero=0, sched="1f1b", v=1),
    # 128 GPUs: interleaved 1F1B, ZeRO-1, DP split across leaves
    "128-interleaved-zero1": dict(nodes=16, fabric="fat_tree", os=2, leaf=4, gb=64, tp=4, pp=2, dp=16, zero=1,
                                  sched="interleaved-1f1b", v=2),
    # 256 GPUs: TP 2 (dp steps inside a node), 4:1 oversubscription
    "256-dp-inside-and-across-nodes": dict(nodes=32, fabric="fat_tree", os=4, leaf=4, gb=64, tp=2, pp=4, dp=32,
                                           zero=1, sched="1f1b", v=1),
    "64-rail-gpipe": dict(nodes=8, fabric="rail", os=1, leaf=4, gb=32, tp=2, pp=2, dp=16, zero=0, sched="gpipe", v=1),
    # 128 GPUs of MoE: 8 experts, EP 4 carved out of DP 16 (EP blocks inside a node and across)
    "128-moe-ep4": dict(nodes=16, fabric="fat_tree", os=2, leaf=4, gb=64, tp=2, pp=4, dp=16, zero=1, sched="1f1b",
                        v=1, experts=8, top_k=2, ep=4),
}
for _c in CASES.values():
    for _k, _v in MOE.items():
        _c.setdefault(_k, _v)


@pytest.mark.parametrize("name", sorted(CASES))
def test_folded_equals_unfolded(name):
    text = BASE.format(**CASES[name])
    folded = simulate(load_scenario_text(text, "x.yaml"), record_links=False)
    flat = simulate(load_scenario_text(text, "x.yaml", ["simulation.fold=off"]), record_links=False)
    assert folded.ranks_simulated < flat.ranks_simulated == folded.program.ranks
    assert folded.iteration_time_s == pytest.approx(flat.iteration_time_s, rel=1e-9)


def test_fold_turns_off_for_overrides_and_says_why():
    text = BASE.format(**CASES["64-tp-pp-dp-oversub"]) + "\n"
    sc = load_scenario_text(text.replace("leaf_size: 2}", "leaf_size: 2}, overrides: [{kind: gpu_slowdown, target: 'gpu:3', factor: 1.5}]"), "x.yaml")
    fold, note = choose_fold(sc)
    assert fold is None and "overrides" in note


def test_fold_counts_copies():
    # TP 8 × DP 4 are folded on a 2-node-leaf fat-tree: 8 × 4 = 32 ranks per simulated rank
    fold, note = choose_fold(load_scenario_text(BASE.format(**CASES["64-tp-pp-dp-oversub"]), "x.yaml"))
    assert fold.copies == 32 and "32 ranks per simulated rank" in note


CP_RING = """
name: cp-ring
cluster: {{nodes: 4, node: dgx-a100, fabric: {{kind: fat_tree, leaf_size: 4}}}}
model: {{preset: gpt3-1.3b, layers: 4, seq_len: 4096, experts: {experts}, top_k: {top_k}}}
training: {{global_batch: 4, micro_batch: 1}}
parallel: {{tp: 4, cp: 4, dp: 2, ep: {ep}, cp_comm_type: {cp_comm}}}
"""


@pytest.mark.parametrize("experts, top_k, ep, cp_comm, copies", [(0, 0, 1, "p2p", 16), (0, 0, 1, "all_gather", 32),
                                                                  (0, 0, 1, "a2a", 32), (8, 2, 4, "p2p", 4),
                                                                  (8, 2, 4, "all_gather", 16)])
def test_a_cp_group_over_whole_nodes_folds_what_keeps_its_exchanges(experts, top_k, ep, cp_comm, copies):
    # TP 4 × CP 4: each CP group spans 16 ranks, 2 DGX nodes of one leaf, 2 ranks of the group in a node.
    # A ring (p2p): rotating it by one node (2 of its ranks) is a symmetry of the program and of the network; by one
    # rank it is not (it would carry a node's last GPU into the next node's first). So the ring's 2 nodes fold (2
    # copies), the 2 ranks of a ring in a node do not, TP 4 folds (4), and DP 2 over whole nodes folds (2):
    # 2 × 4 × 2 = 16 ranks per simulated one, 32 / 16 = 2 simulated.
    # All-gather or all-to-all CP: the group meets only in collectives over all of it, so any permutation of it that
    # the network keeps is a symmetry: the ring's nodes (2) and its ranks in a node (2) both fold: 2 × 2 × 4 × 2 = 32,
    # 1 simulated.
    # With 8 experts over EP 4 = CP 4 (an EP group is a whole CP group) DP does not fold; the ring's nodes do not
    # either (folding._cp_axes: slower so on GLM-5.1's recipe): TP 4 alone, 32 / 4 = 8 simulated. By all-gather the
    # whole CP group folds (2 × 2) with TP 4: 16, 2 simulated (one per DP replica).
    text = CP_RING.format(experts=experts, top_k=top_k, ep=ep, cp_comm=cp_comm)
    fold, note = choose_fold(load_scenario_text(text, "x.yaml"))
    assert fold is not None and fold.copies == copies and note.endswith(f"{copies} ranks per simulated rank")
    folded = simulate(load_scenario_text(text, "x.yaml"), record_links=False)
    flat = simulate(load_scenario_text(text, "x.yaml", ["simulation.fold=off"]), record_links=False)
    assert folded.ranks_simulated == 32 // copies and flat.ranks_simulated == 32
    assert folded.iteration_time_s == pytest.approx(flat.iteration_time_s, rel=1e-9)
