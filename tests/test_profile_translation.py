"""A profile taken on one GPU predicted on another: its kernels translated (devices/translation.py)."""
import json
import os
from dataclasses import replace

import pytest

from emulator.cli import main
from emulator.devices import translation as TR
from emulator.errors import ScenarioError
from emulator.importers.profile import ATTENTION, ELEMENTWISE, GEMM, ProfiledKernel, read_profile, shape_of
from emulator.scenario import catalog
from emulator.scenario.reader import load_scenario
from emulator.scenario.spec import ProfiledSpec
from emulator.workload import profiled as PW

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRACE = os.path.join(ROOT, "traces", "h200-hf-gpt-1.3b", "trace.json.gz")
SPEC = ProfiledSpec(micro_batch=4, seq_len=2048, layers=24, hidden=2048, heads=16, vocab=50257)
H200, H100, A100, B200 = (catalog.gpu(n) for n in ("H200-SXM", "H100-SXM5-80GB", "A100-SXM4-80GB", "B200"))


@pytest.fixture(scope="module")
def prof():
    return read_profile(TRACE, SPEC)


def _scenario(tmp_path, node: str) -> str:
    path = tmp_path / f"{node}.yaml"
    path.write_text(f"name: p\ncluster: {{nodes: 1, node: {{preset: {node}, gpus_per_node: 1}}}}\n"
                    f"workload:\n  profile: {TRACE}\n"
                    "  profiled: {micro_batch: 4, seq_len: 2048, layers: 24, hidden: 2048, heads: 16, vocab: 50257}\n")
    return str(path)


def _run(capsys, path: str) -> dict:
    assert main(["run", path, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


# ---------------------------------------------------------------------------- the GPU a trace names


def test_the_trace_names_its_gpu(prof):
    # traces/h200-hf-gpt-1.3b: deviceProperties [{"id": 0, "name": "NVIDIA H200", ...}]
    assert prof.device == "NVIDIA H200"
    assert TR.catalog_name(prof.device) == "H200-SXM"
    assert TR.catalog_name(" nvidia h100 80gb hbm3 ") == "H100-SXM5-80GB"
    assert TR.catalog_name("NVIDIA H100 PCIe") is None  # not a catalog GPU: other clocks and bandwidth


def test_same_gpu_is_not_translated(tmp_path, prof):
    sc = load_scenario(_scenario(tmp_path, "dgx-h200"))
    assert PW.source_gpu(sc, prof) is None
    assert PW.translation_report(sc) is None


# ---------------------------------------------------------------------------- the laws, by hand


def test_bandwidth_ratio_by_hand():
    # achieved HBM: hbm_bandwidth x memory efficiency (E_MEM 0.90 where the catalog gives none; B200 0.756)
    # H200 4800 x 0.90 = 4320 GB/s, H100 3350 x 0.90 = 3015 GB/s: 4320 / 3015 = 1.432836
    assert TR.bandwidth_ratio(H200, H100) == pytest.approx(1.432836, rel=1e-6)
    # B200 8000 x 0.756 = 6048 GB/s: 4320 / 6048 = 0.714286
    assert TR.bandwidth_ratio(H200, B200) == pytest.approx(0.714286, rel=1e-6)
    # a 101.2 us kernel: its first 1.2 us (reshape.FIXED_S) as measured, the other 100 us x 1.432836
    assert TR.memory_time(101.2e-6, H200, H100) == pytest.approx(1.2e-6 + 143.2836e-6, rel=1e-6)
    assert TR.memory_time(1.0e-6, H200, H100) == 1.0e-6  # launch-bound: below the fixed part, as measured


def _block_kernel(prof, cls: str, sides: tuple[str, ...] | None = None) -> ProfiledKernel:
    return next(k for k in prof.block_fwd if k.cls == cls and (sides is None or tuple(d[0] for d in k.gemm) == sides))


def test_gemm_on_an_a100_by_the_rooflines_ratio(prof):
    k = _block_kernel(prof, GEMM, ("", "T", "qkv", "h"))  # the QKV projection: M = 8192 tokens, N = 6144, K = 2048
    P = prof.shape
    t = PW.reshaped(k, P, P, A100, 1.0, H200).seconds
    # The roofline of (8192 x 2048) . (2048 x 6144), 2mnk = 2.0616e11 FLOPs, on each GPU (tables left out):
    # H200: tiles 64 x 48 = 3072 on 132 SMs, 24 waves: e_tile = 8192*6144 / (24*132*128^2) = 0.969697;
    #   k/(k+64) = 2048/2112 = 0.969697; gemm max 0.695 x 0.803/0.869 = 0.642209: e = 0.603886;
    #   2.0616e11 / (989.4e12 x 0.603886) = 345.05 us (+4 us launch = 349.05 us; its bytes, 159.4 MB, take 36.9 us)
    # A100: 3072 tiles on 108 SMs, 29 waves: e_tile = 50331648 / (29*108*16384) = 0.980843; gemm max 0.695:
    #   e = 0.695 x 0.980843 x 0.969697 = 0.661037; 2.0616e11 / (312e12 x 0.661037) = 999.59 us (+4 = 1003.59 us)
    # ratio 1003.59 / 349.05 = 2.87521: the measured time (the mean over the 24 layers) x 2.87521
    assert t == pytest.approx(k.seconds * 2.87521, rel=2e-4)
    # on an H100 (the H200's die: same peak, SMs, matmul fraction; compute-bound on both) the ratio is 1
    assert PW.reshaped(k, P, P, H100, 1.0, H200).seconds == pytest.approx(k.seconds, rel=1e-12)


def test_h100_keeps_every_block_gemm_and_moves_memory_kernels(prof):
    P = prof.shape
    ratio = 1.432836  # test_bandwidth_ratio_by_hand
    for k in prof.block_fwd + prof.block_bwd:
        t = PW.reshaped(k, P, P, H100, 1.0, H200).seconds
        if k.cls in (GEMM, ATTENTION):  # the H100's roofline is the H200's wherever compute bounds the kernel
            assert t == pytest.approx(k.seconds, rel=1e-3), k.name
        elif k.cls == ELEMENTWISE:
            t0 = min(k.seconds, 1.2e-6)
            assert t == pytest.approx(t0 + (k.seconds - t0) * ratio, rel=1e-5), k.name


def test_no_kernel_beats_the_peak():
    # a GEMM of 2 x 8192 x 2048 x 2048 = 6.8719e10 FLOPs "measured" at 1 us: faster than any GPU can run it;
    # held at its FLOPs at the H200's bf16 peak, 6.8719e10 / 989.4e12 = 69.455 us
    k = ProfiledKernel("gemm", GEMM, 1e-6, "fwd", "aten::mm", "bf16",
                       gemm=(("", 1), ("T", 8192), ("h", 2048), ("h", 2048)))
    P = shape_of(SPEC)
    r = PW.reshaped(k, P, P, H200)
    assert r.capped and r.seconds == pytest.approx(69.455e-6, rel=1e-4)


# ---------------------------------------------------------------------------- refusals


def test_bf16_on_a_v100_is_refused(tmp_path, capsys):
    path = _scenario(tmp_path, "dgx-v100")
    assert main(["run", path]) == 2
    err = capsys.readouterr().err
    assert f"{path}:4: workload.profile:" in err
    assert "V100-SXM2-32GB has no bf16 tensor cores" in err and "H200-SXM (NVIDIA H200)" in err


def test_fp8_on_a_gpu_without_fp8_is_refused():
    assert "A100-SXM4-80GB has no FP8" in TR.refusal(A100, {"fp8"})
    assert TR.refusal(H100, {"fp8", "bf16"}) is None
    assert TR.refusal(A100, {"bf16"}) is None


def test_unknown_gpu_is_refused_by_name(tmp_path, prof):
    sc = load_scenario(_scenario(tmp_path, "dgx-h100"))
    with pytest.raises(ScenarioError, match="'NVIDIA H100 PCIe'.*no catalog GPU is known by"):
        PW.check_gpu(sc, replace(prof, device="NVIDIA H100 PCIe"))
    PW.check_gpu(sc, replace(prof, device=""))  # a trace that names no GPU: taken as the node's


# ---------------------------------------------------------------------------- the run


@pytest.mark.parametrize("node,bandwidth", [("dgx-h100", 1.432836), ("dgx-a100", 4320 / (2039 * 0.9)),
                                            ("dgx-b200", 0.714286)])
def test_translated_run_reports_and_stays_below_peak(tmp_path, capsys, node, bandwidth):
    s = _run(capsys, _scenario(tmp_path, node))
    tr = s["translation"]
    assert (tr["from"], tr["device"]) == ("H200-SXM", "NVIDIA H200")
    assert tr["bandwidth_ratio"] == pytest.approx(bandwidth, rel=1e-6)
    # the classes cover the profiled step: kernels by their laws plus the host's idle time
    assert sum(c["share"] for c in tr["classes"].values()) == pytest.approx(1.0, rel=1e-9)
    assert tr["classes"]["host"]["translated_s"] == tr["classes"]["host"]["measured_s"]  # the host as measured
    assert 0 < s["mfu"] <= 1 and s["hfu"] <= 1
    assert tr["capped_kernels"] == 0


def test_translation_in_the_text_summary(tmp_path, capsys):
    assert main(["run", _scenario(tmp_path, "dgx-b200")]) == 0
    out = capsys.readouterr().out
    assert "profile from H200-SXM (NVIDIA H200) to B200" in out
    assert "x 0.7143 (H200-SXM 4,320 GB/s / B200 6,048 GB/s achieved HBM)" in out
    assert "a Grace CPU" in out


def test_closed_form_translates_as_the_run_does(tmp_path, capsys):
    from emulator.studies.rank import estimate_iteration

    path = _scenario(tmp_path, "dgx-b200")
    s = _run(capsys, path)
    # one GPU, no communication: the closed form and the simulation add the same translated kernels and host idle
    assert estimate_iteration(load_scenario(path)).iteration_s == pytest.approx(s["iteration_time_s"], rel=1e-9)


# ---------------------------------------------------------------------------- compiled (Inductor) kernels


@pytest.fixture(scope="module")
def compiled_trace(tmp_path_factory):
    """The H200 trace with its GELU's tanh as torch.compile runs it: the kernel under Inductor's record
    (named after the Triton kernel, its tensors' Input Dims, kernel_backend and kernel_num_gb), no aten op."""
    import gzip

    with gzip.open(TRACE, "rt") as f:
        data = json.load(f)
    renamed = 0
    for e in data["traceEvents"]:
        if e.get("name") == "aten::tanh" and e.get("cat") == "cpu_op":
            e["name"] = "triton_poi_fused_tanh_0"
            e["args"].update(kernel_file="/tmp/torchinductor/ab/cab.py", kernel_hash="cab", kernel_backend="triton",
                             kernel_num_gb=0.1)
            renamed += 1
    assert renamed == 48  # one GELU a layer (24), forward, in each of the two profiled steps
    path = tmp_path_factory.mktemp("compiled") / "trace.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_compiled_kernels_rescale_by_their_tensors(compiled_trace):
    p = read_profile(compiled_trace, SPEC)
    tanh = [k for k in p.block_fwd if k.compiled]
    assert len(tanh) == 1 and tanh[0].op == "triton_poi_fused_tanh_0" and tanh[0].kernel_bytes == pytest.approx(1e8)
    k = tanh[0]
    assert k.tensors == ((("b", 4), ("s", 2048), ("ffn", 8192)),)  # its Input Dims, named
    Q = replace(p.shape, b=8)
    # micro-batch 4 -> 8: the first 1.2 us as measured, the rest doubles with the tensor's elements
    assert PW.reshaped(k, p.shape, Q, H200).seconds == pytest.approx(1.2e-6 + 2 * (k.seconds - 1.2e-6), rel=1e-9)
    # to an H100 by the rooflines of its declared 0.1 GB (no FLOPs): H200 1e8 / (4.8e12 x 0.9) + 4 us = 27.1481 us,
    # H100 1e8 / (3.35e12 x 0.9) + 4 us = 37.1675 us: x 1.369062
    assert PW.reshaped(k, p.shape, p.shape, H100, 1.0, H200).seconds == pytest.approx(k.seconds * 1.369062, rel=1e-6)


def test_the_summary_names_the_compiled_share(tmp_path, capsys, compiled_trace):
    p = read_profile(compiled_trace, SPEC)
    k = next(k for k in p.block_fwd if k.compiled)
    path = tmp_path / "c.yaml"
    path.write_text(open(_scenario(tmp_path, "dgx-h200")).read().replace(TRACE, compiled_trace))
    s = _run(capsys, str(path))
    # 24 layers x the tanh kernel's mean time, over the step's GPU time (every kernel, the blocks 24 times)
    share = 24 * k.seconds / p.kernel_seconds
    assert s["profile_kernels"] == pytest.approx({"compiled_share": share, "compiled_declared_share": share,
                                                  "unscaled_share": 0.0}, rel=1e-9)


def test_kernels_with_no_shapes_scale_by_tokens(prof):
    # a custom extension's kernel (no aten op, no Inductor record): 100 us at b 4, s 2048
    k = ProfiledKernel("my_ext_fused_kernel", "memory", 1e-4, "fwd")
    assert k.unscaled
    P = prof.shape
    # b 4 -> 8 and s 2048 -> 1024: T' / T = 8·1024 / (4·2048) = 1, as measured
    assert PW.reshaped(k, P, replace(P, b=8, s=1024), H200).seconds == pytest.approx(1e-4, rel=1e-12)
    # b 4 -> 8: the first 1.2 us as measured, the rest twice: 1.2 + 2·98.8 = 198.8 us
    assert PW.reshaped(k, P, replace(P, b=8), H200).seconds == pytest.approx(198.8e-6, rel=1e-12)
    # a memset is no extension's kernel: as measured
    m = ProfiledKernel("Memset (Device)", "memory", 1e-5, "fwd")
    assert not m.unscaled and PW.reshaped(m, P, replace(P, b=8), H200).seconds == 1e-5
