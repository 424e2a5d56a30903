"""The search's closed-form ranking (studies/rank.py) and the search that simulates only its best."""
import os

import pytest

from emulator.cli import main
from emulator.run.simulation import simulate
from emulator.scenario import load_scenario
from emulator.studies.executor import LocalExecutor
from emulator.studies.rank import (
    Link,
    estimate_iteration,
    group_link,
    pass_times,
    ranks,
    ring_time,
    spearman,
)
from emulator.studies.search import SAME_AS_ZERO1, Layout, Limits, choose, plan, search
from emulator.studies.store import ResultStore
from emulator.workload import layer as Ly


def _scenario(folder, preset, batch, nodes=1):
    path = os.path.join(folder, f"{preset}.yaml")
    with open(path, "w") as fh:
        fh.write(f"name: {preset}\ncluster: {{nodes: {nodes}, node: dgx-a100}}\nmodel: {{preset: {preset}}}\n"
                 f"training: {{global_batch: {batch}}}\n")
    return path


def test_ring_formulas():
    link = Link(bandwidth=1e11, alpha=1e-5, launch=2e-5)
    # all-reduce, n = 4, S = 1 GB: 2e-5 + 2·3·1e-5 + 2·3/4 · 1e9/1e11 = 2e-5 + 6e-5 + 0.015 = 0.01508
    assert ring_time("all_reduce", 4, 1e9, link) == pytest.approx(0.01508, rel=1e-12)
    # all-gather, n = 4: 2e-5 + 3·1e-5 + 3/4 · 0.01 = 5e-5 + 0.0075 = 0.00755
    assert ring_time("all_gather", 4, 1e9, link) == pytest.approx(0.00755, rel=1e-12)
    # send/recv: 2e-5 + 1e-5 + 0.01 = 0.01003
    assert ring_time("p2p", 2, 1e9, link) == pytest.approx(0.01003, rel=1e-12)
    assert ring_time("all_reduce", 1, 1e9, link) == 0.0  # alone: nothing to do


def test_links_of_a_dgx_a100_inside_and_across_nodes(tmp_path):
    sc = load_scenario(_scenario(str(tmp_path), "gpt3-125m", 32, nodes=4))
    # inside: 300 GB/s × 230/300 = 230 GB/s; α = 2 hops × 0.15 us + 1.675 us = 1.975 us; launch 6.05 us
    # (so an 8-GPU all-reduce of a small message is 6.05 + 14 × 1.975 = 33.7 us, nccl.csv's figure)
    inside = group_link(sc, 1, 8)
    assert inside.bandwidth == pytest.approx(230e9) and inside.alpha == pytest.approx(1.975e-6)
    assert inside.launch == pytest.approx(6.05e-6)
    # 4 members 8 apart, one per node: the GPU's share of the NICs, 8 × 25 GB/s × 24/25 / 8 = 24 GB/s;
    # α = 2 × 0.5 us (NICs) + 2 × 1 us (one leaf switch) + 3 us = 6 us
    across = group_link(sc, 8, 4)
    assert across.bandwidth == pytest.approx(24e9) and across.alpha == pytest.approx(6e-6)
    # 8 members 4 apart: 2 on each of 4 nodes, two rings: 48 GB/s
    assert group_link(sc, 4, 8).bandwidth == pytest.approx(48e9)


def test_single_gpu_iteration_is_the_micro_batches_times_the_passes_plus_the_optimizer(tmp_path):
    sc = load_scenario(_scenario(str(tmp_path), "gpt3-125m", 4),
                       ["cluster.node.gpus_per_node=1", "parallel.tp=1", "parallel.pp=1", "parallel.dp=1"])
    est = estimate_iteration(sc)
    m = sc.model
    L = Ly.layer_shape(m, 1, 1, False, 1, 1, 2, False)
    layer, embed, head = pass_times(L, "none", True, 50304, sc.cluster.node.gpu, ())
    # one stage, 4 micro-batches of 1: 4 × (12 layers + embedding + head); no bubble, no DP
    assert est.compute_s == pytest.approx(4 * (12 * layer + embed + head), rel=1e-12)
    assert est.bubble_s == 0.0 and est.dp_comm_s == 0.0
    assert est.iteration_s == pytest.approx(est.compute_s + est.optimizer_s, rel=1e-12)


def test_interleaving_divides_the_fill_by_the_virtual_stages(tmp_path):
    # gpt3-125m, tp 1, pp 4, dp 2 on 8 GPUs, 8 micro-batches: with T_s per stage,
    # 1f1b bubble = Σ T_s − max T_s, interleaved v = 3 (12 layers over 12 chunks) the same over 3
    # (the p2p term is the same 2(p·v − 1) sends of b·s·h·2 bytes in both; subtract it)
    path = _scenario(str(tmp_path), "gpt3-125m", 16)
    base = ["parallel.tp=1", "parallel.pp=4", "parallel.dp=2"]
    one = estimate_iteration(load_scenario(path, base))
    three = estimate_iteration(load_scenario(path, base + ["parallel.schedule=interleaved-1f1b",
                                                           "parallel.virtual_stages=3"]))
    sc = load_scenario(path, base)
    # the pp neighbour is dp·cp·tp = 2 ranks away, in the same node; one micro-batch's activations are
    # b·s·h·2 = 1·2048·768·2 = 3,145,728 bytes
    p2p = ring_time("p2p", 2, 2048 * 768 * 2, group_link(sc, 2, 2))
    fill_1 = one.bubble_s - 2 * (4 - 1) * p2p
    fill_3 = three.bubble_s - 2 * (12 - 1) * p2p
    assert fill_1 > 0 and fill_3 == pytest.approx(fill_1 / 3, rel=1e-9)
    assert one.compute_s == pytest.approx(three.compute_s, rel=1e-12)  # the same work per stage



def test_each_schedule_prices_its_own_bubble(tmp_path):
    # as above (gpt3-125m, pp 4, 12 layers): the fill over 1F1B's is the schedule's paper bubble with
    # F = B = W: zb-h1 (F + B − W)/(F + B + W) = 1/3; zb-v 1/6 and dualpipev 1/3 over 8 chunks (2(8 − 1)
    # sends). The V's 8 chunks need 16 layers (2 each, rank 0 with the embedding and the head), so its T_s
    # are not 1F1B's: zb-v is checked against dualpipev on the same split, 1/6 against 1/3.
    path = _scenario(str(tmp_path), "gpt3-125m", 32)
    base = ["parallel.tp=1", "parallel.pp=4", "parallel.dp=2"]
    sc = load_scenario(path, base)
    p2p = ring_time("p2p", 2, 2048 * 768 * 2, group_link(sc, 2, 2))
    fill = {s: estimate_iteration(load_scenario(path, base + [f"parallel.schedule={s}"] + extra)).bubble_s
            - 2 * (n - 1) * p2p
            for s, n, extra in (("1f1b", 4, []), ("zb-h1", 4, []), ("zb-v", 8, ["model.layers=16"]),
                                ("dualpipev", 8, ["model.layers=16"]))}
    assert fill["1f1b"] > 0 and fill["zb-h1"] == pytest.approx(fill["1f1b"] / 3, rel=1e-9)
    assert fill["zb-v"] > 0 and fill["zb-v"] == pytest.approx(fill["dualpipev"] / 2, rel=1e-9)
    # dualpipe (pp 4, 4 stages of 3 layers; 16 micro-batches, at least 2·pp and even): (p/2 − 1)·2T/3 over
    # 1F1B's (p − 1)·T, 2/9 here, with T_s the mean of a rank's two stages (ranks 0 and 3 both hold the
    # embedding's stage and the head's): Σ T_s − max T_s no smaller than 1F1B's (the mean evens the ranks)
    dual = estimate_iteration(load_scenario(path, base + ["parallel.schedule=dualpipe"])).bubble_s - 6 * p2p
    assert fill["1f1b"] * 2 / 9 <= dual < fill["1f1b"] / 2


def test_estimate_is_close_to_the_emulator_on_small_layouts(tmp_path):
    # a closed form, not a simulation: within 6 % of the emulator on these 8-GPU layouts
    path = _scenario(str(tmp_path), "gpt3-125m", 16)
    for sets in (["parallel.tp=2", "parallel.pp=2", "parallel.dp=2"],
                 ["parallel.tp=1", "parallel.pp=1", "parallel.dp=8", "parallel.zero=1"],
                 ["parallel.tp=4", "parallel.pp=2", "parallel.dp=1", "training.recompute=full"]):
        sc = load_scenario(path, sets)
        sim = simulate(sc, record_links=False).iteration_time_s
        assert estimate_iteration(sc).iteration_s == pytest.approx(sim, rel=0.06), sets


def test_spearman_by_hand():
    assert ranks([10, 30, 20, 30]) == [1.0, 3.5, 2.0, 3.5]  # the tie shares positions 3 and 4
    # x ranks 1..5, y = (5, 6, 7, 8, 7) ranks (1, 2, 3.5, 5, 3.5); centred: (−2, −1, 0, 1, 2) and
    # (−2, −1, .5, 2, .5): cov 4 + 1 + 0 + 2 + 1 = 8, var 10 and 9.5: ρ = 8/√95 = 0.820783
    assert spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) == pytest.approx(8 / 95 ** 0.5, rel=1e-12)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2], [1, 2]) is None and spearman([1, 2, 3], [4, 4, 4]) is None


def test_zero2_is_kept_only_where_it_saves_recompute(tmp_path):
    # gpt3-125m on 8 GPUs, pp 1, mb 1, ZeRO 1 and 2: tp 1, 2, 4 (dp 8, 4, 2) × 2 stages × 3 recompute = 18,
    # and tp 8 (dp 1: ZeRO 0 only) × 3 recompute = 3; 21 considered. tp 8 breaks heads (12 % 8): 3.
    # The other 3 fit with ZeRO-1 and no recompute; their ZeRO-2 is the same communication with the
    # same recompute: 3 pruned; more recompute than needed: 3 shapes × 2 stages × 2 = 12. 18 pruned, 3 kept.
    sc = load_scenario(_scenario(str(tmp_path), "gpt3-125m", 16))
    p = plan(sc, 8, Limits(max_pp=1, micro_batches=(1,), zero=(1, 2)))
    assert p.considered == 21 and [(lay.tp, lay.zero) for lay in p.layouts] == [(1, 1), (2, 1), (4, 1)]
    assert p.pruned[SAME_AS_ZERO1] == 3 and p.pruned["more recompute than needed to fit"] == 12
    assert sum(p.pruned.values()) == 18
    # --exhaustive keeps them all: 3 shapes × 2 stages × 3 recompute
    assert len(plan(sc, 8, Limits(max_pp=1, micro_batches=(1,), zero=(1, 2), exhaustive=True)).layouts) == 18


def test_choose_keeps_the_best_estimates_in_order(tmp_path):
    sc = load_scenario(_scenario(str(tmp_path), "gpt3-125m", 16))
    p = plan(sc, 8, Limits(max_pp=2, micro_batches=(1,), zero=(0,)))
    choose(sc, p, 4)
    times = sorted(p.estimates[lay] for lay in p.layouts)
    assert [p.estimates[lay] for lay in p.chosen] == times[:4]
    choose(sc, p, None)
    assert len(p.chosen) == len(p.layouts) == 12


def test_search_simulates_only_the_top_and_max_points_bounds_the_simulated(tmp_path, capsys):
    # 39 considered, 12 fit (test_search.py); max-points 5 < 12 but only 3 are simulated
    path = _scenario(str(tmp_path), "gpt3-125m", 16)
    db = str(tmp_path / "s.sqlite")
    args = ["search", path, "--max-pp", "2", "--micro-batches", "1", "--zero", "0", "--db", db]
    assert main(args + ["--simulate-top", "3", "--max-points", "5"]) == 0
    out = capsys.readouterr().out
    assert "12 fit, the best 3 by the closed-form estimate to simulate" in out
    assert "spread over the 3 simulated layouts: best" in out
    assert "Spearman rank correlation" in out and "over the 3 simulated layouts" in out
    with ResultStore(db) as store:
        assert len(store.rows()) == 3
    assert main(args + ["--simulate-top", "6", "--max-points", "5"]) == 2
    assert "more than --max-points 5" in capsys.readouterr().err
    assert main(args + ["--simulate-top", "none"]) == 2
    assert "--simulate-top: expected a positive integer or 'all', got 'none'" in capsys.readouterr().err


def test_the_estimate_ranks_the_small_search_like_the_emulator(tmp_path):
    # every fitting layout of gpt3-125m on 8 GPUs (pp ≤ 2, mb 1 and 2, ZeRO 0 and 1) simulated:
    # the closed form must order them much as the emulator does
    path = _scenario(str(tmp_path), "gpt3-125m", 16)
    with ResultStore(str(tmp_path / "s.sqlite")) as store:
        res = search(path, [], None, Limits(max_pp=2, micro_batches=(1, 2), zero=(0, 1)), store,
                     LocalExecutor(1), simulate_top=None)
    from emulator.studies.rank import spearman as rho

    ok = [r for r in res.rows if r.status == "ok"]
    assert len(ok) == len(res.plan.layouts) >= 20
    assert rho([res.estimates[r.key] for r in ok], [r.metric("iteration_time_s") for r in ok]) > 0.8
    best = res.ranked[0].varied
    assert Layout(best["parallel.tp"], best["parallel.pp"], best["parallel.dp"]).pp == 1


def test_dualpipe_reduces_and_steps_both_copies_of_its_parameters(tmp_path):
    from emulator.devices.compute import elementwise_time
    ADAM_BYTES_PER_PARAM = 34  # fp32 states: read the gradient, main weight, moments (16), write them (12), the
    # bf16 weight (2), clip_grad_norm's read of the gradient (4) (workload/optimizer.py)

    # gpt3-1.3b (24 layers, h 2048, tied embeddings, vocabulary 50,257 padded to 50,304), tp 1, pp 4, dp 2 on
    # one DGX A100, no overlapped reduction. A layer: 12h² + 13h = 50,358,272 parameters; the embedding:
    # 50,304·2048 + 2048·2048 (learned positions) = 107,216,896; the head: its final norm, 2h = 4096.
    # dualpipe: rank 0 holds stage 0 (6 layers + the embedding: 409,366,528) and stage 3 (6 layers + the head,
    # which shares rank 0's embedding: 302,153,728): 711,520,256 parameters, fp32 gradients (bf16 training)
    # S = 4 · 711,520,256 = 2,846,081,024 B. Its DP all-reduce (2 ranks, 1 apart) and the pair's all-reduce
    # (ranks 0 and 6: stages 0 and 3, pp stride 2 · 3) are both inside the node: each L + 2α + S/B, and no
    # tied-embedding all-reduce (each end rank holds the embedding and the head).
    path = _scenario(str(tmp_path), "gpt3-1.3b", 32)
    base = ["parallel.tp=1", "parallel.pp=4", "parallel.dp=2", "parallel.overlap_grad_reduce=false"]
    sc = load_scenario(path, base + ["parallel.schedule=dualpipe"])
    node = sc.cluster.node
    inside = group_link(sc, 1, 2)
    S = 4 * 711_520_256
    ar = inside.launch + 2 * inside.alpha + S / (node.intra_bandwidth * node.intra_efficiency)
    est = estimate_iteration(sc)
    assert est.dp_comm_s == pytest.approx(2 * ar, rel=1e-12)
    assert est.optimizer_s == pytest.approx(elementwise_time(711_520_256 * ADAM_BYTES_PER_PARAM, node.gpu), rel=1e-12)
    # overlapped (the default), the pair's all-reduce and the DP buckets run per chunk (workload/builder.py):
    # rank 0's stage 3 finishes first, and only stage 0's (409,366,528 parameters) pair and DP all-reduces
    # are exposed: 2 · (L + 2α + 4 · 409,366,528 / B); rank 1's last chunk, stage 1, is 302,149,632
    over = estimate_iteration(load_scenario(path, base[:-1] + ["parallel.schedule=dualpipe"]))
    ar0 = inside.launch + 2 * inside.alpha + 4 * 409_366_528 / (node.intra_bandwidth * node.intra_efficiency)
    assert over.dp_comm_s == pytest.approx(2 * ar0, rel=1e-12)
    # 1F1B: the widest stage is stage 0 (409,366,528 parameters), and the head's stage 3 holds a copy of the
    # tied word embedding (50,304·2048 = 103,022,592), all-reduced with stage 0's over ranks 0 and 6
    one = estimate_iteration(load_scenario(path, base))
    table = ring_time("all_reduce", 2, 103_022_592 * 2, group_link(sc, 6, 2))  # in the weights' bf16
    assert one.dp_comm_s == pytest.approx(
        ring_time("all_reduce", 2, 4 * 409_366_528, inside) + table, rel=1e-12)
    assert one.optimizer_s == pytest.approx(elementwise_time(409_366_528 * ADAM_BYTES_PER_PARAM, node.gpu),
                                            rel=1e-12)
    # zb-v (8 chunks of 3 layers): rank 0 holds chunks 0 and 7, 6 layers + the embedding + the head with no
    # copy of the table (302,149,632 + 107,216,896 + 4096 = 409,370,624), and no tied all-reduce
    vee = estimate_iteration(load_scenario(path, base + ["parallel.schedule=zb-v"]))
    assert vee.dp_comm_s == pytest.approx(ring_time("all_reduce", 2, 4 * 409_370_624, inside), rel=1e-12)


def test_an_moe_layouts_experts_reduce_over_their_own_group(tmp_path):
    """Qwen3-235B-A22B cut to 2 layers on 4 DGX H100: tp 1, dp 32, ep 8, etp 1, ZeRO 0, no overlapped
    reduction. A rank holds 128/8 = 16 experts a layer of 3 · 4096 · 1536 (expert_ffn_hidden, not the dense
    ffn_hidden 12,288): 16 · 18,874,368 = 301,989,888 a layer, 603,979,776 in all, their fp32 gradients
    2,415,919,104 B all-reduced over the expert-data-parallel group: 32 / 8 = 4 ranks 8 apart, one a node (one
    ring over a GPU's NIC share); the rest over the 32 data-parallel ranks, 8 a node (8 rings), after them."""
    from emulator.studies.rank import group_link_of, params_of
    from emulator.workload import models as M

    path = os.path.join(str(tmp_path), "q.yaml")
    with open(path, "w") as fh:
        fh.write("name: q\ncluster: {nodes: 4, node: dgx-h100}\nmodel: {preset: qwen3-235b-a22b, layers: 2}\n"
                 "training: {global_batch: 32}\nparallel: {tp: 1, pp: 1, dp: 32, ep: 8, etp: 1, zero: 0, "
                 "overlap_grad_reduce: false}\n")
    sc = load_scenario(path)
    m = M.resolve(sc.model)
    params = params_of(m, sc)
    assert params.layer_expert == 301_989_888  # 128 · 3 · 4096 · 1536 / 8
    edp = (0, 8, 16, 24)
    edp_link = group_link_of(sc, edp)
    assert edp_link == group_link(sc, 8, 4)  # 4 members 8 apart: one a node
    dense = 2 * params.layer_dense + params.first + params.last
    assert dense == 2 * M.dense_layer_params(m, True) + params.first + params.last
    expected = ring_time("all_reduce", 32, 4 * dense, group_link(sc, 1, 32)) + \
        ring_time("all_reduce", 4, 2_415_919_104, edp_link)
    assert estimate_iteration(sc).dp_comm_s == pytest.approx(expected, rel=1e-12)


def test_the_search_does_not_carry_the_bases_layer_layout(tmp_path):
    """A base scenario with pipeline_model_parallel_layout (it places every layer for one pp × virtual_stages)
    would refuse every other layout: the search splits the layers itself."""
    from emulator.studies.search import SPLIT_RESET

    sc = load_scenario(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scenarios",
                                    "qwen3-235b-256-h100.yaml"))
    assert sc.parallel.pipeline_model_parallel_layout is not None
    lay = Layout(tp=2, pp=4, dp=32, ep=8, schedule="1f1b", zero=1, ends=23)
    assert lay.apply(sc).parallel.pipeline_model_parallel_layout is None
    assert "parallel.pipeline_model_parallel_layout=null" in SPLIT_RESET


def test_the_search_runs_the_ring_where_a_layout_changes_hierarchical_cps_cp():
    """cp_comm_type a2a+p2p fixes hierarchical_context_parallel_sizes to the base's cp ([2, 2] for cp 4): a
    layout of another cp would break the sizes' rule, so it runs the K/V ring (p2p) instead; one of the same
    cp keeps them."""
    from emulator.scenario import load_scenario_text
    from emulator.studies.search import hierarchical_reset

    sc = load_scenario_text("name: x\ncluster: {nodes: 1, node: dgx-h100}\n"
                            "model: {layers: 2, hidden: 512, heads: 8, seq_len: 1024, vocab: 512}\n"
                            "training: {global_batch: 2, micro_batch: 1, attention: flash}\n"
                            "parallel: {cp: 4, dp: 2, cp_comm_type: a2a+p2p, "
                            "hierarchical_context_parallel_sizes: [2, 2]}\n", "x.yaml")
    assert hierarchical_reset(sc, 1) == {"parallel.cp_comm_type": "p2p",
                                         "parallel.hierarchical_context_parallel_sizes": None}
    one = Layout(tp=1, pp=1, dp=8, cp=1).apply(sc).parallel
    assert (one.cp_comm_type, one.hierarchical_context_parallel_sizes) == ("p2p", None)
    assert hierarchical_reset(sc, 4) == {}
    four = Layout(tp=1, pp=1, dp=2, cp=4).apply(sc).parallel
    assert (four.cp_comm_type, four.hierarchical_context_parallel_sizes) == ("a2a+p2p", (2, 2))


def test_deepseek_v3s_split_holds_its_dense_layers_first_and_its_mtp_last():
    """The DeepSeek-V3 scenario's layout "Et*4|(t*4|)*14,tmL" over pp 16: stage 0 holds layers 0-3, of which
    the first_dense_layers (3) are dense; stages 1-14 four MoE layers each; stage 15 one layer, the MTP
    module and the loss."""
    from emulator.studies.rank import split_of
    from emulator.workload import models as M

    sc = load_scenario(os.path.join(os.path.dirname(__file__), "..", "scenarios", "deepseek-v3-1024-h100.yaml"))
    split = split_of(M.resolve(sc.model), sc.parallel)
    assert [split.count(s) for s in range(16)] == [4] * 15 + [1]  # 4 + 14·4 + 1 = 61 layers
    assert split.leads == (3,) + (0,) * 15 and split.mtp == 15


def test_an_moe_models_dense_layers_and_mtp_are_priced_as_the_plan_holds_them(tmp_path):
    """DeepSeek-V2-Lite cut to 4 layers, the first 2 dense, one MTP module, on one DGX H100: tp 1, pp 2, dp 4,
    ep 4. Stage 0 holds the embedding and the 2 dense layers; stage 1 the 2 MoE layers, the MTP module and the
    head with its pass over the module's hidden states. 16 micro-batches (64 / (1 · 4))."""
    from emulator.studies.rank import extra_times, params_of, split_of
    from emulator.workload import models as M

    path = os.path.join(str(tmp_path), "v2.yaml")
    with open(path, "w") as fh:
        fh.write("name: v2\ncluster: {nodes: 1, node: dgx-h100}\nmodel: {preset: deepseek-v2-lite, layers: 4, "
                 "first_dense_layers: 2, mtp_num_layers: 1}\ntraining: {global_batch: 64, micro_batch: 1}\n"
                 "parallel: {tp: 1, pp: 2, dp: 4, ep: 4}\n")
    sc = load_scenario(path)
    m = M.resolve(sc.model)
    split = split_of(m, sc.parallel)
    assert split.leads == (2, 0) and split.mtp == 1
    from emulator.studies import rank as R

    # the layer shape and arguments estimate_iteration passes (its links and expert group), read back by a spy
    seen: list = []
    real = R.extra_times

    def spy(*a, **k):
        seen.append(a)
        return real(*a, **k)

    R.extra_times = spy
    try:
        est = estimate_iteration(sc)
    finally:
        R.extra_times = real
    L, args = seen[0][0], seen[0][1:8]
    assert seen[0][8:] == (1, True, (0.0, frozenset(), False))  # one MTP module, leading dense layers; the GPU's times
    layer, embed, head = pass_times(L, *args)
    lead, mtp, mtp_head = extra_times(L, *args, 1, True)
    assert lead != layer and mtp > layer and mtp_head > 0  # a dense MLP, an MoE layer and more, a head pass
    # the slower stage, 16 times: max(2 · dense + embedding, 2 · MoE + MTP + head + its MTP pass)
    assert est.compute_s == pytest.approx(16 * max(2 * lead + embed, 2 * layer + mtp + head + mtp_head), rel=1e-12)
    params = params_of(m, sc, split)
    # stage 1's experts: 2 layers and the MTP module's, 64 experts of 3 · 2048 · 1408 over ep 4 each:
    # 3 · 64 · 8,650,752 / 4 = 415,236,096; stage 0's dense layers hold none
    assert params.rank(split, 1, sc.parallel)[1] == 415_236_096
    assert params.rank(split, 0, sc.parallel) == (2 * M.dense_layer_params(m, False) + params.first, 0.0)


def test_the_slowest_expert_group_sets_the_step():
    from emulator.scenario import load_scenario_text
    from emulator.studies.rank import ep_variants
    from emulator.workload.placement import Layout

    # EP 16 over two GB200 NVL72 racks of 72 GPUs (144 GPUs, DP 144): the groups start at ranks 0, 16, ..., 128;
    # group 4 (ranks 64-79) has 8 GPUs in each rack, the other 8 groups sit in one. Two placements, one stage
    text = ("name: g\ncluster: {nodes: 36, node: gb200-nvl72, fabric: {kind: fat_tree, leaf_size: 36}}\n"
            "model: {preset: qwen3-30b-a3b, seq_len: 2048}\ntraining: {global_batch: 576, micro_batch: 1}\n"
            "parallel: {tp: 1, pp: 1, dp: 144, ep: 16, zero: 1}\n")
    sc = load_scenario_text(text, "g.yaml")
    variants = ep_variants(Layout.from_parallel(sc.parallel, sc.gpus), sc.cluster.node)
    assert list(variants) == [0] and [v.group for v in variants[0]] == [tuple(range(16)), tuple(range(64, 80))]
    # the straddling group's exchange goes over the NICs, and the estimate takes it, not group 0's over NVLink: with
    # EP 8 (8 divides 72: every group in a rack) each rank runs twice the experts, yet EP 16's step is far longer
    # (0.93 s against 0.44 s)
    aligned = load_scenario_text(text.replace("ep: 16", "ep: 8"), "g.yaml")
    assert estimate_iteration(sc).compute_s > 1.5 * estimate_iteration(aligned).compute_s
