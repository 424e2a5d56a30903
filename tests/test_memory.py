"""Memory per GPU: hand-computed model states, activations, and whole reports."""
import pytest

from emulator.scenario import ClusterSpec, GpuSpec, ModelSpec, NodeSpec, ParallelSpec, Scenario, TrainingSpec, catalog
from emulator.workload import models as M
from emulator.workload.activations import layer_activation_bytes
from emulator.workload.memory import WORKSPACE_BYTES, memory_report, model_state_bytes

GPT22 = ModelSpec(layers=48, hidden=6144, heads=64, seq_len=2048, vocab=51200)
SBH = 2048 * 4 * 6144  # s·b·h = 50 331 648
A100 = GpuSpec("A100-SXM4-80GB", 312e12, 2039e9, 80 * 2**30, 4e-6)


def node(gpus: int) -> NodeSpec:
    return NodeSpec("n", gpus, A100, "nvswitch", 300e9, 0.15e-6, 230 / 300, gpus, 25e9, 0.5e-6, 0.96)


@pytest.mark.parametrize("zero,total", [(0, 16e9), (1, 5.5e9), (2, 3.75e9), (3, 2e9)])
def test_model_states(zero, total):
    # Ψ = 1e9, d = 8: ZeRO-1 4Ψ + 12Ψ/8 = 5.5e9; ZeRO-2 2Ψ + 14Ψ/8 = 3.75e9; ZeRO-3 16Ψ/8 = 2e9
    assert sum(model_state_bytes(1e9, 8, zero).values()) == pytest.approx(total)


@pytest.mark.parametrize("zero,total", [(0, 18e9), (1, 7.5e9), (2, 3.75e9 + 0.25e9), (3, 2.25e9)])
def test_model_states_with_fp32_gradients(zero, total):
    # g = 4 (fp32 main_grad), Ψ = 1e9, d = 8: ZeRO-0 (14 + 4)Ψ = 18e9; ZeRO-1 (2 + 4)Ψ + 12Ψ/8 = 7.5e9;
    # ZeRO-2 2Ψ + 16Ψ/8 = 4e9; ZeRO-3 18Ψ/8 = 2.25e9
    assert sum(model_state_bytes(1e9, 8, zero, grad_bytes=4).values()) == pytest.approx(total)


def test_korthikanti_formulas():
    # TP alone: sbh(10 + 24/8 + 5·64·2048/(6144·8)) = sbh·26.3333 = 1 325 400 064
    assert layer_activation_bytes(GPT22, 4, 2048, 8) == pytest.approx(SBH * (10 + 3 + 40 / 3))
    # SP: sbh(34 + 5·64·2048/6144)/8 = sbh·140.6667/8 = 884 998 144
    assert layer_activation_bytes(GPT22, 4, 2048, 8, sp=True) == pytest.approx(SBH * (34 + 320 / 3) / 8)
    # selective: 34·sbh/8 with SP, sbh(10 + 24/8) without
    assert layer_activation_bytes(GPT22, 4, 2048, 8, True, "selective") == pytest.approx(34 * SBH / 8)
    assert layer_activation_bytes(GPT22, 4, 2048, 8, False, "selective") == pytest.approx(13 * SBH)
    # full: 2sbh (2sbh/t with SP)
    assert layer_activation_bytes(GPT22, 4, 2048, 8, False, "full") == 2 * SBH
    assert layer_activation_bytes(GPT22, 4, 2048, 8, True, "full") == 2 * SBH / 8
    # flash attention drops the 5as/h term
    assert layer_activation_bytes(GPT22, 4, 2048, 8, True, "none", flash=True) == pytest.approx(34 * SBH / 8)


def tiny(gpus=1, par=None, recompute="none", grad_reduce="auto") -> Scenario:
    m = ModelSpec(layers=2, hidden=1024, heads=16, seq_len=512, vocab=1024, tied_embeddings=True)
    par = par or ParallelSpec()
    return Scenario("t", ClusterSpec(1, node(gpus)), m, TrainingSpec(global_batch=8 * par.dp, micro_batch=1,
                                                                    recompute=recompute, grad_reduce=grad_reduce),
                    par)


def test_single_gpu_report():
    # Ψ = 2·(12h² + 13h) + V·h + s·h + 2h = 25 192 448 + 1 048 576 + 524 288 + 2048 = 26 767 360
    # bf16 training reduces (and holds) gradients in fp32 (grad_reduce auto, Megatron-LM): states
    # (2 + 4 + 12)Ψ = 18Ψ = 481 812 480; activations 2 layers · sbh(34 + 5·16·512/1024) = 2·524 288·74
    # = 77 594 624, + embedding dropout mask sbh = 524 288; workspace 2^30 + fp32 logits
    # 4·512·1024 = 2 097 152. Peak = 481 812 480 + 78 118 912 + 1 075 838 976 = 1 635 770 368.
    sc = tiny()
    r = memory_report(sc)
    assert M.total_params(sc.model) == 26_767_360
    assert r.breakdown["params"] + r.breakdown["grads"] + r.breakdown["optimizer"] == 18 * 26_767_360
    assert r.breakdown["grads"] == 4 * 26_767_360
    assert r.breakdown["activations"] == 78_118_912
    assert r.breakdown["workspace"] == WORKSPACE_BYTES + 2_097_152
    assert r.peak_bytes_per_gpu == 1_635_770_368
    # with bf16 gradients (grad_reduce: bf16) the states are 16Ψ: 53 535 720 B less
    bf16 = memory_report(tiny(grad_reduce="bf16"))
    assert bf16.peak_bytes_per_gpu == 1_635_770_368 - 2 * 26_767_360
    assert r.fits and r.capacity_bytes == 80 * 2**30


def test_pipeline_in_flight():
    # pp 2, 1F1B, 8 micro-batches. Stage 0: Ψ = 12 596 224 (layer) + 1 048 576 + 524 288 (embeddings)
    # = 14 169 088 → 18Ψ = 255 043 584 B; it holds 2 micro-batches: 2·38 797 312 + 2·524 288 = 78 643 200;
    # + 2^30 → 1 407 428 608. Stage 1: Ψ = 12 596 224 + 1 048 576 (tied copy) + 2048 = 13 646 848
    # → 245 643 264 + 38 797 312 + 2^30 + 2 097 152 = 1 360 279 552. Peak: stage 0.
    r = memory_report(tiny(2, ParallelSpec(pp=2)))
    assert r.stage == 0
    assert r.breakdown["activations"] == 78_643_200
    assert r.peak_bytes_per_gpu == 1_407_428_608
    # GPipe: all 8 micro-batches on stage 0: 8·(38 797 312 + 524 288) = 314 572 800
    assert memory_report(tiny(2, ParallelSpec(pp=2, schedule="gpipe"))).breakdown["activations"] == 314_572_800


def test_does_not_fit():
    big = Scenario("b", ClusterSpec(1, node(8)), catalog.model_preset("gpt3-175b"),
                   TrainingSpec(global_batch=8, micro_batch=1), ParallelSpec(tp=8))
    r = memory_report(big)
    # 175e9/8 params · 16 B ≈ 350 GB ≫ 80 GiB
    assert not r.fits and r.peak_bytes_per_gpu > 16 * 174e9 / 8


# NeMo's H100 performance table (NeMo 81d94d15 to 64e6c666, Feb-Mar 2025,
# scripts/performance/recommended_model_configs/model_configs_h100.csv, rows pre_train,nemotron4,340b) lists two
# layouts on 128 H100, TP8 PP8 VP12, micro-batch 1, global batch 32: bf16 with CP2 (so DP 128/(8·8·2) = 1,
# scripts/performance/utils.py line 224) and fp8 with CP1, DP2. The DP2 layout is thus the fp8 run. The recipe
# sets no activation recompute (nemotron4_340b.py; Megatron-LM 791b70e0 transformer_config.py: recompute_granularity
# None); with fused attention the bf16 activations are the same under selective recompute.
NEMOTRON_340B = """
name: nemotron4-340b-128-h100
cluster: {nodes: 16, node: dgx-h100}
model: {preset: nemotron4-340b}
training: {global_batch: 32, micro_batch: 1, recompute: none, attention: flash, grad_reduce: bf16}
parallel: {tp: 8, pp: 8, dp: %d, cp: %d, sequence_parallel: true, zero: 1, schedule: interleaved-1f1b, virtual_stages: 12}
"""

# Stage 0 holds 12 layers (8 stages × 12 chunks of 1 layer) and the embedding. Per layer and GPU:
# (QKV h·(h + 2·1536) + proj h² + MLP 2·h·f)/8 + two LayerNorms' gains and shifts 4h = (396 361 728
# + 339 738 624 + 2 717 908 992)/8 + 73 728 = 431 824 896; ×12 = 5 181 898 752; + embedding 256 000·h/8
# = 589 824 000 → Ψ = 5 771 722 752; 10Ψ = 57 717 227 520 (bf16 weight 2 + bf16 gradient 2 + 12/2 Adam).
NEMOTRON_PSI = 5_771_722_752


def test_nemotron_layer_activations_by_hand():
    # Nemotron-4 340B, one layer, b 1, s 4096, t 8, SP, flash: no dropout masks, no s² terms.
    # Stored (2-byte elements, all sharded by t with SP): two norm inputs 2·2h, QKV and MLP GEMM
    # inputs 2h + 2h, Q 2h, K and V 2·2·kv_dim (kv_dim = 8·192 = 1536), projection input 2h,
    # MLP up output 2f and squared-ReLU output 2f (f = 4h = 73 728, not gated):
    # (12h + 4·1536 + 4f)·s·b/t = (221 184 + 6 144 + 294 912)·512 = 267 386 880 B
    m = catalog.model_preset("nemotron4-340b")
    assert (m.activation, m.biases, m.dropout, m.swiglu) == ("squared_relu", False, False, False)
    assert layer_activation_bytes(m, 1, 4096, 8, True, "selective", flash=True) == 267_386_880
    # CP2 halves the sequence each rank holds: 522 240·2048/8 = 133 693 440 B
    assert layer_activation_bytes(m, 1, 2048, 8, True, "selective", flash=True) == 133_693_440


def test_nemotron4_340b_bf16_layout_fits():
    """NeMo's bf16 Nemotron-4 340B layout on 128 H100 (CP2, DP1), term by term (README, "Memory")."""
    from emulator.scenario import load_scenario_text

    r = memory_report(load_scenario_text(NEMOTRON_340B % (1, 2), "nemotron.yaml"))
    assert r.stage == 0
    assert r.breakdown["params"] == 2 * NEMOTRON_PSI and r.breakdown["grads"] == 2 * NEMOTRON_PSI
    assert r.breakdown["optimizer"] == 12 * NEMOTRON_PSI / 2  # distributed optimizer over dp·cp = 2
    # Megatron's interleaved warm-up on stage 0: (p − 1)·2 + (v − 1)·p = 14 + 88 = 102 chunk passes,
    # plus the one in 1F1B: 103 one-layer chunks of 133 693 440 B = 13 770 424 320 B
    assert r.breakdown["activations"] == 103 * 133_693_440
    # 57 717 227 520 + 13 770 424 320 + 2^30 = 72 561 393 664 B: fits 80 GiB (85 899 345 920) by 13.3 GB
    assert r.peak_bytes_per_gpu == 72_561_393_664 and r.fits


def test_nemotron4_340b_dp2_layout_in_bf16_does_not_fit():
    """The DP2 layout in bf16 with Megatron-Core's 12 B optimizer state: it would not fit. It ran in bf16 with
    Apex DistributedFusedAdam, whose state is 10 B (training.optimizer: apex), and fits
    (tests/test_memory_recipes.py)."""
    from emulator.scenario import load_scenario_text

    r = memory_report(load_scenario_text(NEMOTRON_340B % (2, 1), "nemotron.yaml"))
    assert r.stage == 0
    assert r.breakdown["params"] + r.breakdown["grads"] + r.breakdown["optimizer"] == 10 * NEMOTRON_PSI
    # 103 one-layer chunks of 267 386 880 B = 27 540 848 640 B
    assert r.breakdown["activations"] == 103 * 267_386_880
    # 57 717 227 520 + 27 540 848 640 + 2^30 = 86 331 817 984 B, 0.43 GB above 80 GiB
    assert r.peak_bytes_per_gpu == 86_331_817_984 and not r.fits


def test_fp8_keeps_gemm_inputs_in_one_byte():
    # GPT-3 22B layer, b 4, s 2048, t 8, SP, selective recompute. bf16 keeps 34·sbh/t: norm inputs 4h,
    # dropout masks 2h, QKV and MLP inputs 2h + 2h; Q, K, V 6h, projection input 2h, GeLU input 8h and
    # output 8h. In fp8 (TE 1.14) the QKV and MLP inputs (ln_out), the projection input and the fc2 input
    # are saved in one byte: 34 − 1 − 1 − 1 − 4 = 27 → 27·sbh/8 = 169 869 312 B
    assert layer_activation_bytes(GPT22, 4, 2048, 8, True, "selective", fp8=True) == 27 * SBH / 8
    # Nemotron-4 340B, s 4096, t 8, SP, flash. No recompute: TE's fused attention also keeps its bf16
    # output (2h) beside the projection's fp8 copy (h): 4h + h + 2h + 4·1536 + 3h + h + 2f + f
    # = 11h + 6144 + 3f = 430 080 B a token → ·512 = 220 200 960 B
    m = catalog.model_preset("nemotron4-340b")
    assert layer_activation_bytes(m, 1, 4096, 8, True, "none", flash=True, fp8=True) == 220_200_960
    # selective recompute keeps only Q, K, V of the attention: 11h − 2h → 393 216·512 = 201 326 592 B
    assert layer_activation_bytes(m, 1, 4096, 8, True, "selective", flash=True, fp8=True) == 201_326_592


NEMOTRON_FP8 = NEMOTRON_340B.replace("grad_reduce: bf16", "grad_reduce: bf16, precision: fp8, fp8_params: %s")


def test_nemotron4_340b_fp8_layout_fits():
    """NeMo's fp8 Nemotron-4 340B layout on 128 H100 (DP2): bf16_with_fp8_mixed (fp8_params = True), no
    activation recompute in the recipe, bf16 gradients (README, "Memory")."""
    from emulator.scenario import load_scenario_text

    r = memory_report(load_scenario_text(NEMOTRON_FP8 % ("true", 2, 1), "nemotron.yaml"))
    # GEMM weights of stage 0: 12 layers × (396 361 728 + 339 738 624 + 2 717 908 992)/8 = 12 × 431 751 168
    # = 5 181 014 016, held in fp8 (1 B, not 2): params 2Ψ − 5 181 014 016 = 11 543 445 504 − 5 181 014 016
    # = 6 362 431 488; bf16 gradients 2Ψ = 11 543 445 504; Adam 6Ψ = 34 630 336 512
    assert r.stage == 0
    assert r.breakdown["params"] == 6_362_431_488
    assert r.breakdown["grads"] == 11_543_445_504 and r.breakdown["optimizer"] == 34_630_336_512
    # 103 one-layer chunks × 220 200 960 B = 22 680 698 880 B
    assert r.breakdown["activations"] == 103 * 220_200_960
    # 52 536 213 504 + 22 680 698 880 + 2^30 = 76 290 654 208 B: fits 80 GiB by 9.6 GB
    assert r.peak_bytes_per_gpu == 76_290_654_208 and r.fits
    # with bf16 weights TE caches an fp8 copy and its transpose: +2 B per GEMM weight instead of −1 B:
    # params 11 543 445 504 + 10 362 028 032 = 21 905 473 536 → peak 76 290 654 208 + 3·5 181 014 016
    # = 91 833 696 256 B: does not fit
    bf16_weights = memory_report(load_scenario_text(NEMOTRON_FP8 % ("false", 2, 1), "nemotron.yaml"))
    assert bf16_weights.breakdown["params"] == 21_905_473_536
    assert bf16_weights.peak_bytes_per_gpu == 91_833_696_256 and not bf16_weights.fits


def test_fp8_weights_of_an_moe_model():
    # Mixtral 8x7B on 8 GPUs, dp 8, ep 8, ZeRO-1. GEMM weights per layer: attention 4096·(4096 + 2·8·128)
    # + 4096² = 41 943 040; one expert 3·4096·14 336 = 176 160 768, 8 experts over ep 8 → one per GPU.
    # 32 layers: 32·(41 943 040 + 176 160 768) = 6 979 321 856 B fewer with fp8 weights than in bf16.
    m = catalog.model_preset("mixtral-8x7b")
    par = ParallelSpec(dp=8, ep=8, zero=1)
    h100 = NodeSpec("n", 8, catalog.gpu("H100-SXM5-80GB"), "nvswitch", 450e9, 0.15e-6, 0.8, 8, 50e9, 0.5e-6, 0.96)
    bf16 = memory_report(Scenario("m", ClusterSpec(1, h100), m, TrainingSpec(global_batch=8, micro_batch=1), par))
    fp8 = memory_report(Scenario("m", ClusterSpec(1, h100), m, TrainingSpec(
        global_batch=8, micro_batch=1, precision="fp8", fp8_params=True), par))
    assert bf16.breakdown["params"] - fp8.breakdown["params"] == 6_979_321_856
