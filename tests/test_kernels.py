"""Tests of emulator/devices/kernels.py: the measured kernel database and its use by the compute model."""
from __future__ import annotations

import csv
import math
import os
from dataclasses import replace
from types import SimpleNamespace

import pytest

from emulator.devices import kernels as K
from emulator.errors import CatalogError, EmulatorError
from emulator.outputs.summary import compute_source
from emulator.program import COMPUTE, Op, Program
from emulator.scenario import catalog
from emulator.workload import kernel_cost as KC
from emulator.workload import layer as Ly

HERE = os.path.dirname(__file__)
SHARED = os.path.join(HERE, "..", "..", "shared", "calibration", "h100")
DATA = os.path.join(HERE, "..", "emulator", "data", "kernels")
needs_shared = pytest.mark.skipif(not os.path.isdir(SHARED), reason="../shared/calibration/h100 is absent")

H100 = catalog.gpu("H100-SXM5-80GB")
A100 = catalog.gpu("A100-SXM4-80GB")


@needs_shared
def test_shipped_tables_are_derived_from_the_shared_rows():
    from emulator.tools.kernel_tables import derive

    for name, text in derive(SHARED).items():
        with open(os.path.join(DATA, f"{name}.csv"), encoding="utf-8") as f:
            assert f.read() == text, f"{name}.csv differs from what kernel_tables.derive makes"


def _shared_rows(name: str) -> list[dict[str, str]]:
    with open(os.path.join(SHARED, "..", name), newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@needs_shared
def test_every_row_cites_a_non_suspect_row_of_the_same_value():
    import re

    gemm, g200, f200 = _shared_rows("h100/gemm.csv"), _shared_rows("h200/gemm.csv"), _shared_rows("h200/fp8_gemm.csv")
    bw = _shared_rows("blackwell/gemm.csv")
    for name in K.BUILTIN:
        for op, dtype, dims, rate, source in K.builtin(name):
            if op != "gemm":
                continue
            b = re.match(r"blackwell/gemm\.csv row (\d+) \(GB200 cuBLASLt sustained; x 4500/5000 to the B200\)", source)
            if b:  # a GB200 row carried to the B200 by the clock ratio: value x 4500/5000
                row = bw[int(b.group(1)) - 1]
                assert row["gpu"].startswith("NVIDIA GB200") and "cuBLASLt" in row["op"]
                assert dims[1:] == tuple(int(x) for x in row["shape_or_size"].split(" ")[0].split("x"))
                assert rate == pytest.approx(float(row["value"]) * 1e12 * 4500 / 5000, rel=1e-5)
                continue
            m = re.match(r"(h100/gemm|h200/gemm|h200/fp8_gemm)\.csv row (\d+)(?: (\w+_us))?", source)
            assert m, source
            rows = {"h100/gemm": gemm, "h200/gemm": g200, "h200/fp8_gemm": f200}[m.group(1)]
            row = rows[int(m.group(2)) - 1]  # "row N": the N-th data row
            assert dims[1:] == (int(row["M"]), int(row["N"]), int(row["K"]))
            if m.group(1) == "h100/gemm":
                assert "SUSPECT" not in row["notes"]
                assert rate == pytest.approx(float(row["tflops"]) * 1e12, rel=1e-5)
            else:  # timed with its launch: rate = 2mnk / (t - 4 us), the launch the model adds back
                t = float(row[m.group(3) or "time_us"]) * 1e-6
                assert t > 60e-6 and rate == pytest.approx(2.0 * math.prod(dims) / (t - 4e-6), rel=1e-5)


def test_h100_exact_gemm_is_measured():
    # h100.csv: gemm bf16 1x4096x4096x4096 = 780.194 TFLOP/s (h100/gemm.csv row 1137, OpenXLA sm_90)
    hit = K.lookup(H100, "gemm", "bf16", (1, 4096, 4096, 4096))
    assert hit is not None and hit.source == K.MEASURED and hit.rate == pytest.approx(780.194e12)
    kern = Ly.Kernel("x", "gemm", 2.0 * 4096**3, 0.0, m=4096, n=4096, k=4096)
    # 2·4096³ = 137.439e9 FLOP / 780.194e12 = 176.160 us, + 4 us launch = 180.160 us
    t, src = KC.kernel_cost(kern, H100)
    assert src == "measured" and t == pytest.approx(2.0 * 4096**3 / 780.194e12 + 4e-6)
    assert t == pytest.approx(180.160e-6, rel=1e-5)


def test_interpolation_is_log_linear_on_the_grid():
    # m = 2896 lies between 2048 and 4096 at log-weight w = log2(2896/2048) = 0.49992;
    # n = k = 4096 are grid values. log rate = (1-w)·log(752.315) + w·log(780.194) (rows 1062 and 1137)
    hit = K.lookup(H100, "gemm", "bf16", (1, 2896, 4096, 4096))
    w = math.log2(2896 / 2048)
    assert hit is not None and hit.source == K.INTERPOLATED
    assert hit.rate == pytest.approx(math.exp((1 - w) * math.log(752.315e12) + w * math.log(780.194e12)))
    assert len(hit.cites) == 2


def test_two_dimensional_hand_table():
    t = K.KernelTable([("attention_fwd", "bf16", (64, 1024), 100e12, "a"), ("attention_fwd", "bf16", (64, 4096), 400e12, "b"),
                       ("attention_fwd", "bf16", (128, 1024), 200e12, "c"), ("attention_fwd", "bf16", (128, 4096), 800e12, "d")])
    # at (90.51, 2048): w_d = log2(90.51/64) = 0.5, w_s = log2(2048/1024)/2 = 0.5: the geometric mean of
    # the four corners = (100·400·200·800)^(1/4) = 282.84 TFLOP/s
    hit = t.lookup("attention_fwd", "bf16", (91, 2048))
    w = math.log(91 / 64) / math.log(2)
    expect = math.exp((1 - w) * 0.5 * (math.log(100e12) + math.log(400e12)) + w * 0.5 * (math.log(200e12) + math.log(800e12)))
    assert hit is not None and hit.rate == pytest.approx(expect)
    assert t.lookup("attention_fwd", "bf16", (64, 8192)) is None  # beyond the measured range: the roofline's
    assert t.lookup("attention_fwd", "fp16", (64, 1024)).rate == 100e12  # fp16 falls back to bf16 rows
    assert t.lookup("attention_bwd", "bf16", (64, 1024)) is None


def test_missing_corner_and_swapped_gemm():
    t = K.KernelTable([("gemm", "bf16", (1, 256, 512, 256), 10e12, "a"), ("gemm", "bf16", (1, 512, 512, 256), 20e12, "b"),
                       ("gemm", "bf16", (1, 256, 1024, 256), 30e12, "c")])
    assert t.lookup("gemm", "bf16", (1, 512, 256, 256)).source == K.MEASURED  # m and n swapped: same GEMM
    # (1, 384, 768, 256) lacks the grid corner (1, 512, 1024, 256): no grid interpolation; its three
    # neighbours lie within one octave in every dimension, so Shepard's weights 1/d² in log-shape space:
    # a: d² = ln(1.5)² + ln(1.5)² = 0.328804; b and c: ln(0.75)² + ln(1.5)² = 0.247163
    hit = t.lookup("gemm", "bf16", (1, 384, 768, 256))
    wa, wb = 1 / 0.328804, 1 / 0.247163
    expect = math.exp((wa * math.log(10e12) + wb * math.log(20e12) + wb * math.log(30e12)) / (wa + 2 * wb))
    assert hit.source == K.INTERPOLATED and hit.rate == pytest.approx(expect, rel=1e-5)  # 19.18 TFLOP/s
    # with a prior (the roofline's rate) the weights average log(measured / prior) instead: a prior of
    # 2× everywhere leaves the same answer, a prior growing with n moves it
    assert t.lookup("gemm", "bf16", (1, 384, 768, 256), lambda d: 2.0).rate == pytest.approx(hit.rate, rel=1e-12)
    # k = 1024 lies two octaves from every measured k: not covered, the roofline's
    assert t.lookup("gemm", "bf16", (1, 384, 768, 1024)) is None


def test_a100_has_no_table_and_keeps_the_roofline():
    from emulator.devices import compute

    kern = Ly.Kernel("x", "gemm", 2.0 * 4096**3, 0.0, m=4096, n=4096, k=4096)
    t, src = KC.kernel_cost(kern, A100)
    assert src == "roofline" and t == compute.gemm_time(4096, 4096, 4096, A100)


def test_h100_flash_attention_is_cudnn_carried_from_the_h200():
    # causal, head dim 128, 4096 keys: cuDNN on an H200, cudnn-frontend (h100/attention.csv rows 290 and 291:
    # 591 and 474 TFLOP/s), carried to the H100 unchanged (same SMs and clocks, compute-bound).
    # flops = 4·bh·s²·d / 2 = 4·8·4096²·128/2 = 34.36e9; 34.36e9 / 591e12 = 58.14 us, + 4 us launch
    L = Ly.LayerShape(b=1, s=4096, s_kv=4096, h=1024, heads=8, kv_heads=8, ffn=4096, swiglu=False, biases=True,
                      dropout=False, flash=True)
    fwd = Ly.flash("attn.flash", L, 4096, False, "fwd")
    t, src = KC.kernel_cost(fwd, H100)
    assert src == "measured" and t == pytest.approx(4 * 8 * 4096**2 * 128 / 2 / 591e12 + 4e-6)
    # backward: 2.5x the forward FLOPs at 474 TFLOP/s: 85.899e9 / 474e12 = 181.22 us + 4 us
    bwd = Ly.flash("attn.flash_bwd", L, 4096, True, "bwd")
    t_b, src_b = KC.kernel_cost(bwd, H100)
    assert src_b == "measured" and t_b == pytest.approx(2.5 * 4 * 8 * 4096**2 * 128 / 2 / 474e12 + 4e-6)
    # FlashAttention-2's derived backward stays in the table as fa2_bwd_causal (rows 146 and 57): 285.06
    assert K.lookup(H100, "fa2_bwd_causal", "bf16", (128, 4096)).rate == pytest.approx(285.064e12, rel=1e-5)


def test_derived_backward_rate_by_hand():
    # hd 64, seq 512, non-causal: FA2 fwd 282 (row 1), fwd+bwd 215 (row 107):
    # 2.5 / (3.5/215 - 1/282) = 2.5 / (0.0162791 - 0.0035461) = 196.34 TFLOP/s
    hit = K.lookup(H100, "fa2_bwd", "bf16", (64, 512))
    assert hit.rate == pytest.approx(196.341e12, rel=1e-5)


def test_compute_source_shares():
    ops = [Op(0, 0, COMPUTE, duration=3.0, costed=(1.0, 0.5, 1.5)), Op(1, 0, COMPUTE, duration=1.0, costed=(0.0, 0.0, 1.0)),
           Op(2, 0, COMPUTE, duration=9.0)]  # a trace op: not costed by the builder, left out
    result = SimpleNamespace(program=Program(1, ops))
    # measured 1 of 4 s, interpolated 0.5, roofline 2.5
    assert compute_source(result) == {"measured": 0.25, "interpolated": 0.125, "roofline": 0.625}
    assert compute_source(SimpleNamespace(program=Program(1, ops[2:]))) is None


def test_catalog_kernels_entries_and_bad_ones():
    got = catalog.measured_kernels("g", ["gemm bf16 1x64x256x128 40 us"])
    assert got[0][:3] == ("gemm", "bf16", (1, 64, 256, 128)) and got[0][3] == pytest.approx(40e-6)
    spec = replace(A100, kernels=got)
    # 2·64·256·128 = 4194304 FLOP in 40 us: 104.8576 GFLOP/s, exactly measured
    assert K.lookup(spec, "gemm", "bf16", (1, 64, 256, 128)).rate == pytest.approx(4194304 / 40e-6)
    with pytest.raises(EmulatorError, match=r"g.kernels\[0\]: expected \"gemm DTYPE BxMxNxK TIME\""):
        catalog.measured_kernels("g", ["gemm bf16 64x256 40"])
    with pytest.raises(EmulatorError, match="expected a gemm with 4 positive dims"):
        catalog.measured_kernels("g", ["conv bf16 1x64x256x128 40 us"])


def test_bad_table_file_names_line():
    with pytest.raises(CatalogError, match="t.csv: line 3: expected op,dtype,dims"):
        K.parse_table("op,dtype,dims,tflops,source\ngemm,bf16,1x2x3x4,5,a\ngemm,bf16,1x2,zz\n", "t.csv")
    with pytest.raises(CatalogError, match="unknown kernel table"):
        K.builtin("a100")


def test_kernel_table_key_is_checked(tmp_path):
    from emulator.scenario import load_scenario_text

    text = ("name: k\ncluster:\n  nodes: 1\n  node:\n    preset: dgx-h100\n    gpu:\n      preset: H100-SXM5-80GB\n"
            "      kernel_table: a100\n")
    with pytest.raises(EmulatorError, match="kernel_table.*expected one of none, h100, h200, b200"):
        load_scenario_text(text, "k.yaml")


def test_b200_gemm_row():
    # b200.csv: gemm bf16 1x4096x4096x4096 from the OpenXLA sm_100_B200 grid; gemm fp8 1x15360x4096x3072
    # = 3432.5 TFLOP/s (mamf-finder, h100/gemm.csv row 10)
    b200 = catalog.gpu("B200")
    assert K.lookup(b200, "gemm", "fp8", (1, 15360, 4096, 3072)).rate == pytest.approx(3432.5e12)
    assert K.lookup(b200, "gemm", "bf16", (1, 4096, 4096, 4096)).source == K.MEASURED
    assert K.lookup(b200, "attention_fwd_causal", "bf16", (128, 4096)) is None  # below the measured 8192 tokens


def _h100_run(table: str):
    from emulator.run.simulation import simulate
    from emulator.scenario import load_scenario_text

    text = ("name: kt\ncluster:\n  nodes: 1\n  node:\n    preset: dgx-h100\n    gpu:\n      preset: H100-SXM5-80GB\n"
            f"      kernel_table: {table}\n"
            "model: {layers: 2, hidden: 2048, heads: 16, ffn_hidden: 8192, seq_len: 4096, vocab: 32768}\n"
            "training: {global_batch: 8, micro_batch: 1, attention: flash}\nparallel: {tp: 1}\n"
            "simulation: {detail: op}\n")
    return simulate(load_scenario_text(text, "kt.yaml"))


def test_h100_scenario_costs_from_the_table_and_none_turns_it_off():
    with_table, without = _h100_run("h100"), _h100_run("none")
    ops = {op.name: op for op in with_table.program.expanded().ops if op.rank == 0}
    old = {op.name: op for op in without.program.expanded().ops if op.rank == 0}
    flash = ops["mb0.layer0.fwd.attn.flash"]
    # causal, d = 128, 4096 keys: cuDNN 591 TFLOP/s (row 290); 4·16·4096²·128/2 = 68.719e9 FLOP -> 116.28 us + 4 us
    assert flash.duration == pytest.approx(4 * 16 * 4096**2 * 128 / 2 / 591e12 + 4e-6)
    assert flash.costed[0] == flash.duration
    # proj (1, 4096, 2048, 2048) is a grid point: 727.467 TFLOP/s (row 1119): 34.360e9 FLOP -> 47.23 us + 4 us
    assert ops["mb0.layer0.fwd.proj"].duration == pytest.approx(2 * 4096 * 2048 * 2048 / 727.467e12 + 4e-6)
    # qkv (1, 4096, 6144, 2048): n = 6144 lies off the 4096 grid but within an octave of measured shapes:
    # interpolated from its neighbours (the roofline's rate corrected by theirs), not the roofline's
    qkv, qkv_old = ops["mb0.layer0.fwd.qkv"], old["mb0.layer0.fwd.qkv"]
    assert qkv.costed[1] == qkv.duration and qkv_old.costed[2] == qkv_old.duration
    rate = 2 * 4096 * 6144 * 2048 / (qkv.duration - 4e-6)
    assert 700e12 < rate < 800e12  # the neighbours at n = 4096: 727 (k 2048) to 780 TFLOP/s (k 4096)
    assert compute_source(without) == {"measured": 0.0, "interpolated": 0.0, "roofline": 1.0}
    assert compute_source(with_table)["measured"] > 0.0


def test_bad_kernels_in_a_user_catalog_name_the_file_and_entry(tmp_path):
    from emulator.scenario import load_scenario

    (tmp_path / "cat.yaml").write_text(
        "gpus:\n  g1:\n    peak_flops: 989.4 TFLOP/s\n    hbm_bandwidth: 3350 GB/s\n    memory: 80 GiB\n"
        "    kernels:\n      - \"gemm bf16 1x2x3 4 us\"\n"
        "nodes:\n  n1: {gpu: g1, gpus_per_node: 8, intra: nvswitch, intra_bandwidth: 450 GB/s, intra_efficiency: 0.8,"
        " intra_latency: 1 us, nics: 0, nic_bandwidth: 400 Gb/s, nic_efficiency: 0.9, nic_latency: 1 us}\n")
    (tmp_path / "sc.yaml").write_text("name: x\ncluster: {nodes: 1, node: n1, catalog: cat.yaml}\n")
    with pytest.raises(EmulatorError, match=r"cat.yaml: g1.kernels\[0\]: expected a gemm with 4 positive dims"):
        load_scenario(str(tmp_path / "sc.yaml"))


def test_attention_fa2_is_an_explicit_choice():
    # training.attention: fa2 costs the fused kernels from FlashAttention-2's rows (fa2_*), flash from cuDNN's.
    # causal, d 128, 4096 keys on the H100: forward FA2 319 TFLOP/s (h100/attention.csv row 57) against
    # cuDNN 591 (row 290): 34.36e9 FLOP -> 107.7 + 4 us against 58.1 + 4 us
    from emulator.run.simulation import simulate
    from emulator.scenario import load_scenario_text

    def flash_fwd(attention: str) -> float:
        text = ("name: fa\ncluster: {nodes: 1, node: dgx-h100}\n"
                "model: {layers: 1, hidden: 1024, heads: 8, ffn_hidden: 4096, seq_len: 4096, vocab: 32768}\n"
                f"training: {{global_batch: 8, micro_batch: 1, attention: {attention}}}\nparallel: {{dp: 8}}\n"
                "simulation: {detail: op}\n")
        r = simulate(load_scenario_text(text, "fa.yaml"), record_links=False)
        return next(op.duration for op in r.program.expanded().ops if op.name.endswith("fwd.attn.flash"))

    flops = 4 * 8 * 4096**2 * 128 / 2
    assert flash_fwd("fa2") == pytest.approx(flops / 319e12 + 4e-6)
    assert flash_fwd("flash") == pytest.approx(flops / 591e12 + 4e-6)
