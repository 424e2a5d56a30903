"""The kernel model against the H200's own per-shape measurements (../shared/calibration/h200/):
the built-in h200 table, unaligned GEMMs, the lookup and leave-one-out checks of
emulator/tools/kernel_fit.py, and the public costs compute.gemm_cost and compute.attention_cost."""
from __future__ import annotations

import csv
import math
import os

import pytest

from emulator.devices import compute as C
from emulator.devices import kernels as K
from emulator.scenario import catalog

H200_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "calibration", "h200")
needs_shared = pytest.mark.skipif(not os.path.isdir(H200_DIR), reason="../shared/calibration/h200 is absent")
H200 = catalog.gpu("H200-SXM")
H100 = catalog.gpu("H100-SXM5-80GB")


def test_h200_uses_its_table():
    assert H200.kernel_table == "h200" and len(K.builtin("h200")) > 100


def test_alignment_rule():
    # 16 bytes: 8 bf16 elements, 16 fp8 elements; the batch does not count
    assert K.gemm_aligned((3, 8, 16, 24), 2) and not K.gemm_aligned((1, 8192, 50257, 2048), 2)
    assert not K.gemm_aligned((1, 8, 16, 24), 1) and K.gemm_aligned((1, 16, 32, 48), 1)
    assert K.table_key("gemm", "bf16", (1, 4096, 50257, 2048)) == K.UNALIGNED


def test_unaligned_and_aligned_rows_never_mix():
    # aligned rows of 600 TFLOP/s at N = 50256 and 50272, unaligned ones of 100 and 110 at N = 50257,
    # K = 1536 and 2560: a query is interpolated only among rows of its own kind
    t = K.KernelTable([("gemm", "bf16", (1, 4096, 50256, 2048), 600e12, "a"),
                       ("gemm", "bf16", (1, 4096, 50272, 2048), 600e12, "a2"),
                       ("gemm", "bf16", (1, 4096, 50257, 1536), 100e12, "u1"),
                       ("gemm", "bf16", (1, 4096, 50257, 2560), 110e12, "u2")])
    hit = t.lookup("gemm", "bf16", (1, 4096, 50257, 2048))
    assert hit.cites == ("u1", "u2") and 100e12 < hit.rate < 110e12
    assert t.lookup("gemm", "bf16", (1, 4096, 50264, 2048)).cites == ("a", "a2")  # 50264 = 8·6283: aligned


@needs_shared
def test_unaligned_fraction_is_the_measured_one():
    # compute.UNALIGNED_FRACTION: each N = 50257 row over the geometric mean of the aligned rows (> 60 us) of
    # the same M and K; the geometric mean of the six ratios
    with open(os.path.join(H200_DIR, "gemm.csv"), newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    ratios = []
    for r in rows:
        m, n, k = int(r["M"]), int(r["N"]), int(r["K"])
        if n % 8:
            aligned = [math.log(float(q["tflops"])) for q in rows if (int(q["M"]), int(q["K"])) == (m, k)
                       and int(q["N"]) % 8 == 0 and float(q["time_us"]) > 60]
            ratios.append(math.log(float(r["tflops"])) - sum(aligned) / len(aligned))
    assert len(ratios) == 6
    assert math.exp(sum(ratios) / len(ratios)) == pytest.approx(C.UNALIGNED_FRACTION, abs=5e-5)


def test_gemm_cost_gives_back_the_unaligned_measurement():
    # h200/gemm.csv row 37: 8192 × 50257 × 2048 bf16, 15931.70 us (the table row is FLOPs/(t - 4 us))
    t, src = C.gemm_cost(8192, 50257, 2048, H200)
    assert src == "measured" and t == pytest.approx(15931.70e-6, rel=1e-5)
    # padded to 50264 (aligned): neither measured nor within an octave of an aligned N (16384, 128256):
    # the aligned roofline, six times faster
    t_pad, src_pad = C.gemm_cost(8192, 50264, 2048, H200)
    assert src_pad == "roofline" and t_pad == pytest.approx(C.gemm_time(8192, 50264, 2048, H200))
    assert t / t_pad > 5
    # M = 12288 lies between measured M = 8192 and 16384: interpolated among the unaligned rows, at
    # their rates (95.7 to 107.4 TFLOP/s)
    t_mid, src_mid = C.gemm_cost(12288, 50257, 2048, H200)
    rate = 2 * 12288 * 50257 * 2048 / (t_mid - 4e-6)
    assert src_mid == "interpolated" and 95e12 < rate < 108e12


def test_fp8_gemm_cost_is_measured_on_h200_and_carried_to_h100():
    # h200/fp8_gemm.csv row 14: 8192³ e4m3, 932.50 us; the H100 table carries it unchanged (same SMs and clocks)
    for gpu in (H200, H100):
        t, src = C.gemm_cost(8192, 8192, 8192, gpu, "fp8")
        assert src == "measured" and t == pytest.approx(932.50e-6, rel=1e-5)


def test_attention_cost_gives_back_the_sdpa_measurement():
    # h200/attention.csv row 6: b 1, 32 heads (8 kv), s 8192, d 128, causal: fwd 934.6 us, fwd+bwd 3960.8 us
    fwd, src = C.attention_cost(1, 32, 8, 8192, 128, H200)
    bwd, src_b = C.attention_cost(1, 32, 8, 8192, 128, H200, backward=True)
    assert (src, src_b) == ("measured", "measured")
    assert fwd == pytest.approx(934.6e-6, rel=1e-5) and fwd + bwd == pytest.approx(3960.8e-6, rel=1e-5)
    # on the H100 the same shape is cudnn-frontend's kernel-only H200 timing (h100/attention.csv rows 282,
    # 283: 644 and 541 TFLOP/s): 4·32·8192²·128/2 = 549.76e9 FLOP / 644e12 = 853.7 us + 4 us
    fwd_h100, _ = C.attention_cost(1, 32, 8, 8192, 128, H100)
    assert fwd_h100 == pytest.approx(549.7558e9 / 644e12 + 4e-6, rel=1e-5)
    # FlashAttention-2 as an explicit kernel: its derived backward (rows 147 and 58: 299.02 TFLOP/s)
    bwd_fa2, src_fa2 = C.attention_cost(1, 32, 8, 8192, 128, H100, backward=True, kernel="fa2")
    assert src_fa2 == "measured" and bwd_fa2 == pytest.approx(2.5 * 549.7558e9 / 299.02e12 + 4e-6, rel=1e-5)


@needs_shared
def test_kernel_fit_lookup_and_leave_one_out():
    from emulator.tools.kernel_fit import check

    result = check(H200_DIR, H200)
    s = result["summary"]
    # lookup: every row of the table gives back its measurement
    assert s["headline"]["lookup_median_abs_error"] < 1e-4 and s["headline"]["n"] == 69  # 57 GEMMs + 12 attention
    # leave-one-out: each bf16 GEMM and attention measurement predicted without its own row, median within 5%
    assert s["headline"]["loo_median_abs_error"] < 0.05
    assert s["gemm_bf16"]["loo_median_abs_error"] < 0.05
    # the unaligned GEMMs, from the other unaligned rows: each within 5%
    unaligned = [r for r in result["rows"] if not r["aligned"] and r["group"] == "gemm_bf16"]
    assert len(unaligned) == 6 and all(abs(r["loo_error"]) < 0.05 for r in unaligned)
    # the two dispatch-bound rows (1024³: 55 us, 2048³: 57 us) are reported, not in the medians
    assert sum(r["dispatch_bound"] for r in result["rows"] if r["group"] == "gemm_bf16") == 2


def test_token_rows_are_no_leading_dimension():
    # a Linear's forward y[m, n] = x[m, k]·w[n, k]ᵀ: the leading dimensions are k and n; m (tokens) is not one
    assert K.gemm_aligned((1, 8191, 4096, 4096), 2) and not K.gemm_aligned((1, 4096, 4096, 8191), 2)
    # a weight gradient written (k_in, n_out, tokens): rows = 3, its tokens are free
    assert K.gemm_aligned((1, 4096, 4096, 8191), 2, rows=3) and not K.gemm_aligned((1, 4095, 4096, 8192), 2, rows=3)
    # an MoE expert's GEMMs over 3148 routed tokens (3148 = 8·393 + 4) are aligned kernels, forward and wgrad
    from emulator.workload import kernel_cost as KC
    from emulator.workload import layer as Ly

    fwd = Ly.Kernel("moe.up", "gemm", 2.0 * 8 * 3148 * 2816 * 2048, 0.0, m=3148, n=2816, k=2048, batch=8)
    wgrad = Ly.Kernel("moe.up.wgrad", "gemm", 2.0 * 8 * 2048 * 2816 * 3148, 0.0, m=2048, n=2816, k=3148, batch=8)
    assert KC.gemm_rows(fwd) == 1 and KC.gemm_rows(wgrad) == 3
    assert KC.kernel_cost(fwd, H100)[0] == pytest.approx(C.gemm_time(3148, 2816, 2048, H100, 2, 8))
    assert KC.kernel_cost(wgrad, H100)[0] == pytest.approx(C.gemm_time(2048, 2816, 3148, H100, 2, 8, rows=3))
    assert C.gemm_time(2048, 2816, 3148, H100, 2, 8, rows=3) < C.gemm_time(2048, 2816, 3148, H100, 2, 8) / 4
