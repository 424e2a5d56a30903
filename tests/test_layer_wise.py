"""Megatron-Core's LayerWiseDistributedOptimizer deal (emulator/workload/layer_wise.py): the legacy ping-pong by
size and the layout path's buckets and LPT, on hand-dealt examples, and what it does to Muon's step."""
import pytest

from emulator.scenario import load_scenario_text
from emulator.studies.rank import estimate_iteration
from emulator.workload import layer_wise as LW
from emulator.workload import muon as MU
from emulator.workload.builder import build_program


def test_ping_pong_deals_megatrons_own_example():
    # layer_wise_optimizer.py _shard_params_ping_pong: 4 ranks, p0..p9 sorted by size give
    # [[p0, p7, p8], [p1, p6, p9], [p2, p5], [p3, p4]] (loop 0 1 2 3 3 2 1 0, then 0 1)
    assert LW.ping_pong((1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 4) == (0, 1, 2, 3, 3, 2, 1, 0, 0, 1)
    # the order is by size, not by position: the largest first in the list still goes last, to rank 1
    assert LW.ping_pong((10, 1, 2, 3, 4, 5, 6, 7, 8, 9), 4) == (1, 0, 1, 2, 3, 3, 2, 1, 0, 0)


def test_ns_cost_key_is_max_times_min_squared():
    # _ns_compute_cost of a 4096×7168 weight: 7168·4096² = 120 259 084 288, the same transposed
    assert LW.ns_cost_key(4096, 7168) == LW.ns_cost_key(7168, 4096) == 120_259_084_288


def test_buckets_close_once_past_the_soft_minimum_and_the_next_would_grow_them():
    # 2 shards, four parameters of 4, soft minimum 8, walked from the last: p3 → loads [4, 0]; p2: 4 < 8, in →
    # [4, 4], 8; p1: 8 ≥ max(8, int(2·4·0.9) = 7) and min 4 + 4 > max 4, so the bucket [p3, p2] closes; p0 joins p1
    assert LW._chunks((4, 4, 4, 4), 2, 8) == [[3, 2], [1, 0]]
    # a p1 of 0 elements fits the padding of [4, 4] (4 + 0 ≤ 4): a full bucket absorbs what does not grow it
    assert LW._chunks((4, 0, 4, 4), 2, 8) == [[3, 2, 1], [0]]
    assert LW._chunks((4, 4, 4, 4), 2, None) == [[3, 2, 1, 0]]


def test_lpt_takes_the_costliest_first_within_the_element_cap():
    # one bucket of 12 elements over 2 shards: cap 12/2·1.3 = 7.8. p0 (6 elements, cost 216) → shard 0; then p3,
    # p2, p1 (2 each, cost 8; backprop order among equals): shard 0 would hold 8 > 7.8, so all go to shard 1
    assert LW.lpt_layout((6, 2, 2, 2), (216, 8, 8, 8), 2, None) == (0, 1, 1, 1)
    # fewer parameters than shards: cap 6/4·1.3 = 1.95; p0 (3) and p1 (2) fit no shard and take the first of
    # fewest elements (0, then 1); p2 (1) fits shards 2 and 3, both of cost 0: shard 2
    assert LW.lpt_layout((3, 2, 1), (27, 8, 1), 4, None) == (0, 1, 2)
    # the costs persist across buckets: [p3, p2] → shards 0, 1 (64 each); then p1 → 0 (the first of least cost),
    # p0 → 1 (shard 0 now holds 128)
    assert LW.lpt_layout((4, 4, 4, 4), (64, 64, 64, 64), 2, 8) == (1, 0, 1, 0)


def test_heaviest_is_the_rank_of_most_load():
    # ranks (0, 1, 1, 0) of loads (3, 2, 2, 1): rank 0 holds 4, rank 1 holds 4 → the first, 0; rank 2 holds none
    assert LW.heaviest((0, 1, 1, 0), (3.0, 2.0, 2.0, 1.0), 3) == 0
    assert LW.heaviest((0, 1, 1, 0), (3.0, 2.0, 2.5, 1.0), 3) == 1


KIMI = ("name: k\ncluster: {nodes: 64, node: {preset: gb200-nvl72, nvlink_domain: 64}}\nmodel: {preset: kimi-k2}\n"
        "training: {global_batch: 2048, micro_batch: 1, optimizer: %s}\nparallel: {tp: 1, pp: 4, dp: 64, ep: 64, "
        "zero: 1, overlap_param_gather: false, schedule: interleaved-1f1b, pipeline_model_parallel_layout: "
        "\"Et*4|(tttt|)*14t,L\"}\n")


def _kimi(optimizer):
    sc = load_scenario_text(KIMI % optimizer, "k.yaml")
    # rank 64 is pipeline rank 1 (dp·ep·tp = 64 ranks a stage): 4 chunks of 4 MoE layers
    ns = next(op for op in build_program(sc).ops if op.name == "newton_schulz" and op.rank == 64)
    gpu = sc.cluster.node.gpu
    mats = MU.layer_matrices(sc.model, 5, sc.parallel, sc.training)
    cost = {(x.rows, x.cols): MU.ns_cost(x.rows, x.cols, 5, gpu)[0] for x in mats}
    # expert-DP 64·1/64 = 1: the rank orthogonalises all its 16 layers' 6 experts' fc1 and fc2
    expert = 16 * sum(cost[(x.rows, x.cols)] * x.count for x in mats if x.expert)
    return ns.duration, cost, expert


def test_dist_muon_deals_kimis_dense_matrices_in_pairs():
    got, c, expert = _kimi("dist_muon")
    # 16 layers of MLA with q_lora (input, pre-MLP, q and kv RMSNorms: 4 1-D parameters a layer, 64 = one
    # half-loop ahead), so the 128 dense matrices start at loop position 64: sorted item j goes to rank 63 − j
    # (j < 64) or j − 64, and rank r holds items 63 − r and 64 + r. By size, 16 each: router 384×7168, kv_a
    # 576×7168, kv_b 16384×512, q_a 1536×7168 | fc2 7168×2048, q_b 12288×1536, fc1 4096×7168, proj 7168×8192
    pairs = [c[(1536, 7168)] + c[(7168, 2048)], c[(16384, 512)] + c[(12288, 1536)],
             c[(576, 7168)] + c[(4096, 7168)], c[(384, 7168)] + c[(7168, 8192)]]
    assert got == pytest.approx(expert + max(pairs), rel=1e-12)


def test_the_layout_path_gives_the_first_shards_each_chunks_largest():
    got, c, expert = _kimi("muon")
    # a chunk's dense buffer, 4 layers of 147.9M elements: one bucket (the soft minimum grows to
    # 64·58.7M·0.9 > 591.7M) and an element cap of 591.7M/64·1.3 = 12.0M. The four projs (58.7M each, the
    # costliest) fit no shard and go to the shards of fewest elements: 0, 1, 2, 3; and so in each of the 4
    # chunks. The fc1s, q_bs and fc2s too big for the cap go to 4..15; the rest fit and go to shards of no cost.
    # Shard 0 holds 4 projs, the most: 4 Newton–Schulz runs of 7168×8192
    assert got == pytest.approx(expert + 4 * c[(7168, 8192)], rel=1e-12)


@pytest.mark.parametrize("optimizer", ["dist_muon", "muon"])
def test_the_closed_form_deals_as_the_builder(optimizer):
    # the search's closed form takes the same model chunks (memory.muon_chunks) through the same deal: its step is
    # the builder's slowest rank's elementwise stream and Newton–Schulz step, to the last bit
    sc = load_scenario_text(KIMI % optimizer, "k.yaml")
    step: dict[int, float] = {}
    for op in build_program(sc).ops:
        if op.name in ("optimizer", "newton_schulz"):
            step[op.rank] = step.get(op.rank, 0.0) + op.duration
    assert estimate_iteration(sc).optimizer_s == max(step.values())


def test_the_summary_says_how_uneven_the_deal_is():
    from emulator.run.simulation import _layer_wise_notes
    from emulator.scenario.units import format_time

    text = ("name: m\ncluster: {nodes: 1, node: {preset: dgx-h100}}\nmodel: {preset: gpt3-125m}\n"
            "training: {global_batch: 16, micro_batch: 1, optimizer: dist_muon}\n"
            "parallel: {tp: 1, pp: 1, dp: 8, zero: 1, overlap_param_gather: false}\n")
    sc = load_scenario_text(text, "m.yaml")
    heavy = next(op.duration for op in build_program(sc).ops if op.rank == 0 and op.name == "newton_schulz")
    # test_muon.py's ping-pong: rank 0 holds two QKVs (six 768×768 blocks) and four fcs; the mean share is 12 layers'
    # 3 QKV blocks, a proj and 2 fcs over 8 ranks: six blocks and three fcs, one 3072×768 fc less than the heaviest
    fc = MU.ns_cost(3072, 768, 5, sc.cluster.node.gpu)[0]
    mean = heavy - fc
    assert _layer_wise_notes(sc) == [
        f"training.optimizer dist_muon: Megatron-Core's layer-wise optimizer deals whole parameters; the heaviest "
        f"rank of pipeline rank 0 runs {format_time(heavy)} of Newton-Schulz a step, the mean share "
        f"{format_time(mean)} ({heavy / mean:.2f}x)"]
    assert _layer_wise_notes(load_scenario_text(text.replace("dist_muon", "muon").replace("zero: 1", "zero: 0"),
                                                "m.yaml")) == []  # plain Muon steps all of its own
