"""Compute cost model: hand-computed roofline times."""
import pytest

from emulator.devices import compute as C
from emulator.scenario import GpuSpec, catalog

# hardware.csv A100-SXM4-80GB and H100-SXM5 rows; SMs and the achievable matmul fraction as the catalog gives them
A100 = GpuSpec("A100-SXM4-80GB", 312e12, 2039e9, 80 * 2**30, 4e-6, sm_count=108, matmul_fraction=0.869)
H100 = GpuSpec("H100-SXM5-80GB", 989.4e12, 3350e9, 80 * 2**30, 4e-6, sm_count=132, matmul_fraction=0.803)


def test_constants_are_the_documented_ones():
    assert (C.E_GEMM_MAX, C.E_MEM, C.K_HALF, C.TILE) == (0.695, 0.90, 64.0, 128)
    assert C.sm_count(A100) == 108 and C.sm_count(H100) == 132
    # the figures are the catalog's fields, not read off the name
    assert (catalog.gpu("H100-SXM5-80GB").sm_count, catalog.gpu("H100-SXM5-80GB").matmul_fraction) == (132, 0.803)
    unnamed = GpuSpec("my-H100", 989.4e12, 3350e9, 80 * 2**30, 4e-6)  # no fields: costed as an A100
    assert C.sm_count(unnamed) == 108 and C.matmul_scale(unnamed) == 1.0


def test_large_gemm_a100():
    # m=8192, n=k=6144: tiles 64·48 = 3072, waves ceil(3072/108) = 29,
    # e_tile = 8192·6144/(29·108·128²) = 0.980843; k/(k+64) = 6144/6208 = 0.989691;
    # e = 0.695·0.980843·0.989691 = 0.674658; flops 2·8192·6144² = 6.18475e11;
    # t = 6.18475e11/(312e12·0.674658) + 4 us = 2.93822 ms + 0.004 ms = 2.94222 ms.
    assert C.gemm_efficiency(8192, 6144, 6144, A100) == pytest.approx(0.674658, rel=1e-5)
    assert C.gemm_time(8192, 6144, 6144, A100) == pytest.approx(2.94222e-3, rel=1e-5)


def test_same_gemm_h100_scales_by_peak_sms_and_achievable_fraction():
    # 132 SMs: waves ceil(3072/132) = 24, e_tile = 50331648/(24·132·16384) = 0.969697;
    # achievable matmul fraction H100/A100 = 0.803/0.869 = 0.924051;
    # e = 0.695·0.924051·0.969697·0.989691 = 0.616335; t = 6.18475e11/(989.4e12·0.616335) + 4 us = 1.018230 ms.
    assert C.matmul_scale(H100) == pytest.approx(0.803 / 0.869, rel=1e-12)
    assert C.gemm_time(8192, 6144, 6144, H100) == pytest.approx(1.018230e-3, rel=1e-5)


def test_small_k_batched_gemm():
    # QKᵀ of GPT-22B/tp8, b=4: batch 32, m=n=2048, k=96.
    # tiles 16·16·32 = 8192, waves ceil(8192/108) = 76, e_tile = 2048²·32/(76·108·128²) = 0.998051;
    # k/(k+64) = 0.6; e = 0.695·0.998051·0.6 = 0.416187; flops 2·2048²·96·32 = 2.57698e10;
    # t_flops = 2.57698e10/(312e12·0.416187) = 198.458 us;
    # bytes 32·(2·2048·96 + 2048²)·2 = 293 601 280, t_mem = 2.93601e8/(2039e9·0.9) = 159.992 us;
    # t = max + 4 us = 202.458 us.
    assert C.gemm_bytes(2048, 2048, 96, 2, 32) == 293_601_280
    assert C.gemm_time(2048, 2048, 96, A100, 2, 32) == pytest.approx(202.458e-6, rel=1e-5)


def test_memory_bound_gemm():
    # m=n=4096, k=8 (an outer product of 8): flops 2·4096²·8 = 2.68435e8, e = 0.695·e_tile·(8/72):
    # tiles 1024, waves ceil(1024/108) = 10, e_tile = 16777216/(10·108·16384) = 0.948148,
    # e = 0.695·0.948148·0.111111 = 0.0732181, t_flops = 2.68435e8/(312e12·0.0732181) = 11.751 us;
    # bytes (4096·8 + 8·4096 + 4096²)·2 = 33 685 504, t_mem = 3.36855e7/(2039e9·0.9) = 18.3562 us → +4 us.
    assert C.gemm_time(4096, 4096, 8, A100) == pytest.approx(22.3562e-6, rel=1e-4)


def test_unaligned_gemm_runs_at_the_align1_fraction():
    # k = 1 is not a multiple of 8 bf16 elements (16 bytes): cuBLAS's align1 kernels, e_flops × 0.1665.
    # flops 2·4096² = 3.3554e7, e = 0.695·0.948148·(1/65)·0.1665 = 0.00168796, t_flops = 3.3554e7/(312e12·
    # 0.00168796) = 63.714 us; bytes (4096 + 4096 + 4096²)·2 = 33 570 816 -> t_mem 18.2936 us; + 4 us launch.
    assert C.gemm_time(4096, 4096, 1, A100) == pytest.approx(67.714e-6, rel=1e-4)
    # 8192 × 50257 × 2048 bf16 on the H200 (h200/gemm.csv row 37: 15.93 ms): the aligned roofline says
    # 2.75 ms; unaligned, 2·8192·50257·2048 = 1.68633e12 FLOP at 989.4e12·e with e = 0.642215 (0.695·0.803/0.869)
    # · e_tile · 2048/2112 · 0.1665: tiles 64·393 = 25152, waves ceil(25152/132) = 191, e_tile = 8192·50257/
    # (191·132·16384) = 0.996688, e = 0.103345; 1.68633e12/(989.4e12·0.103345) = 16.4924 ms + 4 us = 16.4964 ms,
    # 3.5% above the measured 15.93 ms (the table itself gives back the measurement: test_kernel_model.py)
    h200 = catalog.gpu("H200-SXM")
    assert C.gemm_time(8192, 50257, 2048, h200) == pytest.approx(16.4964e-3, rel=1e-4)
    assert C.gemm_time(8192, 50256, 2048, h200) == pytest.approx(2.74999e-3, rel=1e-4)  # N = 8·6282: aligned


def test_elementwise_and_roofline():
    # 100 MB at 2039 GB/s · 0.9: 1e8/1.8351e12 = 54.4929 us, + 4 us launch.
    assert C.elementwise_time(1e8, A100) == pytest.approx(58.4929e-6, rel=1e-5)
    assert C.elementwise_time(0, A100) == 0.0
    # roofline: 1e12 FLOPs at 312e12·0.695 = 2.1684e14 FLOP/s: 4.61169 ms beats 1e8 bytes; + 4 us.
    assert C.roofline_time(1e12, 1e8, A100) == pytest.approx(4.61169e-3 + 4e-6, rel=1e-5)
    # HBM-bound: 1e9 FLOPs (4.6 us) against 1e9 bytes (544.929 us).
    assert C.roofline_time(1e9, 1e9, A100) == pytest.approx(544.929e-6 + 4e-6, rel=1e-5)


def test_tile_quantisation():
    # one 128×128 tile on 108 SMs: 1 wave, e_tile = 1/108; 129×128 → two tiles, 129·128/(108·128²) = 0.009332.
    assert C.tile_efficiency(128, 128, A100) == pytest.approx(1 / 108)
    assert C.tile_efficiency(129, 128, A100) == pytest.approx(129 / (108 * 128), rel=1e-9)
    # 108 tiles fill one wave exactly.
    assert C.tile_efficiency(128 * 108, 128, A100) == pytest.approx(1.0)


def test_flash_attention_takes_its_tiles_shape_not_an_unaligned_gemms():
    # a sliding window's key count (round(8192 * r)) is rarely a multiple of 8: the kernel masks its last tile's
    # tail; before, 4223 and 4225 keys took cuBLAS's align1 fraction, 0.1665, and ran about 6 times slower
    b200 = catalog.gpu("B200")
    t = {n: C.flash_attention_time(32, 8192, n, 64, b200, True) - b200.launch_overhead
         for n in (4223, 4224, 4225)}
    # 4223 keys fill the same 33 tiles as 4224: the same efficiency, so the times go as the FLOPs, 4·32·8192·n·64·0.5
    assert t[4223] == pytest.approx(t[4224] * 4223 / 4224)
    # 4225 starts a 34th tile: a hair's other tile efficiency, within 1%, not the align1 kernel's 6 times
    assert t[4224] < t[4225] < 1.01 * t[4224]
