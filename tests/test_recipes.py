"""Transformer Engine's quantisation recipes on Blackwell and Hopper (training.precision fp8 | mxfp8 | nvfp4,
training.fp8_recipe delayed | tensorwise, Megatron's BF16 first and last layers): the casts' bytes and
times, the quantised GEMMs' rates, the memory of the quantised copies, and the refusals
(emulator/workload/layer.py, kernel_cost.py, devices/compute.py, memory.py, scenario/checks.py)."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from emulator.cli import main
from emulator.devices import compute as C
from emulator.errors import ScenarioError
from emulator.scenario import catalog, load_scenario_text
from emulator.scenario.spec import ModelSpec
from emulator.workload import kernel_cost as KC
from emulator.workload import layer as Ly
from emulator.workload.activations import layer_activation_bytes
from emulator.workload.memory import quant_weight_bytes
from emulator.workload.plan import make_plan

H100 = catalog.gpu("H100-SXM5-80GB")
B200 = catalog.gpu("B200")
SMALL = ModelSpec(layers=1, hidden=256, heads=4, ffn_hidden=1024, seq_len=128, vocab=512)
X = 128 * 256  # qkv's input: T·h = 32768 elements
W = 768 * 256  # qkv's weight: 196608 elements


def _shape(recipe: str, non_tn: bool, t: int = 1, sp: bool = False, micro: int = 2,
           fp8_params: bool = False) -> Ly.LayerShape:
    return Ly.layer_shape(SMALL, 1, t, sp, dtype=1, micro_batches=micro, recipe=recipe, non_tn=non_tn,
                          fp8_params=fp8_params)


def _fwd(L: Ly.LayerShape) -> dict:
    return {st.name: st for st in Ly.forward_steps(L)}


def test_catalog_fp4_peak_and_block_scaled_rates():
    # NVIDIA HGX B200 datasheet: FP4 144 PFLOP/s for 8 GPUs with sparsity -> 9 PFLOP/s dense a GPU
    assert B200.peak_flops_fp4 == 9000e12
    assert B200.peak_at("mxfp8") == 4500e12 and B200.peak_at("nvfp4") == 9000e12
    # Hopper has FP8 but no block-scaled tensor cores (no peak_flops_fp4): no mxfp8, no nvfp4
    assert H100.peak_at("fp8") == 1978.9e12 and H100.peak_at("mxfp8") == 0 and H100.peak_at("nvfp4") == 0


def test_recipe_names():
    assert Ly.recipe_of("fp8") == "delayed" and Ly.recipe_of("fp8", "tensorwise") == "tensorwise"
    assert Ly.recipe_of("mxfp8") == "mxfp8" and Ly.recipe_of("nvfp4") == "nvfp4" and Ly.recipe_of("bf16") == ""


def test_delayed_cast_writes_no_transpose_on_blackwell():
    # Hopper: read 2, write 1 + its transpose 1 = 4 B an element; Blackwell (non-TN FP8 GEMMs): 3.
    # + 3 tensors' amax histories of 2·4·1024 B: 4·32768 + 24576 = 155648 and 3·32768 + 24576 = 122880
    assert _fwd(_shape("delayed", False))["qkv.fp8_cast_x"].bytes == 155648
    assert _fwd(_shape("delayed", True))["qkv.fp8_cast_x"].bytes == 122880
    # the step's weight cast over 2 micro-batches: 3/2 B an element on Blackwell: 196608·1.5 = 294912
    assert _fwd(_shape("delayed", True))["qkv.fp8_cast_w"].bytes == W * 1.5
    # fp8 weights on Blackwell: no transpose to make, no weight cast at all
    assert "qkv.fp8_cast_w" not in _fwd(_shape("delayed", True, fp8_params=True))


def test_tensorwise_amax_pass_and_no_history():
    k = _fwd(_shape("tensorwise", False))
    assert k["qkv.fp8_cast_x_amax"].bytes == 2 * X  # the amax pass reads the bf16 input: 65536
    assert k["qkv.fp8_cast_x"].bytes == 4 * X  # cast-transpose, no amax history: 131072
    # the weight: amax pass 2 + cast-transpose 4 = 6 B an element, over 2 micro-batches: 196608·3
    assert k["qkv.fp8_cast_w"].bytes == W * 3.0
    names = [st.name for st in Ly.forward_steps(_shape("tensorwise", False))]
    i = names.index("qkv")
    assert names[i - 3:i + 1] == ["qkv.fp8_cast_x_amax", "qkv.fp8_cast_x", "qkv.fp8_cast_w", "qkv"]


def test_tensorwise_sequence_parallel_amax_all_reduce():
    # t = 2 with SP: amax of the local half (2/2 B an element), a 4-byte MAX all-reduce over TP, the cast of
    # the local half (3/2) and, on Hopper only, the transpose of the gathered tensor (2)
    steps = Ly.forward_steps(_shape("tensorwise", False, t=2, sp=True))
    by = {st.name: st for st in steps}
    assert by["qkv.fp8_cast_x_amax"].bytes == X
    ar = by["qkv.fp8_cast_x_amax_ar"]
    assert isinstance(ar, Ly.Comm) and ar.group == "tp" and ar.collective == "all_reduce" and ar.bytes == 4
    assert by["qkv.fp8_cast_x"].bytes == 1.5 * X + 2 * X  # 114688
    bw = {st.name: st for st in Ly.forward_steps(_shape("tensorwise", True, t=2, sp=True))}
    assert bw["qkv.fp8_cast_x"].bytes == 1.5 * X  # 49152: no transpose on Blackwell
    # backward: the row-parallel projection's output gradient, all-gathered with SP, reduces its amax too
    back = [st.name for st in Ly.backward_steps(_shape("tensorwise", True, t=2, sp=True))]
    assert "proj.fp8_cast_dy_amax_ar" in back and "qkv.fp8_cast_dy_amax_ar" not in back


def test_cast_time_at_the_cast_bandwidth():
    # Blackwell delayed cast of qkv's input: 122880 B at 0.765 of 8000 GB/s (h200/elementwise.csv row 10's
    # fraction) + 4 us launch: 122880 / 6.12e12 + 4e-6 = 4.02008 us
    k = _fwd(_shape("delayed", True))["qkv.fp8_cast_x"]
    t, src = KC.kernel_cost(k, B200, "fp8")
    assert src == "roofline" and t == pytest.approx(122880 / (8000e9 * 3672 / 4800) + 4e-6, rel=1e-12)


def test_mxfp8_quantises_both_copies_from_the_bf16_tensor():
    k = _fwd(_shape("mxfp8", True))
    # read 2, write a row-wise and a column-wise copy of 1 B + an E8M0 scale per 32: 2 + 2·(1 + 1/32) = 4.0625
    assert k["qkv.fp8_cast_x"].bytes == 4.0625 * X  # 133120
    assert "qkv.fp8_cast_x_amax" not in k  # block scales: no amax pass
    assert k["qkv.fp8_cast_w"].bytes == W * 4.0625 / 2  # once per step of 2 micro-batches: 399360
    assert k["qkv"].quant == "mxfp8" and KC.kernel_precision(k["qkv"], "mxfp8") == "mxfp8"
    assert KC.kernel_precision(k["ln1"], "mxfp8") == "bf16"


def test_blockwise_quantises_both_copies_with_block_scales_and_no_amax():
    # Float8BlockScaling on an H100, TP 2 with SP: the local half of qkv's input, read 2 B and written as a row-wise and
    # a column-wise copy of 1 B + an fp32 scale per 128 elements, 2 + 2·(1 + 4/128) = 4.0625 B an element, no amax
    # pass, no MAX all-reduce (each block finds its own scale), no transpose after the gather
    by = {st.name: st for st in Ly.forward_steps(_shape("blockwise", False, t=2, sp=True))}
    assert by["qkv.fp8_cast_x"].bytes == 4.0625 * X / 2  # 66560
    assert not {"qkv.fp8_cast_x_amax", "qkv.fp8_cast_x_amax_ar"} & set(by)
    # the weight, 128x128 blocks: 2 + 2·(1 + 4/16384) = 4.00048828125 B an element over 2 micro-batches; qkv's
    # weight at t = 2 is half of W
    assert by["qkv.fp8_cast_w"].bytes == pytest.approx(W / 2 * 4.00048828125 / 2)
    assert by["qkv"].quant == "fp8"  # the GEMM at the FP8 rate (an ASSUMPTION: no blockwise rows measured)
    # memory: two copies of the weight, 2·(1 + 1/4096) B; the saved GEMM inputs 1 + 1/32 B
    assert quant_weight_bytes(1000.0, "blockwise", False) == pytest.approx(2000.48828125)
    fp8 = layer_activation_bytes(SMALL, 1, 128, flash=True, fp8=True)
    block = layer_activation_bytes(SMALL, 1, 128, flash=True, fp8=True, saved=1.03125)
    assert block - fp8 == pytest.approx(0.03125 * (256 * 3 + 1024) * 128)


def test_nvfp4_casts():
    k = _fwd(_shape("nvfp4", True))
    assert k["qkv.fp8_cast_x_amax"].bytes == 2 * X  # the per-tensor FP32 scale needs the amax: 65536
    # read 2, write the row-wise and the (Hadamard-transformed) column-wise copies, each 1/2 B + an E4M3
    # scale per 16: 2 + 2·(0.5 + 0.0625) = 3.125 B an element: 102400
    assert k["qkv.fp8_cast_x"].bytes == 3.125 * X
    # the RHT (16 multiply-adds an element) is computed in the kernel: FLOPs, no bytes
    assert k["qkv.fp8_cast_x"].flops == X * (1 + 32)
    # weights: amax 2, read 2, two copies of 1/2 B + a scale per 16x16 block: 5.0078125 B, over 2 micro-batches
    assert k["qkv.fp8_cast_w"].bytes == W * (4 + 2 * (0.5 + 1 / 256)) / 2  # 492288
    # gradients are stochastically rounded: one more operation an element in their casts
    dy = {st.name: st for st in Ly.backward_steps(_shape("nvfp4", True))}["mlp.down.fp8_cast_dy"]
    assert dy.flops == X * (1 + 32 + 1)


def test_mxfp8_gemm_at_the_measured_fp8_rate():
    L = _shape("mxfp8", True)
    mx = Ly.gemm("mlp.up", 8192, 8192, 8192, L)
    f8 = Ly.gemm("mlp.up", 8192, 8192, 8192, _shape("delayed", True))
    # b200.csv: gemm fp8 1x8192x8192x8192, blackwell/gemm.csv row 10: the GB200's sustained cuBLASLt
    # 2876.6 TFLOP/s x 4500/5000 = 2588.94; an MXFP8 GEMM runs at the FP8 rate on sm_100
    t, src = KC.kernel_cost(mx, B200, "mxfp8")
    assert src == "measured" and t == pytest.approx(2 * 8192**3 / 2588.94e12 + 4e-6, rel=1e-9)
    assert KC.kernel_cost(f8, B200, "fp8") == (t, src)
    # its operands are read at 1 + 1/32 B an element, the bf16 output written: 2·8192²·1.03125 + 2·8192²
    assert mx.bytes == 2 * 8192**2 * 1.03125 + 2 * 8192**2


def test_quantised_gemm_roofline_law():
    # no table: 2mnk / (4500e12 · e), e = 0.695 · scale · e_tile · k/(k + 64), with the FP8 law's scale
    # 0.613 / FP8_REFERENCE_FRACTION, FP8_REFERENCE_FRACTION = (1402.6/1978.9) · 0.869/0.803 = 0.76703;
    # e_tile: 64·64 = 4096 tiles in ceil(4096/148) = 28 waves: 8192² / (28·148·128²) = 0.988418
    g = replace(B200, kernel_table="none")
    k = Ly.gemm("mlp.up", 8192, 8192, 8192, _shape("mxfp8", True))
    ref = (1402.6 / 1978.9) * 0.869 / 0.803
    e = 0.695 * (0.613 / ref) * (8192**2 / (28 * 148 * 128**2)) * (8192 / 8256)
    t, src = KC.kernel_cost(k, g, "mxfp8")
    assert src == "roofline" and t == pytest.approx(2 * 8192**3 / (4500e12 * e) + 4e-6, rel=1e-9)
    # NVFP4: the same law at the FP4 peak
    k4 = Ly.gemm("mlp.up", 8192, 8192, 8192, _shape("nvfp4", True))
    assert KC.kernel_cost(k4, g, "nvfp4")[0] == pytest.approx(2 * 8192**3 / (9000e12 * e) + 4e-6, rel=1e-9)
    # Hopper gives no matmul_fraction_fp8: its FP8 GEMMs keep its bf16 fraction, which the law reproduces
    assert C.fp8_fraction(H100) == H100.matmul_fraction
    assert C.REFERENCE_FRACTION * (1402.6 / 1978.9) / C.FP8_REFERENCE_FRACTION == pytest.approx(0.803)


def test_b200_attention_is_measured():
    # blackwell/attention.csv row 6: FlashAttention-4 causal forward, head dim 128, 8192 tokens, 1418.1 TFLOP/s
    # (standing in for cuDNN, which Transformer Engine runs on sm_100); row 8: the 2-CTA backward, 1208.6
    from emulator.devices import kernels as K

    assert K.lookup(B200, "attention_fwd_causal", "bf16", (128, 8192)).rate == pytest.approx(1418.1e12)
    assert K.lookup(B200, "attention_bwd_causal", "bf16", (128, 8192)).rate == pytest.approx(1208.6e12)
    # row 32: cuDNN's own causal forward at head dim 64: 1072
    assert K.lookup(B200, "attention_fwd_causal", "bf16", (64, 8192)).rate == pytest.approx(1072e12)


def test_memory_of_the_quantised_copies():
    n = 1000.0  # GEMM weight elements
    assert quant_weight_bytes(n, "delayed", False) == 2000  # Hopper: FP8 copy and its transpose, 1 + 1 B
    assert quant_weight_bytes(n, "tensorwise", False, non_tn=True) == 1000  # Blackwell: no transpose
    assert quant_weight_bytes(n, "delayed", True, non_tn=True) == -1000  # FP8 weights in place of bf16
    assert quant_weight_bytes(n, "mxfp8", False) == 2062.5  # two copies of 1 + 1/32 B
    assert quant_weight_bytes(n, "mxfp8", True) == 62.5  # MXFP8 weights (2.0625) in place of bf16 (2)
    assert quant_weight_bytes(n, "nvfp4", False) == pytest.approx(1007.8125)  # two copies of 1/2 + 1/256 B
    # saved activations: a GEMM input kept for wgrad costs 1 B in FP8, 0.5625 B in NVFP4; for SMALL at t = 1
    # the saved inputs are QKV, projection, MLP up and MLP down inputs: (h + h + h + ffn)·s·b elements, so the
    # difference is (1 - 0.5625)·(256·3 + 1024)·128 = 100352 B
    fp8 = layer_activation_bytes(SMALL, 1, 128, flash=True, fp8=True)
    fp4 = layer_activation_bytes(SMALL, 1, 128, flash=True, fp8=True, saved=0.5625)
    assert fp8 - fp4 == pytest.approx((1 - 0.5625) * (256 * 3 + 1024) * 128)


SCENARIO = """\
name: x
cluster:
  nodes: 1
  node: {node}
model:
  layers: 4
  hidden: 256
  heads: 4
  seq_len: 128
  vocab: 512
training:
  global_batch: 8
  micro_batch: 1
{training}parallel:
  dp: 8
"""


def _scenario(node: str, training: str):
    return load_scenario_text(SCENARIO.format(node=node, training=training), "x.yaml")


@pytest.mark.parametrize("node, training, message", [
    ("dgx-h100", "  precision: mxfp8\n",
     "x.yaml:14: training.precision: mxfp8 for Blackwell only (Megatron-LM): it needs the GPU's MXFP8 "
     "(block-scaled FP8) tensor-core rate, block-scaled tensor cores (sm_100 and later), but GPU H100-SXM5-80GB "
     "has none (its catalog entry gives no peak_flops_fp4); choose fp8 or a Blackwell GPU"),
    ("dgx-h200", "  precision: nvfp4\n",
     "x.yaml:14: training.precision: nvfp4 for Blackwell only (Megatron-LM): it needs the GPU's NVFP4 "
     "tensor-core rate, block-scaled tensor cores (sm_100 and later), but GPU H200-SXM has none (its catalog "
     "entry gives no peak_flops_fp4); choose fp8 or a Blackwell GPU"),
    ("dgx-b200", "  fp8_recipe: tensorwise\n",
     "x.yaml:14: training.fp8_recipe: an fp8 scaling recipe needs training.precision: fp8 (it is bf16); "
     "remove fp8_recipe or set the precision"),
    ("dgx-b200", "  precision: mxfp8\n  fp8_recipe: delayed\n",
     "x.yaml:15: training.fp8_recipe: an fp8 scaling recipe needs training.precision: fp8 (it is mxfp8); "
     "remove fp8_recipe or set the precision"),
])
def test_refusals(node, training, message):
    with pytest.raises(ScenarioError) as e:
        _scenario(node, training)
    assert str(e.value) == message


def test_refusal_exit_code(tmp_path, capsys):
    p = tmp_path / "x.yaml"
    p.write_text(SCENARIO.format(node="dgx-h100", training="  precision: mxfp8\n"))
    assert main(["run", str(p)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "mxfp8 for Blackwell only" in err[0]


def test_first_and_last_layers_in_bf16():
    sc = _scenario("dgx-b200", "  precision: mxfp8\n  first_last_layers_bf16: true\n")
    units = [u for u in make_plan(sc).chunk_units[0] if u.name.startswith("layer")]
    quantised = [any(getattr(st, "kind", "") == "cast" for st in u.fwd) for u in units]
    assert quantised == [False, True, True, False]  # Megatron's defaults: 1 layer at each end
    sc = _scenario("dgx-b200", "  precision: fp8\n  first_last_layers_bf16: true\n"
                               "  num_layers_at_start_in_bf16: 2\n  num_layers_at_end_in_bf16: 0\n")
    units = [u for u in make_plan(sc).chunk_units[0] if u.name.startswith("layer")]
    assert [any(getattr(st, "kind", "") == "cast" for st in u.fwd) for u in units] == [False, False, True, True]
    assert math.isclose(sc.training.num_layers_at_start_in_bf16, 2)
