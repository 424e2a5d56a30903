"""MoE parallel folding (parallel.etp): the experts' own grid, its groups, steps, rules and fold."""
import dataclasses
import os

import pytest

from emulator.cli import main
from emulator.errors import ScenarioError
from emulator.network.orbits import direct_orbits
from emulator.program import Fold
from emulator.run.folding import choose_fold
from emulator.scenario import load_scenario, load_scenario_text
from emulator.scenario.catalog import model_preset
from emulator.scenario.rules import layout_violations
from emulator.scenario.spec import ParallelSpec, TrainingSpec
from emulator.workload import layer as Ly
from emulator.workload.memory import expert_dp
from emulator.workload.placement import Layout
from emulator.workload.plan import make_plan

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_deepseek_v3_groups():
    # TP 2, PP 16, DP 32, EP 64, ETP 1 on 1024 GPUs: a pipeline stage is 64 ranks, j = tp + 2·dp; read as
    # etp + 1·(ep + 64·edp): one EP group of the whole stage, singleton ETP and expert-DP groups
    lo = Layout.from_parallel(ParallelSpec(tp=2, pp=16, dp=32, ep=64, etp=1), 1024)
    assert lo.ep_group(0) == tuple(range(64)) and lo.ep_group(100) == tuple(range(64, 128))
    assert lo.etp_group(5) == (5,) and lo.edp_group(5) == (5,)
    assert lo.tp_group(5) == (4, 5)  # the attention keeps its TP pairs
    assert lo.ep_index(5) == 5


def test_etp_2_under_tp_4_follows_megatrons_rank_generator():
    # TP 4, DP 4 (16 ranks a stage), EP 4, ETP 2, so expert-DP 16/(2·4) = 2. Megatron's expert
    # RankGenerator(tp=2, ep=4, dp=2, order "tp-ep-dp-pp"): get_ranks('tp') = [0,1],[2,3],...;
    # get_ranks('ep') = [0,2,4,6],[1,3,5,7],[8,10,12,14],...; get_ranks('dp') = [0,8],[1,9],...
    lo = Layout.from_parallel(ParallelSpec(tp=4, dp=4, ep=4, etp=2), 16)
    assert lo.etp_group(0) == (0, 1) and lo.etp_group(7) == (6, 7)
    assert lo.ep_group(0) == (0, 2, 4, 6) and lo.ep_group(9) == (9, 11, 13, 15)
    assert lo.edp_group(0) == (0, 8) and lo.edp_group(3) == (3, 11)
    assert lo.tp_group(5) == (4, 5, 6, 7)
    # etp = tp is the unfolded grid: EP carved out of DP (ep 2 of dp 4)
    plain = Layout.from_parallel(ParallelSpec(tp=4, dp=4, ep=2, etp=4), 16)
    assert plain.ep_group(0) == (0, 4) and plain.etp_group(0) == (0, 1, 2, 3)


MOE = model_preset("qwen3-235b-a22b")
TRAIN = TrainingSpec(global_batch=1024, micro_batch=1)


def _rules(**par):
    return [(v.key, v.message) for v in layout_violations(MOE, TRAIN, ParallelSpec(**par))]


def test_the_rule_is_the_folded_grid():
    # EP 64 > DP 32 without etp: the old rule, and the way out
    (key, msg), = _rules(tp=2, pp=2, dp=32, ep=64, sequence_parallel=True)
    assert key == "parallel.ep" and msg.startswith("ep (64) must divide dp*cp = 32*1 = 32; or give the experts")
    assert _rules(tp=2, pp=2, dp=32, ep=64, etp=1, sequence_parallel=True) == []
    # etp·ep = 2·64 = 128 does not divide tp·dp·cp = 2·32·1 = 64
    (key, msg), = _rules(tp=2, pp=2, dp=32, ep=64, etp=4, sequence_parallel=True)
    assert key == "parallel.ep" and "etp*ep = 4*64 = 256 must divide tp*dp*cp = 2*32*1 = 64" in msg
    # Megatron-Core refuses MoE with TP and no sequence parallelism
    assert [k for k, _m in _rules(tp=2, dp=16, ep=32, etp=1)] == ["parallel.sequence_parallel"]
    # the experts' width splits over etp: 1536 / 1024 is not whole
    assert ("parallel.etp", "model.expert_ffn_hidden (1536) must be divisible by etp (1024)") in \
        _rules(tp=1, dp=1024, ep=1, etp=1024)


def test_folded_moe_layer_steps():
    # Qwen3 at tp 2 with SP, ep 32, etp 1: each rank routes its Te = 4096/2 = 2048 tokens × top-8
    L = Ly.layer_shape(MOE, 1, t=2, sp=True, ep=32, flash=True, etp=1)
    fwd = Ly.forward_steps(L)
    mlp = fwd[[s.name for s in fwd].index("ln2"):]
    comms = [(c.name, c.group, c.collective, c.bytes) for c in Ly.comms(mlp)]
    # the token counts (128 experts × 8 B × ep 32), all-to-all of 2048·8 = 16 384 copies × 4096 × 2 B =
    # 134 217 728 B each way (the dispatch with 16 384 fp32 probabilities); no TP or ETP collective on the
    # tokens, only the aux loss's all-reduce of the tokens per expert over TP (128 experts × 8 B)
    assert comms == [("moe.aux_counts", "tp", "all_reduce", 128 * 8),
                     ("moe.token_counts", "ep", "all_gather", 128 * 8 * 32),
                     ("moe.dispatch", "ep", "all_to_all", 134_217_728 + 16_384 * 4),
                     ("moe.combine", "ep", "all_to_all", 134_217_728)]
    k = {s.name: s for s in Ly.kernels(mlp)}
    assert (k["moe.router"].m, k["moe.router"].n) == (2048, 128)
    # 128/32 = 4 local experts of 16 384/4 = 4096 tokens, the whole width 1536 (etp 1): SwiGLU up 3072
    assert (k["moe.up"].m, k["moe.up"].n, k["moe.up"].k, k["moe.up"].batch) == (4096, 3072, 4096, 4)
    assert (k["moe.down"].m, k["moe.down"].n, k["moe.down"].k) == (4096, 4096, 1536)
    # etp 2 under tp 4: Te = 1024 tokens, 8192 copies; the ETP all-gather doubles the experts' rows
    # (8192·2/4 = 4096 each) and halves their width (768); its buffer 4096·4·4096·2 = 134 217 728 B,
    # the all-to-all's 8192·4096·2 = 67 108 864 B (the dispatch with 8192 fp32 probabilities), after the
    # aux loss's all-reduce over TP (128 × 8 B) and the token counts (128 × 8 B × ep 32)
    L2 = Ly.layer_shape(MOE, 1, t=4, sp=True, ep=32, flash=True, etp=2)
    mlp2 = Ly.forward_steps(L2)[[s.name for s in Ly.forward_steps(L2)].index("ln2"):]
    assert [(c.group, c.collective, c.bytes) for c in Ly.comms(mlp2)] == [
        ("tp", "all_reduce", 128 * 8), ("ep", "all_gather", 128 * 8 * 32), ("ep", "all_to_all", 67_108_864 + 8192 * 4),
        ("etp", "all_gather", 134_217_728),
        ("etp", "reduce_scatter", 134_217_728), ("ep", "all_to_all", 67_108_864)]
    up = next(s for s in Ly.kernels(mlp2) if s.name == "moe.up")
    assert (up.m, up.n) == (4096, 1536)
    assert [c.collective for c in Ly.comms(Ly.backward_steps(L2))][:4] == [
        "all_to_all", "all_gather", "reduce_scatter", "all_to_all"]


QWEN3 = os.path.join(ROOT, "scenarios", "qwen3-235b-256-h100.yaml")
DSV3 = os.path.join(ROOT, "scenarios", "deepseek-v3-1024-h100.yaml")


def test_recipe_scenarios_plan_and_fold():
    sc = load_scenario(QWEN3)
    plan = make_plan(sc)
    # experts per GPU per layer: 128 · 3·4096·1536 / (etp 1 · ep 32) = 75 497 472
    assert plan.chunk_units[0][1].expert_params == 128 * 3 * 4096 * 1536 / 32
    assert expert_dp(sc.parallel) == 1  # 2·16·1/(1·32)
    fold, _note = choose_fold(sc)
    # a stage's 32 ranks: j = tp + 2·dp split into (dp: 4 nodes × 4 pairs, tp 2), all folded
    assert fold == Fold((8, 4, 4, 2), (False, True, True, True))
    ds = load_scenario(DSV3)
    assert choose_fold(ds)[0].copies == 64 and expert_dp(ds.parallel) == 1


def test_direct_orbits():
    # 4 ranks on one folded axis of 4: 12 ordered pairs, 3 orbits (distance 1, 2, 3) of 4 flows each
    orbits = direct_orbits(Fold((4,), (True,)), (0, 1, 2, 3), 12)
    assert [len(o) for o in orbits] == [4, 4, 4] and [o[0] for o in orbits] == [0, 1, 2]
    assert direct_orbits(Fold((2, 2), (False, True)), (0, 2), 2) is None  # no folded axis maps {0, 2} onto itself


TINY = """
name: tiny-folded-moe
cluster: {nodes: 4, node: dgx-h100, fabric: {kind: fat_tree}}
model: {layers: 4, hidden: 1024, heads: 16, kv_heads: 4, head_dim: 128, ffn_hidden: 2048, expert_ffn_hidden: 512,
        experts: 16, top_k: 4, seq_len: 1024, vocab: 32000, swiglu: true}
training: {global_batch: 32, micro_batch: 1, attention: flash}
parallel: {tp: 2, pp: 1, dp: 16, ep: 16, etp: 1, sequence_parallel: true}
"""


@pytest.mark.parametrize("overrides", [[], ["parallel.pp=2", "parallel.dp=8", "parallel.ep=8",
                                            "training.global_batch=16"],
                                       # DeepEP, and an all-to-all-v whose busiest receiver takes 2.5/4 more
                                       ["parallel.moe_token_dispatcher_type=flex"], ["model.moe_imbalance=2.5"]])
def test_folded_equals_unfolded(tmp_path, capsys, overrides):
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    times = []
    for fold in ("auto", "off"):
        sets = [x for o in overrides + [f"simulation.fold={fold}"] for x in ("--set", o)]
        assert main(["run", str(path), "--json", *sets]) == 0
        import json
        times.append(json.loads(capsys.readouterr().out)["iteration_time_s"])
    assert times[0] == pytest.approx(times[1], rel=1e-12)


def test_scenario_file_errors_name_the_key():
    text = TINY.replace("etp: 1", "etp: 4")  # 4·16 = 64 does not divide 2·16 = 32
    with pytest.raises(ScenarioError) as info:
        load_scenario_text(text, "tiny.yaml")
    assert info.value.key == "parallel.ep" and "etp*ep = 4*16 = 64 must divide tp*dp*cp = 2*16*1 = 32" in str(info.value)
    assert dataclasses.replace(load_scenario_text(TINY, "t.yaml").parallel).etp == 1


def test_recipe_scenarios_fit_and_shard_experts_by_etp():
    from emulator.workload.memory import memory_report

    # Qwen3 stage 0 (pp 8, v 4: chunks 0, 8, 16, 24 hold 2 + 3 + 3 + 3 = 11 layers): experts per GPU
    # 11 · 128 · 3·4096·1536/(etp 1 · ep 32) = 830 472 192 parameters, held whole (expert-DP 1)
    sc = load_scenario(QWEN3)
    r = memory_report(sc)
    assert r.fits
    from emulator.workload.memory import _stage_params
    _dense, expert = _stage_params(sc.model, sc, 0, 11)
    assert expert == 11 * 128 * 3 * 4096 * 1536 / 32
    assert memory_report(load_scenario(DSV3)).fits


RINGS = """
name: tiny-ep-over-cp
cluster: {nodes: 2, node: dgx-h100, fabric: {kind: fat_tree}}
model: {layers: 4, hidden: 1024, heads: 16, kv_heads: 4, head_dim: 128, ffn_hidden: 2048, expert_ffn_hidden: 512,
        experts: 16, top_k: 4, seq_len: 4096, vocab: 32000, swiglu: true}
training: {global_batch: 16, micro_batch: 1, attention: flash}
parallel: {tp: 1, pp: 1, dp: 4, cp: 4, ep: 8}
"""


@pytest.mark.parametrize("overrides", [[], ["parallel.cp_comm_type=all_gather"], ["model.moe_imbalance=1.5"],
                                       ["parallel.ep=4", "parallel.moe_token_dispatcher_type=flex"]])
def test_ep_over_whole_cp_rings_folds_the_ring(tmp_path, capsys, overrides):
    """EP 8 over the (dp, cp) index j = cp + 4·dp takes two whole CP rings a group, so rotating cp maps each EP
    group onto itself: the 4 CP ranks fold to one (16 GPUs, 4 simulated), and the run is the unfolded one's."""
    import json

    path = tmp_path / "rings.yaml"
    path.write_text(RINGS)
    out = []
    for fold in ("auto", "off"):
        sets = [x for o in overrides + [f"simulation.fold={fold}"] for x in ("--set", o)]
        assert main(["run", str(path), "--json", *sets]) == 0
        out.append(json.loads(capsys.readouterr().out))
    assert out[0]["sim"]["ranks_simulated"] == 4 and out[1]["sim"]["ranks_simulated"] == 16
    assert out[0]["iteration_time_s"] == pytest.approx(out[1]["iteration_time_s"], rel=1e-12)
