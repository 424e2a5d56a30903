"""Memory of runs that ran, and of a layout that does not fit (issue 28, item 4; docs/guides/moe-memory.md)."""
import pytest

from emulator.errors import ScenarioError
from emulator.scenario import load_scenario_text
from emulator.scenario.spec import TrainingSpec
from emulator.workload.memory import memory_report, optimizer_state_bytes

# NVIDIA's DGX Cloud recipe for Nemotron-4 340B in BF16 (NeMo 24.11): 128 H100 80 GB, TP 8, PP 8, 12 virtual
# stages, micro-batch 1, 16 accumulation steps, DP 2 (global batch 32), selective recompute, the distributed
# optimizer (Apex DistributedFusedAdam), bf16 gradient reduction. It ran.
NEMOTRON_BF16 = """
name: nemotron4-340b-bf16-128-h100
cluster: {nodes: 16, node: dgx-h100}
model: {preset: nemotron4-340b}
training: {global_batch: 32, micro_batch: 1, recompute: selective, attention: flash, grad_reduce: bf16,
           optimizer: %s}
parallel: {tp: 8, pp: 8, dp: 2, sequence_parallel: true, zero: 1, schedule: interleaved-1f1b, virtual_stages: 12}
"""
# stage 0 holds Ψ = 5 771 722 752 parameters per GPU (tests/test_memory.py, NEMOTRON_PSI)
PSI = 5_771_722_752


def test_apex_state_is_ten_bytes_with_bf16_weights():
    # int16 remainder + fp32 exp_avg + fp32 exp_avg_sq (apex StateBucket, store_param_remainders)
    assert optimizer_state_bytes(TrainingSpec(optimizer="apex")) == 10.0
    assert optimizer_state_bytes(TrainingSpec(optimizer="apex", precision="fp16")) == 12.0  # fp32 master
    assert optimizer_state_bytes(TrainingSpec(optimizer="apex", precision="fp8", fp8_params=True)) == 12.0
    assert optimizer_state_bytes(TrainingSpec()) == 12.0  # Megatron-Core: fp32 main weight, m, v


def test_nemotron4_340b_bf16_dp2_fits_with_apex_dfa():
    r = memory_report(load_scenario_text(NEMOTRON_BF16 % "apex", "nemotron.yaml"))
    assert r.stage == 0
    # bf16 weights 2Ψ and the unsharded bf16 grad buffer 2Ψ; DFA's 10 B state over DP 2: 5Ψ = 28 858 613 760
    assert r.breakdown["params"] == 2 * PSI and r.breakdown["grads"] == 2 * PSI
    assert r.breakdown["optimizer"] == 5 * PSI
    # 103 in-flight one-layer chunks of 267 386 880 B (tests/test_memory.py) = 27 540 848 640
    assert r.breakdown["activations"] == 103 * 267_386_880
    # 9Ψ = 51 945 504 768 + 27 540 848 640 + 2^30 = 80 560 095 232 B ≤ 80 GiB (85 899 345 920): fits by 5.3 GB
    assert r.peak_bytes_per_gpu == 80_560_095_232 and r.fits


def test_nemotron4_340b_bf16_dp2_with_fp32_masters_is_the_old_86_gb():
    # the same layout with Megatron-Core's 12 B state: 6Ψ instead of 5Ψ → 86 331 817 984 B, over 80 GiB
    r = memory_report(load_scenario_text(NEMOTRON_BF16 % "megatron", "nemotron.yaml"))
    assert r.peak_bytes_per_gpu == 80_560_095_232 + PSI and not r.fits


def test_apex_needs_a_sharded_optimizer():
    text = (NEMOTRON_BF16 % "apex").replace("zero: 1", "zero: 0")
    with pytest.raises(ScenarioError) as info:
        load_scenario_text(text, "nemotron.yaml")
    assert info.value.key == "training.optimizer" and "needs parallel.zero 1 or 2, got 0" in str(info.value)


# Korthikanti et al. 2022 (arXiv 2205.05198), Table 3: GPT-3 175B on 64 A100 80 GB, TP 8, PP 8, micro-batch 1,
# global batch 64, sequence 2048. Its Figure 1 shows the tensor-parallel baseline (no sequence parallelism,
# no recompute) needing more than the A100's 80 GB, which is why that baseline recomputes in full; the
# paper's own runs use sequence parallelism with selective recompute.
GPT3_175B = """
name: gpt3-175b-64-a100
cluster: {nodes: 8, node: dgx-a100}
model: {preset: gpt3-175b}
training: {global_batch: 64, micro_batch: 1, recompute: %s}
parallel: {tp: 8, pp: 8, dp: 1, sequence_parallel: %s}
"""


def test_gpt3_175b_without_recompute_does_not_fit():
    # Per layer (TP alone): s·b·h·(10 + 24/t + 5·a·s/(h·t)) = 2048·12288·(10 + 3 + 5·96·2048/(12288·8))
    # = 25 165 824·23 = 578 813 952 B; stage 0 (1F1B) holds p = 8 micro-batches of its 12 layers:
    # 96 layers = 55 566 139 392 B, and the embedding's 1-byte dropout mask s·b·h = 25 165 824 B of each of the
    # 8 micro-batches; beside 16 B·Ψ (Ψ ≈ 2.9e9 with the embedding) of model states
    r = memory_report(load_scenario_text(GPT3_175B % ("none", "false"), "gpt3.yaml"))
    assert r.breakdown["activations"] == 96 * 578_813_952 + 8 * 25_165_824
    assert r.peak_bytes_per_gpu > 100e9 and not r.fits
    # the layout the paper ran: SP and selective recompute keep 34·s·b·h/t = 106 954 752 B a layer
    ran = memory_report(load_scenario_text(GPT3_175B % ("selective", "true"), "gpt3.yaml"))
    assert ran.fits
