"""training.precision picks the GEMM peak: fp32 at the FP32 rate, tf32 at the TF32 rate, fp8 at
the FP8 rate or refused (issue #17: fp32 ran at the bf16 tensor-core peak, an MFU of 0.99)."""
import os

import pytest

from emulator.cli import main
from emulator.devices import compute as C
from emulator.errors import ScenarioError
from emulator.outputs.summary import summarize
from emulator.run.simulation import simulate
from emulator.scenario import catalog, load_scenario

A100 = catalog.gpu("A100-SXM4-80GB")
QUICKSTART = os.path.join(os.path.dirname(__file__), "..", "scenarios", "quickstart.yaml")


def test_catalog_rates_from_the_datasheets():
    # A100 datasheet: FP32 19.5, TF32 156 dense; no FP8. H100 SXM: FP32 67, TF32 989/2, FP8 1978.9 dense.
    assert (A100.peak_at("fp32"), A100.peak_at("tf32"), A100.peak_at("fp8")) == (19.5e12, 156e12, 0.0)
    h100 = catalog.gpu("H100-SXM5-80GB")
    assert (h100.peak_at("fp32"), h100.peak_at("tf32"), h100.peak_at("fp8")) == (67e12, 494.7e12, 1978.9e12)
    assert h100.peak_at("bf16") == h100.peak_at("fp16") == 989.4e12


def test_an_mlp_gemm_at_each_precision_by_hand():
    # m=8192, n=4096, k=2048 on A100 (108 SMs, 128² tiles): tiles 64·32 = 2048, waves ceil(2048/108) = 19,
    # e_tile = 8192·4096/(19·108·128²) = 0.998051; k/(k+64) = 2048/2112; e = 0.695·0.998051·0.969697 = 0.672626.
    # flops 2·8192·4096·2048 = 1.37439e11; the memory side (117 MB at 0.9·2039 GB/s = 64 µs) is smaller.
    #   bf16: 1.37439e11/(312e12·0.672626) + 4 µs = 0.658910 ms
    #   tf32: 1.37439e11/(156e12·0.672626) + 4 µs = 1.313821 ms
    #   fp32: 1.37439e11/(19.5e12·0.672626) + 4 µs = 10.482564 ms  (×15.9 the bf16 time)
    times = {p: C.gemm_time(8192, 4096, 2048, C.at_precision(A100, p)) for p in ("bf16", "tf32", "fp32")}
    assert times["bf16"] == pytest.approx(6.589103e-4, rel=1e-6)
    assert times["tf32"] == pytest.approx(1.313821e-3, rel=1e-6)
    assert times["fp32"] == pytest.approx(1.0482564e-2, rel=1e-6)


def test_at_precision_refuses_a_gpu_without_the_rate():
    with pytest.raises(ScenarioError, match="fp8 needs the GPU's FP8 tensor-core rate, but GPU A100-SXM4-80GB"):
        C.at_precision(A100, "fp8")


def _quickstart(tmp_path, precision, node="dgx-a100"):
    with open(QUICKSTART) as fh:
        text = fh.read().replace("precision: bf16", f"precision: {precision}").replace("dgx-a100", node)
    path = os.path.join(str(tmp_path), "q.yaml")
    with open(path, "w") as fh:
        fh.write(text)
    return path


@pytest.mark.parametrize("precision, bound", [("fp32", 19.5 / 312), ("tf32", 156 / 312)])
def test_mfu_never_exceeds_the_precisions_share_of_the_bf16_peak(tmp_path, precision, bound):
    # MFU is reported against the bf16 peak (312 TFLOP/s): GEMMs at 19.5 (fp32) or 156 (tf32) TFLOP/s
    # cannot reach more than that share of it. Before the fix fp32 reached an MFU of 0.316.
    mfu = summarize(simulate(load_scenario(_quickstart(tmp_path, precision)), record_links=False))["mfu"]
    assert 0 < mfu <= bound


def test_fp8_runs_faster_than_bf16_on_h100(tmp_path):
    # Same model and layout on DGX H100; fp8 GEMMs at 1978.9 instead of 989.4 TFLOP/s and half the bytes.
    bf16 = simulate(load_scenario(_quickstart(tmp_path, "bf16", "dgx-h100")), record_links=False).iteration_time_s
    fp8 = simulate(load_scenario(_quickstart(tmp_path, "fp8", "dgx-h100")), record_links=False).iteration_time_s
    assert fp8 < bf16


def test_fp8_on_a100_is_refused_naming_file_line_and_key(tmp_path, capsys):
    path = _quickstart(tmp_path, "fp8")
    assert main(["run", path, "--out", str(tmp_path / "o"), "--no-gantt"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "q.yaml:12: training.precision: fp8 needs the GPU's FP8" in err
    assert not os.path.exists(tmp_path / "o" / "summary.json")


def test_tf32_on_v100_is_refused_at_its_line(tmp_path):
    # V100 has no TF32 tensor cores (its catalog entry gives no peak_flops_tf32): refused at load.
    path = os.path.join(str(tmp_path), "g.yaml")
    with open(path, "w") as fh:
        fh.write("name: g\ncluster: {nodes: 1, node: dgx-v100}\nmodel: {preset: gpt3-125m}\n"
                 "training: {global_batch: 8, micro_batch: 1,\n  precision: tf32}\n")
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert str(err.value) == (f"{path}:5: training.precision: tf32 needs the GPU's TF32 tensor-core rate, but GPU "
                              "V100-SXM2-32GB has none (its catalog entry gives no peak_flops_tf32); choose another "
                              "precision or GPU, or give the GPU a peak_flops_tf32")


def test_a_calibrated_catalog_entry_keeps_the_precision_rates(tmp_path):
    # `emulator calibrate --kineto` writes a GPU entry of its own; it carries the base GPU's rates.
    from emulator.tools.calibrate import ComputeFit, catalog_yaml

    text = catalog_yaml(catalog.node("dgx-a100"), "test", ComputeFit(0.6, {}, 0.85, 10))
    path = tmp_path / "cat.yaml"
    path.write_text(text)
    gpus, _ = catalog.load_user_catalog(str(path))
    g = gpus["dgx-a100-gpu"]
    assert (g.peak_at("fp32"), g.peak_at("tf32"), g.peak_at("fp8")) == (19.5e12, 156e12, 0.0)


def test_a_negative_precision_rate_is_a_clear_error(tmp_path):
    with pytest.raises(ScenarioError) as err:
        load_scenario(_quickstart(tmp_path, "fp32"), ["cluster.node.gpu.peak_flops_fp32=-1 TFLOP/s"])
    assert str(err.value) == ('--set cluster.node.gpu.peak_flops_fp32=-1 TFLOP/s: cluster.node.gpu.peak_flops_fp32: '
                              'expected a FLOP rate with a unit such as "312 TFLOP/s", got "-1 TFLOP/s": it must not '
                              'be negative')


def test_an_fp8_gemm_moves_one_byte_per_element():
    # A memory-bound GEMM m = n = 8192, k = 16 on H100 in fp8 (dtype 1). Bytes (8192·16 + 16·8192 + 8192²)·1
    # = 67,371,008 at 0.9·3350 GB/s = 22.345 µs; FLOPs 2·8192²·16 = 2.147e9 at 1978.9 TFLOP/s × e
    # (0.695 · 0.803/0.869 · e_tile 4096/(32·132) · 16/80 = 0.12455) = 8.71 µs: memory-bound, + 4 µs launch.
    # (Before, every GEMM was costed with 2-byte operands: 44.69 + 4 µs.)
    from emulator.scenario.spec import ModelSpec
    from emulator.workload import kernel_cost as KC
    from emulator.workload import layer as Ly

    h100 = C.at_precision(catalog.gpu("H100-SXM5-80GB"), "fp8")
    L = Ly.layer_shape(ModelSpec(layers=1, hidden=256, heads=4, seq_len=128, vocab=512), 1, dtype=1)
    assert KC.kernel_time(Ly.gemm("g", 8192, 8192, 16, L), h100) == pytest.approx(67371008 / (0.9 * 3350e9) + 4e-6,
                                                                                    rel=1e-12)
