"""Your own model: a one-GPU profile read into its parts, reshaped, re-parallelised (workload.profile)."""
import json
import os

import pytest

from emulator.cli import main
from emulator.devices import reshape as R
from emulator.importers.profile import ATTENTION, GEMM, read_profile
from emulator.scenario.spec import ProfiledSpec
from emulator.workload.profiled import host_idle

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRACE = os.path.join(ROOT, "traces", "h200-hf-gpt-1.3b", "trace.json.gz")
SPEC = ProfiledSpec(micro_batch=4, seq_len=2048, layers=24, hidden=2048, heads=16, vocab=50257)
MEASURED_S = 0.2605  # traces/h200-hf-gpt-1.3b/README.md: median step without the profiler, 260.5 and 262.2 ms


@pytest.fixture(scope="module")
def prof():
    return read_profile(TRACE, SPEC)


def _scenario(tmp_path, extra: str = "", node: str = "{preset: dgx-h200, gpus_per_node: 1}") -> str:
    path = tmp_path / "s.yaml"
    path.write_text(f"name: p\ncluster: {{nodes: 1, node: {node}}}\n"
                    f"workload:\n  profile: {TRACE}\n"
                    "  profiled: {micro_batch: 4, seq_len: 2048, layers: 24, hidden: 2048, heads: 16, vocab: 50257}\n"
                    + extra)
    return str(path)


def _run(capsys, path: str, *extra: str) -> dict:
    assert main(["run", path, "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


# ---------------------------------------------------------------------------- the laws


def test_symbols_evaluate_at_a_shape():
    at = R.Shape(b=2, s=1024, layers=4, h=2048, heads=16, kvh=4, ffn=5632, V=32000)
    # head dim 2048/16 = 128; fused QKV (16 + 2*4) * 128 = 3072; key/value width 4*128 = 512; tokens 2*1024
    assert [at.value(s) for s in ("hd", "qkv", "kv", "T", "ffn2")] == [128, 3072, 512, 2048, 11264]


def test_elementwise_law_scales_bytes_above_a_fixed_cost():
    at = R.Shape(b=8, s=2048, layers=1, h=2048, heads=16, kvh=16, ffn=8192, V=50257)
    t = R.elementwise_time(100e-6, ((("b", 4), ("s", 2048), ("h", 2048)),), at)
    # t0 = 1.2 us stays; the other 98.8 us doubles with the micro-batch (4 -> 8): 1.2 + 2 * 98.8 = 198.8 us
    assert t == pytest.approx(198.8e-6)
    # a constant dimension does not scale: [1, 2048] at b = 8 keeps its 1 -> ratio (1*2048)/(1*2048)... of h only
    assert R.elementwise_time(50e-6, ((("", 1), ("h", 2048)),), at) == pytest.approx(50e-6)


def test_host_idle_by_hand():
    # (GPU s, host gap, sync, dispatch). Step 1: C=1 G: 1->11; C=6, G 11->12; C=7, G 12->14, sync: C=14.
    # Step 2: C=15 > G=14: idle 1, G 15->25; C=20 < 25: idle 0, G 26; C=21: idle 0 -> [1, 0, 0]
    assert host_idle([(10, 1, False, 0), (1, 5, False, 0), (2, 1, True, 0)]) == [1, 0, 0]
    # the GPU's own dispatch latency: step 1 C=1, G 1->2; step 2 C=2, starts at max(G + 0.5, C) = 2.5: idle 0.5
    assert host_idle([(1, 1, False, 0.5)]) == [0.5]
    # a slower host: step 1 C=2, G 2->3; step 2 C=4 > G + 0.5 = 3.5: idle 1
    assert host_idle([(1, 2, False, 0.5)]) == [1]


# ---------------------------------------------------------------------------- the importer


def test_profile_splits_the_step_into_its_parts(prof):
    # the block repeats 24 times: 34 kernels forward (two layernorms, four GEMMs with their autocast casts,
    # SDPA, GELU in its tanh form as 8 element-wise kernels, two residual adds), 61 backward
    assert (len(prof.embed_fwd), len(prof.block_fwd), len(prof.block_bwd)) == (14, 34, 61)
    assert sum(k.cls == GEMM for k in prof.block_fwd) == 4 and sum(k.cls == GEMM for k in prof.block_bwd) == 8
    assert sum(k.cls == ATTENTION for k in prof.block_fwd + prof.block_bwd) == 2
    # every GEMM of the block names its token dimension: forward and input gradients as rows (M),
    # weight gradients contract over it (K)
    gemms = [k.gemm for k in prof.block_fwd + prof.block_bwd if k.gemm]
    assert all(("T", 8192) in g for g in gemms)
    assert sum(g[3] == ("T", 8192) for g in gemms) == 4  # the four weight gradients
    # the unaligned vocabulary projection: tokens x 50257 x 2048, forward
    head = [k.gemm for k in prof.head_fwd if k.gemm]
    assert head == [(("", 1), ("T", 8192), ("V", 50257), ("h", 2048))]
    assert prof.tied and prof.param_bytes == 4 and prof.dtype == "bf16"
    # the kernels of one step sum to ~256 ms (traces/h200-hf-gpt-1.3b/README.md: "about 256 ms")
    assert prof.kernel_seconds == pytest.approx(0.2564, rel=0.002)


def test_profile_parameters_are_gpt2s(prof):
    h, V = 2048, 50257
    # per block 12h^2 + 13h; wte V*h + wpe 2048*h; ln_f 2h; the head is tied to wte:
    # 24 * 50,358,272 + 102,926,336 + 4,194,304 + 4,096 = 1,315,723,264 (the trace README: 1.316 B)
    total = R.params(prof.embed_params) + 24 * R.params(prof.block_params) + R.params(prof.head_params)
    assert R.params(prof.block_params) == 12 * h * h + 13 * h
    assert total == V * h + 2048 * h + 24 * (12 * h * h + 13 * h) + 2 * h == 1_315_723_264


def test_a_contradicted_size_names_both(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text("name: p\ncluster: {nodes: 1, node: {preset: dgx-h200, gpus_per_node: 1}}\n"
                    f"workload:\n  profile: {TRACE}\n"
                    "  profiled: {micro_batch: 4, seq_len: 2048, layers: 24, hidden: 1024, heads: 16, vocab: 50257}\n")
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "workload.profiled.hidden is 1024" in err and "2048" in err


# ---------------------------------------------------------------------------- predictions


def test_the_profiled_configuration_predicts_its_measured_step(tmp_path, capsys):
    s = _run(capsys, _scenario(tmp_path))
    # every kernel at its measured time, plus the GPU's idle time waiting on the host and between kernels
    assert abs(s["iteration_time_s"] / MEASURED_S - 1) < 0.03
    assert s["compute_source"]["measured"] == pytest.approx(1.0)


def test_reshaping_changes_time_as_the_laws_say(tmp_path, capsys):
    base = _run(capsys, _scenario(tmp_path))["iteration_time_s"]
    wide = _run(capsys, _scenario(tmp_path, "model: {hidden: 2560, heads: 20}\n"))
    # 25 % wider: the GEMMs' FLOPs grow (2560/2048)^2 = 1.56x, element-wise work 1.25x: between the two
    assert 1.25 * base < wide["iteration_time_s"] < 1.56 * base
    assert wide["compute_source"]["interpolated"] > 0.5
    half = _run(capsys, _scenario(tmp_path, "model: {layers: 12}\n"))
    # half the blocks: the per-block time (~9.5 ms each way together) goes, embedding, head and loss stay
    assert 0.5 * base < half["iteration_time_s"] < 0.75 * base


def test_data_parallel_adds_ddps_all_reduce(tmp_path, capsys):
    one = _run(capsys, _scenario(tmp_path))
    eight = _run(capsys, _scenario(tmp_path, "parallel: {dp: 8}\n", node="dgx-h200"))
    assert eight["iteration_time_s"] > one["iteration_time_s"]
    # fp32 gradients of 1,315,723,264 parameters (S = 5,262,893,056 B), a ring all-reduce over 8 GPUs:
    # each GPU sends 2 * 7/8 * S = 9,210,062,848 B into the NVSwitch
    busiest = eight["links"]["busiest"][0]
    assert busiest["bytes"] == pytest.approx(2 * 7 / 8 * 1_315_723_264 * 4, rel=1e-9)


def test_tensor_parallel_splits_the_block_and_all_reduces_as_megatron(tmp_path, capsys):
    one = _run(capsys, _scenario(tmp_path))
    s = _run(capsys, _scenario(tmp_path, "parallel: {tp: 8}\n", node="dgx-h200"))
    # the split GEMMs, attention and tensors shrink; the host's launches (now the larger part) do not
    assert s["compute_source"]["interpolated"] > 0 and s["breakdown_s"]["compute"] < one["breakdown_s"]["compute"]
    # per layer 2 forward + 2 backward all-reduces of T*h bf16 (T = 4*2048, h = 2048), the vocab-parallel
    # embedding's forward one in fp32 (4 B) and the head's input gradient in bf16: S summed over the step
    # = T*h*(24*4*2 + 4 + 2) B; a ring over 8 GPUs sends 2*7/8 of it: 1.75 * 8192*2048*198 = 5,813,305,344 B
    assert s["links"]["busiest"][0]["bytes"] == pytest.approx(1.75 * 8192 * 2048 * 198, rel=1e-9)


@pytest.mark.parametrize("extra,key", [("parallel: {cp: 2, dp: 4}\n", "parallel.cp"),
                                       ("training: {recompute: full}\n", "training.recompute"),
                                       ("  trace: x.json\n", "workload.profile")])
def test_what_a_profile_cannot_say_is_refused_by_name(tmp_path, capsys, extra, key):
    (tmp_path / "x.json").write_text("{}")
    path = _scenario(tmp_path, "" if extra.startswith("  ") else extra, node="dgx-h200")
    if extra.startswith("  "):  # a workload key
        text = open(path).read().replace("workload:\n", "workload:\n" + extra)
        open(path, "w").write(text + "parallel: {dp: 8}\n")
    assert main(["run", path]) == 2
    assert key in capsys.readouterr().err


def test_replay_of_the_one_gpu_trace_is_within_2_percent(tmp_path, capsys):
    path = tmp_path / "r.yaml"
    path.write_text("name: r\ncluster: {nodes: 1, node: {preset: dgx-h200, gpus_per_node: 1}}\n"
                    f"workload: {{trace: {TRACE}, format: kineto}}\n")
    s = _run(capsys, str(path))
    # the host's ProfilerStep window (not the GPU-side copy of the annotation) holds 2,419 launches,
    # cuLaunchKernelEx ones included: 256.4 ms of kernels
    assert abs(s["iteration_time_s"] / MEASURED_S - 1) < 0.02


def test_mirroring_a_trace_without_communication_is_refused(tmp_path, capsys):
    path = tmp_path / "m.yaml"
    path.write_text("name: m\ncluster: {nodes: 1, node: dgx-h200}\n"
                    f"workload: {{trace: {TRACE}, format: kineto, mirror: 8}}\n")
    assert main(["run", str(path)]) == 2
    assert "workload.profile" in capsys.readouterr().err


def test_calibrate_records_the_dtype_each_gemm_ran_in():
    from emulator.scenario import catalog
    from emulator.tools.calibrate import fit_compute

    fit = fit_compute(TRACE, catalog.node("dgx-h200", None).gpu)
    rows = {dims: (dtype, t) for dims, dtype, t in fit.gemm_times}
    # under autocast every GEMM ran in bf16 (the outer aten::addmm says fp32: its weights are fp32)
    assert {d for d, _ in rows.values()} == {"bf16"}
    # and a GEMM's time is its own kernel's, not its operands' casts: the vocabulary projection, 15,743.4 us
    assert rows[(1, 8192, 50257, 2048)][1] == pytest.approx(15743.4e-6, rel=1e-5)


# ---------------------------------------------------------------------------- a second family

LLAMA = os.path.join(ROOT, "tests", "data", "profiles", "llama-cpu.json.gz")
LLAMA_SPEC = ProfiledSpec(micro_batch=2, seq_len=64, layers=4, hidden=256, heads=8, kv_heads=2, ffn_hidden=704,
                          vocab=1000)


def test_a_llama_profile_reads_into_the_same_parts():
    # tests/data/profiles/make_cpu_profile.py: Hugging Face Llama's ops (RMSNorm, RoPE, grouped-query
    # SDPA, SwiGLU) in a GPU profile's layout, from a CPU run (its times mean nothing)
    prof = read_profile(LLAMA, LLAMA_SPEC)
    h, kv, ffn = 256, 2 * 32, 704
    # per block: q and o (h*h each), k and v (h*kv each), gate, up, down (h*ffn each), two RMSNorm gains:
    # 2*65,536 + 2*16,384 + 3*180,224 + 2*256 = 705,024
    assert R.params(prof.block_params) == 2 * h * h + 2 * h * kv + 3 * h * ffn + 2 * h == 705_024
    assert R.params(prof.embed_params) == 1000 * h and R.params(prof.head_params) == h and prof.tied
    att = [k.attention for k in prof.block_fwd if k.attention]
    assert att == [(("b", 2), ("heads", 8), ("kvh", 2), ("s", 64), ("hd", 32))]
    fwd = [k.gemm for k in prof.block_fwd if k.gemm]
    # q, k, v, o, gate, up, down; the square q and o name their query side by position (before / after SDPA)
    assert [g[2][0] + "." + g[3][0] for g in fwd] == ["q.h", "kv.h", "kv.h", "h.q", "ffn.h", "ffn.h", "h.ffn"]


def test_a_llama_profile_predicts_at_other_sizes_and_layouts(tmp_path, capsys):
    path = tmp_path / "l.yaml"
    path.write_text("name: l\ncluster: {nodes: 1, node: dgx-h200}\n"
                    f"workload:\n  profile: {LLAMA}\n"
                    "  profiled: {micro_batch: 2, seq_len: 64, layers: 4, hidden: 256, heads: 8, kv_heads: 2, "
                    "ffn_hidden: 704, vocab: 1000}\n"
                    "model: {layers: 8, hidden: 512, heads: 16}\nparallel: {tp: 2, dp: 4}\n")
    s = _run(capsys, str(path))
    # kv heads keep their ratio to the heads (2/8 of 16 = 4, 2 a GPU) and the MLP to the hidden size
    assert s["iteration_time_s"] > 0 and s["links"]["busiest"] and s["compute_source"]["interpolated"] > 0


def test_a_step_that_runs_the_blocks_twice_is_refused():
    from emulator.importers.native import TraceError
    from emulator.importers.profile import ProfiledKernel, _one_pass

    def ks(names):
        return [ProfiledKernel(n, "elementwise", 1e-6, "fwd") for n in names]
    # embedding e, two layers of (a, b), head h: one pass is fine
    _one_pass(ks("eababh"), 1, 2, 2, "t")
    # the same model run again after the head (gradient accumulation): its block (a, b) comes back
    with pytest.raises(TraceError, match="more than 2 times"):
        _one_pass(ks("eababheabab"), 1, 2, 2, "t")


def test_memory_scales_from_the_profiled_peak():
    from emulator.scenario import load_scenario
    from emulator.workload.memory import memory_report

    one = os.path.join(ROOT, "scenarios", "profile-gpt-1.3b-1xh200.yaml")  # peak_memory: 53.4 GiB
    peak = 53.4 * 2**30  # 57,338,352,435.2 B
    # fp32 AdamW: parameter, gradient, two moments, 4 B each: 16 * 1,315,723,264 = 21,051,572,224 B of states;
    # the rest, 36,286,780,211.2 B, is the activations' (and logits', casts') share at b*s*h = 4*2048*2048
    states = 16 * 1_315_723_264
    assert memory_report(load_scenario(one)).peak_bytes_per_gpu == pytest.approx(peak, rel=1e-12)
    # autocast's bf16 copies of the weights and biases: per block 12h^2 + 9h (c_attn 2048x6144 + 6144, attn
    # c_proj 2048x2048 + 2048, c_fc 2048x8192 + 8192, mlp c_proj 8192x2048 + 2048), the tied head's V x h:
    # 2 B * (24 * 50,350,080 + 102,926,336) = 2,622,656,512 B, whatever the micro-batch
    copies = 2 * (24 * (12 * 2048**2 + 9 * 2048) + 50257 * 2048)
    assert copies == 2_622_656_512
    # micro-batch 8: the states and the copies stay, the rest doubles
    m8 = memory_report(load_scenario(one, ["training.micro_batch=8"]))
    assert m8.peak_bytes_per_gpu == pytest.approx(states + copies + 2 * (peak - states - copies), rel=1e-12)
    # FSDP (ZeRO-3) over 8 GPUs at the profiled batch: the states shrink to 1/8, the rest stays
    z3 = memory_report(load_scenario(one, ["cluster.node=dgx-h200", "parallel.dp=8", "parallel.zero=3",
                                           "training.global_batch=32"]))
    assert z3.peak_bytes_per_gpu == pytest.approx(peak - states * 7 / 8, rel=1e-12)
