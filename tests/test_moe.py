"""Mixture-of-Experts: per-expert width, shared experts, dense leading layers, token imbalance and the
grouped-GEMM efficiency, in parameter counts, FLOPs, layer kernels, memory, the rule book and a run."""
import dataclasses

import pytest

from emulator.devices import compute
from emulator.errors import ScenarioError
from emulator.outputs.summary import summarize
from emulator.program import dispatch_op
from emulator.run.simulation import simulate
from emulator.scenario import (
    ClusterSpec,
    GpuSpec,
    ModelSpec,
    ParallelSpec,
    Scenario,
    TrainingSpec,
    catalog,
    load_scenario_text,
)
from emulator.workload import flops as F
from emulator.workload import kernel_cost as KC
from emulator.workload import layer as Ly
from emulator.workload import models as M
from emulator.workload.activations import layer_activation_bytes
from emulator.workload.memory import _stage_params

# A small DeepSeek-style MoE (standard attention): h 1024, 8 heads, s 512, SwiGLU, 8 routed experts of
# width 512, top-2, one shared expert of width 1024, the first of 4 layers dense with ffn 2048.
SMALL = ModelSpec(layers=4, hidden=1024, heads=8, seq_len=512, vocab=1000, ffn_hidden=2048, swiglu=True,
                  experts=8, top_k=2, expert_ffn_hidden=512, shared_experts=1, shared_expert_ffn_hidden=1024,
                  first_dense_layers=1)


def test_deepseek_v3_parameters():
    m = catalog.model_preset("deepseek-v3")
    # one expert 3·7168·2048 = 44 040 192; the dense MLP 3·7168·18432 = 396 361 728
    assert M.expert_params(m) == 44_040_192
    assert M.mlp_params(m) == 396_361_728
    # MoE layer: MLA 187 107 328 (test_mla.py) + router 256·7168 = 1 835 008 + shared 44 040 192
    # + RMSNorms 2·7168 = 14 336 + 256 routed · 44 040 192 = 11 274 289 152 → 11 507 286 016
    assert M.layer_params(m) == 11_507_286_016
    # dense leading layer: 187 107 328 + 396 361 728 + 14 336 = 583 483 392
    assert M.layer_params(m, 0) == 583_483_392
    # 3 dense + 58 MoE layers + embedding 129280·7168 = 926 679 040 + head 926 679 040 + final norm 7168:
    # 1 750 450 176 + 667 422 588 928 + 926 679 040 + 926 686 208 = 671 026 404 352
    assert M.total_params(m) == 671_026_404_352
    # published: 671B total (arXiv 2412.19437 section 4.2; DeepSeek-V3 README_WEIGHTS.md, main model)
    assert M.total_params(m) == pytest.approx(671e9, rel=1e-3)


def test_deepseek_v3_activated_parameters():
    m = catalog.model_preset("deepseek-v3")
    # a token's MoE layer: 11 507 286 016 − (256 − 8)·44 040 192 = 585 318 400
    assert M.activated_layer_params(m, 3) == 585_318_400
    assert M.activated_layer_params(m, 2) == 583_483_392  # a dense leading layer: all of it
    # 3·583 483 392 + 58·585 318 400 + head 926 686 208 = 36 625 603 584 without the embedding lookup
    assert M.activated_params(m) - M.embedding_params(m) == 36_625_603_584
    # published: 36.7B activated (deepseek-ai/DeepSeek-V3 @ 9b4e978, README_WEIGHTS.md): within 0.3%
    assert M.activated_params(m) - M.embedding_params(m) == pytest.approx(36.7e9, rel=3e-3)


@pytest.mark.parametrize("name,total,activated", [
    ("deepseek-v2", 236e9, 21e9),  # arXiv 2405.04434, abstract: 236B total, 21B activated
    ("deepseek-v2-lite", 15.7e9, 2.4e9),  # ibid., appendix B.1: 15.7B total, 2.4B activated
])
def test_deepseek_v2_parameters(name, total, activated):
    # counted as for V3: 235 741 434 880 and 20 851 512 320 (V2); 15 706 484 224 and 2 451 435 008 (Lite)
    m = catalog.model_preset(name)
    assert M.total_params(m) == pytest.approx(total, rel=3e-3)
    assert M.activated_params(m) - M.embedding_params(m) == pytest.approx(activated, rel=3e-2)


def test_qwen2_moe_parameters():
    m = catalog.model_preset("qwen2-57b-a14b")
    # attention 3584·(3584 + 2·4·128) + 3584² = 29 360 128; router 3584·64 = 229 376; norms 7 168;
    # one expert 3·3584·2560 = 27 525 120; 8 shared as one MLP 8·27 525 120 = 220 200 960
    assert M.layer_params(m) == 29_360_128 + 229_376 + 7_168 + 220_200_960 + 64 * 27_525_120
    # 28 layers of 2 011 405 312 + embedding and head 151646·3584 = 543 499 264 each + final norm 3 584
    assert M.total_params(m) == 28 * 2_011_405_312 + 2 * 543_499_264 + 3_584
    assert M.total_params(m) == pytest.approx(57e9, rel=1e-2)  # "57B" (arXiv 2407.10671, Table 1)
    # activated: 28·(249 797 632 + 8·27 525 120) + 2·543 499 264 + 3 584 = 14 246 962 688 ("A14B")
    assert M.activated_params(m) == 14_246_962_688


def test_small_model_parameters():
    m = SMALL
    # attention 1024·3072 + 1024·1024 = 4 194 304; norms 2·1024 = 2 048
    # MoE layer: router 8·1024 = 8 192, shared 3·1024·1024 = 3 145 728, routed 8·3·1024·512 = 12 582 912
    assert M.layer_params(m) == 4_194_304 + 2_048 + 8_192 + 3_145_728 + 12_582_912
    # dense layer: 4 194 304 + 2 048 + 3·1024·2048 = 10 487 808
    assert M.layer_params(m, 0) == 10_487_808
    # + embedding 1 024 000 + head 1 024 000 + 1 024
    assert M.total_params(m) == 10_487_808 + 3 * 19_933_184 + 1_024_000 + 1_025_024
    # activated: MoE layer less 6 experts of 1 572 864: 19 933 184 − 9 437 184 = 10 496 000
    assert M.activated_params(m) == 10_487_808 + 3 * 10_496_000 + 1_024_000 + 1_025_024


def test_flops_count_activated_experts_shared_and_dense_layers():
    s, h = 512, 1024
    # QKV 3 221 225 472 + QKᵀ and PV 1 073 741 824 + projection 1 073 741 824 = 5 368 709 120
    attn = 2 * s * h * 3 * h + 4 * s * s * h + 2 * s * h * h
    dense = attn + 2 * s * h * 2048 * 3  # + 6 442 450 944 = 11 811 160 064
    # 2 routed experts of 2·s·h·512·3 = 1 610 612 736, the router 2·s·h·8, the shared MLP 2·s·h·1024·3
    moe = attn + 2 * 1_610_612_736 + 2 * s * h * 8 + 2 * s * h * 1024 * 3
    assert F.layer_forward_flops(SMALL, 0) == dense == 11_811_160_064
    assert F.layer_forward_flops(SMALL) == moe == 11_819_548_672
    # 3·B·(1 dense + 3 MoE + head 2·s·h·V), B = 2
    assert F.model_flops(SMALL, 2) == 6 * (dense + 3 * moe + 2 * s * h * 1000)
    # imbalance makes the busiest rank slower, not the model bigger
    assert F.model_flops(dataclasses.replace(SMALL, moe_imbalance=3.0), 2) == F.model_flops(SMALL, 2)


def _by_name(steps):
    return {st.name: st for st in steps}


def test_expert_kernels_use_the_expert_width_and_shared_mlp():
    L = Ly.layer_shape(SMALL, 1, t=1, ep=4)
    k = _by_name(Ly.forward_steps(L))
    # T = 512 tokens, 1024 routed copies over 8/4 = 2 local experts: 512 tokens each
    assert (k["moe.up"].m, k["moe.up"].n, k["moe.up"].k, k["moe.up"].batch) == (512, 1024, 1024, 2)  # 2·512 (gated)
    assert (k["moe.down"].m, k["moe.down"].n, k["moe.down"].k) == (512, 1024, 512)
    assert k["moe.up"].grouped and k["moe.down"].grouped
    assert (k["shared.up"].m, k["shared.up"].n, k["shared.up"].k) == (512, 2048, 1024)
    assert (k["shared.down"].m, k["shared.down"].n, k["shared.down"].k) == (512, 1024, 1024)
    assert k["swiglu"].bytes == 3 * 1024 * 512 * 2  # 1024 copies × width 512, 3 passes of 2 bytes
    # routed copies × h × 2 bytes, plus each copy's fp32 routing probability (Megatron's second all-to-all)
    assert k["moe.dispatch"].bytes == 1024 * 1024 * 2 + 1024 * 4


def test_imbalance_stretches_the_busiest_rank():
    L = dataclasses.replace(Ly.layer_shape(SMALL, 1, t=1, ep=4), imbalance=3.0)
    # busiest expert 3× the mean, its rank-mate at the mean: (3 + 1)/2 = 2× the rank's mean load
    assert L.rank_load == 2.0
    k = _by_name(Ly.forward_steps(L))
    assert k["moe.up"].m == 1024 and k["moe.down"].m == 1024  # 2·1024 copies / 2 experts
    # the all-to-all's S is one rank's routed copies (plus their fp32 probabilities): only the busiest
    # receiver gets twice the mean, in the plan (network/dispatch.py), not in every rank's buffer
    assert k["moe.dispatch"].bytes == 1024 * 1024 * 2 + 1024 * 4 and k["moe.combine"].bytes == 1024 * 1024 * 2
    assert k["moe.dispatch"].collective == dispatch_op("all_to_all_v", "in", load=2.0)
    assert k["moe.combine"].collective == dispatch_op("all_to_all_v", "out", load=2.0)
    assert k["swiglu"].bytes == 3 * 2048 * 512 * 2
    assert k["moe.permute"].bytes == 2 * 1024 * 1024 * 2  # the sender's side is unchanged: 2 passes of T·k·h
    b = _by_name(Ly.backward_steps(L))
    assert b["moe.down.dgrad"].m == 1024 and b["moe.dispatch_bwd"].bytes == 2 * 1024 * 1024 + 1024 * 4
    # without expert parallelism every rank holds all experts: the total stays the mean
    assert Ly.layer_shape(dataclasses.replace(SMALL, moe_imbalance=3.0), 1, ep=1).rank_load == 1.0


def test_grouped_gemm_efficiency_scales_the_flop_rate():
    gpu = GpuSpec("g", 1000e12, 3e12, 80e9, 4e-6, sm_count=132)
    kern = Ly.grouped_gemm("moe.up", 4096, 4096, 4096, Ly.layer_shape(SMALL, 1), 2)
    base = KC.kernel_time(kern, gpu)
    assert base == compute.gemm_time(4096, 4096, 4096, gpu, 2, 2)  # default 1: the batched GEMM
    half = KC.kernel_time(kern, dataclasses.replace(gpu, grouped_gemm_efficiency=0.5))
    # compute-bound (2·2·4096³ FLOPs over 3·2·4096²·2 bytes): half the rate, twice the time less launch
    assert half - 4e-6 == pytest.approx(2 * (base - 4e-6), rel=1e-12)


def test_activation_memory_of_experts():
    m = dataclasses.replace(SMALL, first_dense_layers=0)
    # per token, 2-byte elements, no dropout, t = 1: replicated 2·2h + 2h + 2h = 8192;
    # attention Q, K, V, proj input 2(h + h) + 2h + 2h = 8192; experts 2 × (2·2·512 + 2·512 + the fc1 input
    # 2·1024) = 10 240; shared (2·2·1024 + 2·1024) = 6144; scores a·s·2 = 8·512·2 = 8192 → 40 960 · s·b
    assert layer_activation_bytes(m, 1, 512) == 512 * 40_960
    # imbalance 3 over 2 local experts (ep 4): load (3 + 2 − 1)/2 = 2, experts 2·2 × (3072 + 2048) = 20 480
    # → 51 200
    imb = dataclasses.replace(m, moe_imbalance=3.0)
    assert layer_activation_bytes(imb, 1, 512, ep=4) == 512 * 51_200
    # expert tensor parallelism: each of the etp ranks keeps the fc1 input of all their tokens (gathered over
    # the expert-TP group): tp 2 with SP, etp 2 against 1: the fc1 term 2 copies · 2·1024 = 4096 B a token,
    # 512·4096/2 = 1 048 576 B a rank with etp 1, twice that with etp 2
    assert (layer_activation_bytes(m, 1, 512, 2, True, etp=2) - layer_activation_bytes(m, 1, 512, 2, True, etp=1)
            == 1_048_576)
    # the dense leading layer: its MLP 2·2·2048 + 2·2048 = 12 288 in place of experts + shared (6 144 + 6 144)
    assert layer_activation_bytes(SMALL, 1, 512, moe=False) == 512 * (8192 + 8192 + 12_288 + 8192)


def _scenario(model: ModelSpec, **par) -> Scenario:
    node = catalog.node("dgx-h100")
    return Scenario(name="t", cluster=ClusterSpec(nodes=1, node=node), model=model,
                    training=TrainingSpec(global_batch=8, micro_batch=1, attention="flash"),
                    parallel=ParallelSpec(**{"dp": 8, **par}))


def test_stage_parameters_with_dense_leading_layers():
    # pp 2, dp 4, ep 4: stage 0 holds layer 0 (dense) and layer 1 (MoE), stage 1 two MoE layers
    sc = _scenario(SMALL, pp=2, dp=4, ep=4)
    dense0, expert0 = _stage_params(M.resolve(SMALL), sc, 0, 2)
    # stage 0: dense layer 10 487 808 + MoE layer's shared part 4 194 304 + 2 048 + 8 192 + 3 145 728
    # = 7 350 272, + embedding 1 024 000; experts of one layer on 1 of 4 EP ranks: 12 582 912 / 4
    assert dense0 == 10_487_808 + 7_350_272 + 1_024_000
    assert expert0 == 12_582_912 / 4
    dense1, expert1 = _stage_params(M.resolve(SMALL), sc, 1, 2)
    assert dense1 == 2 * 7_350_272 + 1024 + 1_024_000  # + final norm and the head
    assert expert1 == 2 * 12_582_912 / 4


def run_scenario(sc: Scenario) -> dict:
    return summarize(simulate(sc, record_links=False))


def test_run_counts_model_flops_and_imbalance_slows_it():
    sc = _scenario(dataclasses.replace(SMALL, layers=4), ep=4)
    base = run_scenario(sc)
    slow = run_scenario(dataclasses.replace(sc, model=dataclasses.replace(SMALL, moe_imbalance=2.0)))
    # model FLOPs per GPU: 3·8·(dense + 3 MoE + head) / 8 GPUs (test_flops_... values)
    s, h = 512, 1024
    per_seq = 11_811_160_064 + 3 * 11_819_548_672 + 2 * s * h * 1000  # = 48 318 382 080
    assert base["model_tflops_per_gpu"] * 1e12 * base["iteration_time_s"] == pytest.approx(
        3 * 8 * per_seq / 8, rel=1e-9)
    assert slow["iteration_time_s"] > base["iteration_time_s"]


def test_setting_the_defaults_outright_changes_nothing():
    mixtral = catalog.model_preset("mixtral-8x7b")
    same = dataclasses.replace(mixtral, expert_ffn_hidden=mixtral.ffn_hidden, moe_imbalance=1.0)
    sc = dataclasses.replace(_scenario(mixtral, ep=8), training=TrainingSpec(global_batch=8, micro_batch=1,
                                                                             attention="flash"))
    assert run_scenario(sc)["iteration_time_s"] == run_scenario(
        dataclasses.replace(sc, model=same))["iteration_time_s"]


HEAD = ("name: x\ncluster:\n  nodes: 1\n  node: dgx-h100\ntraining:\n  global_batch: 8\nparallel:\n  tp: 2\n"
        "model:\n  layers: 4\n  hidden: 1024\n  heads: 8\n  seq_len: 512\n  vocab: 1000\n")


@pytest.mark.parametrize("extra,message", [
    ("  shared_experts: 2\n", "x.yaml:15: model.shared_experts: shared_experts (2) needs experts > 0 (an MoE model)"),
    ("  moe_imbalance: 0.5\n", "x.yaml:15: model.moe_imbalance: expected a number from 1 to 1e+06, got 0.5"),
    ("  experts: 8\n  top_k: 2\n  moe_imbalance: 5\n",
     "x.yaml:17: model.moe_imbalance: moe_imbalance (5) must be between 1 and experts/top_k = 8/2 = 4 "
     "(the busiest expert gets at most every token)"),
    ("  experts: 8\n  expert_ffn_hidden: 1001\n",
     "x.yaml:8: parallel.tp: model.expert_ffn_hidden (1001) must be divisible by tp (2)"),
    ("  experts: 8\n  first_dense_layers: 4\n",
     "x.yaml:16: model.first_dense_layers: first_dense_layers (4) must be less than layers (4): "
     "no MoE layer would be left"),
    ("  experts: 8\n  shared_expert_ffn_hidden: 512\n",
     "x.yaml:16: model.shared_expert_ffn_hidden: shared_expert_ffn_hidden needs shared_experts > 0"),
])
def test_rule_book(extra, message):
    with pytest.raises(ScenarioError) as info:
        load_scenario_text(HEAD + extra, "x.yaml")
    assert str(info.value) == message


def test_grouped_gemm_efficiency_is_a_gpu_key():
    text = ("name: x\ncluster:\n  nodes: 1\n  node:\n    preset: dgx-h100\n    gpu:\n      preset: H100-SXM5-80GB\n"
            "      grouped_gemm_efficiency: {}\n")
    assert load_scenario_text(text.format(0.8), "x.yaml").cluster.node.gpu.grouped_gemm_efficiency == 0.8
    with pytest.raises(ScenarioError) as info:
        load_scenario_text(text.format(1.5), "x.yaml")
    assert str(info.value) == ("x.yaml:8: cluster.node.gpu.grouped_gemm_efficiency: expected a number from 0 to 1, "
                               "got 1.5")
