"""Memory per GPU: hand-computed model states, activations, and whole reports."""
import pytest

from emulator.memory import WORKSPACE_BYTES, layer_activation_bytes, memory_report, model_state_bytes
from emulator.scenario import ClusterSpec, GpuSpec, ModelSpec, NodeSpec, ParallelSpec, Scenario, TrainingSpec, catalog
from emulator.workload import models as M

GPT22 = ModelSpec(layers=48, hidden=6144, heads=64, seq_len=2048, vocab=51200)
SBH = 2048 * 4 * 6144  # s·b·h = 50 331 648
A100 = GpuSpec("A100-SXM4-80GB", 312e12, 2039e9, 80 * 2**30, 4e-6)


def node(gpus: int) -> NodeSpec:
    return NodeSpec("n", gpus, A100, "nvswitch", 300e9, 0.15e-6, 230 / 300, gpus, 25e9, 0.5e-6, 0.96)


@pytest.mark.parametrize("zero,total", [(0, 16e9), (1, 5.5e9), (2, 3.75e9), (3, 2e9)])
def test_model_states(zero, total):
    # Ψ = 1e9, d = 8: ZeRO-1 4Ψ + 12Ψ/8 = 5.5e9; ZeRO-2 2Ψ + 14Ψ/8 = 3.75e9; ZeRO-3 16Ψ/8 = 2e9
    assert sum(model_state_bytes(1e9, 8, zero).values()) == pytest.approx(total)


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


def tiny(gpus=1, par=None, recompute="none") -> Scenario:
    m = ModelSpec(layers=2, hidden=1024, heads=16, seq_len=512, vocab=1024, tied_embeddings=True)
    par = par or ParallelSpec()
    return Scenario("t", ClusterSpec(1, node(gpus)), m, TrainingSpec(global_batch=8 * par.dp, micro_batch=1,
                                                                    recompute=recompute), par)


def test_single_gpu_report():
    # Ψ = 2·(12h² + 13h) + V·h + s·h + 2h = 25 192 448 + 1 048 576 + 524 288 + 2048 = 26 767 360
    # states 16Ψ = 428 277 760; activations 2 layers · sbh(34 + 5·16·512/1024) = 2·524 288·74
    # = 77 594 624, + embedding dropout mask sbh = 524 288; workspace 2^30 + fp32 logits
    # 4·512·1024 = 2 097 152. Peak = 428 277 760 + 78 118 912 + 1 075 838 976 = 1 582 235 648.
    sc = tiny()
    r = memory_report(sc)
    assert M.total_params(sc.model) == 26_767_360
    assert r.breakdown["params"] + r.breakdown["grads"] + r.breakdown["optimizer"] == 16 * 26_767_360
    assert r.breakdown["activations"] == 78_118_912
    assert r.breakdown["workspace"] == WORKSPACE_BYTES + 2_097_152
    assert r.peak_bytes_per_gpu == 1_582_235_648
    assert r.fits and r.capacity_bytes == 80 * 2**30


def test_pipeline_in_flight():
    # pp 2, 1F1B, 8 micro-batches. Stage 0: Ψ = 12 596 224 (layer) + 1 048 576 + 524 288 (embeddings)
    # = 14 169 088 → 226 705 408 B; it holds 2 micro-batches: 2·38 797 312 + 2·524 288 = 78 643 200;
    # + 2^30 → 1 379 090 432. Stage 1: Ψ = 12 596 224 + 1 048 576 (tied copy) + 2048 = 13 646 848
    # → 218 349 568 + 38 797 312 + 2^30 + 2 097 152 = 1 332 985 856. Peak: stage 0.
    r = memory_report(tiny(2, ParallelSpec(pp=2)))
    assert r.stage == 0
    assert r.breakdown["activations"] == 78_643_200
    assert r.peak_bytes_per_gpu == 1_379_090_432
    # GPipe: all 8 micro-batches on stage 0: 8·(38 797 312 + 524 288) = 314 572 800
    assert memory_report(tiny(2, ParallelSpec(pp=2, schedule="gpipe"))).breakdown["activations"] == 314_572_800


def test_does_not_fit():
    big = Scenario("b", ClusterSpec(1, node(8)), catalog.model_preset("gpt3-175b"),
                   TrainingSpec(global_batch=8, micro_batch=1), ParallelSpec(tp=8))
    r = memory_report(big)
    # 175e9/8 params · 16 B ≈ 350 GB ≫ 80 GiB
    assert not r.fits and r.peak_bytes_per_gpu > 16 * 174e9 / 8
