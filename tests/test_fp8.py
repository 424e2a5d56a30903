"""FP8 as Transformer Engine runs it (training.precision: fp8): only the linear layers' GEMMs in FP8,
at the measured FP8 rates, with TE's cast-transposes and amax-history updates around them
(emulator/workload/layer.py, emulator/workload/kernel_cost.py)."""
from __future__ import annotations

import pytest

from emulator.devices import compute as C
from emulator.scenario import catalog
from emulator.scenario.spec import ModelSpec
from emulator.workload import kernel_cost as KC
from emulator.workload import layer as Ly

H100 = catalog.gpu("H100-SXM5-80GB")
SMALL = ModelSpec(layers=1, hidden=256, heads=4, ffn_hidden=1024, seq_len=128, vocab=512)


def _shape(t: int = 1, sp: bool = False, micro: int = 2, fp8_params: bool = False) -> Ly.LayerShape:
    return Ly.layer_shape(SMALL, 1, t, sp, dtype=1, micro_batches=micro, fp8_params=fp8_params)


def _by_name(steps):
    return {st.name: st for st in steps if isinstance(st, Ly.Kernel)}


def test_only_linear_gemms_are_fp8():
    L = _shape()
    assert L.fp8 and L.dtype == 2  # activations stay bf16
    k = _by_name(Ly.forward_steps(L) + Ly.head_forward(L, 512))
    assert k["qkv"].dtype == k["proj"].dtype == k["mlp.up"].dtype == k["mlp.down"].dtype == 1
    assert k["lm_head"].dtype == 2  # Megatron's output layer is not a TE module
    assert k["ln1"].bytes == 2 * 128 * 256 * 2  # a norm: 2 passes of T·h bf16 elements
    unfused = _by_name(Ly.forward_steps(Ly.layer_shape(SMALL, 1, dtype=1)))  # unfused core attention: bf16 bmm
    assert unfused["attn.qk"].dtype == 2


def test_cast_transpose_bytes_by_hand():
    L = _shape(micro=2)
    k = _by_name(Ly.forward_steps(L))
    # qkv input: T·h = 128·256 = 32768 elements, 4 B each (read bf16, write fp8 and its transpose)
    # + 3 tensors' amax history (2·4·1024 B each): 131072 + 24576
    assert k["qkv.fp8_cast_x"].bytes == 131072 + 24576
    # qkv weight (768 × 256 = 196608 elements), cast once per step of 2 micro-batches: 4/2 B per element
    assert k["qkv.fp8_cast_w"].bytes == 196608 * 2.0
    # the casts come right before their GEMM
    names = [st.name for st in Ly.forward_steps(L)]
    assert names[names.index("qkv") - 2:names.index("qkv") + 1] == ["qkv.fp8_cast_x", "qkv.fp8_cast_w", "qkv"]
    b = _by_name(Ly.backward_steps(L))
    # mlp.down's output gradient T·h = 32768 elements: 4 B each + 2 tensors' amax history
    assert b["mlp.down.fp8_cast_dy"].bytes == 131072 + 16384
    assert "mlp.down.fp8_cast_w" not in b and not any(n.endswith("wgrad.fp8_cast_dy") for n in b)
    # fp8 weights (fp8_params): only the transpose is written, 2 B per element per step
    assert _by_name(Ly.forward_steps(_shape(micro=2, fp8_params=True)))["qkv.fp8_cast_w"].bytes == 196608 * 1.0


def test_sequence_parallel_casts_the_local_shard():
    # t = 2 with SP: qkv's input is all-gathered; TE casts the local half (3 B per element) and transposes
    # the gathered tensor (2 B): (3/2 + 2)·32768 = 114688, + 24576 amax
    k = _by_name(Ly.forward_steps(_shape(t=2, sp=True)))
    assert k["qkv.fp8_cast_x"].bytes == 114688 + 24576
    assert k["proj.fp8_cast_x"].bytes == 4 * 128 * 128 + 24576  # proj's input (T × h/t) is not gathered


def test_backward_overlap_windows_still_cover_the_gemm():
    # with SP the saved input's all-gather overlaps dgrad (overlap 1): the dY cast goes ahead of it
    steps = Ly.backward_steps(_shape(t=2, sp=True))
    i = next(j for j, st in enumerate(steps) if st.name == "qkv.dgrad")
    assert steps[i - 1].name == "qkv.ag_input" and steps[i - 2].name == "qkv.fp8_cast_dy"


def test_fp8_gemm_runs_at_the_fp8_rate_and_the_rest_at_bf16():
    g = C.at_precision(H100, "fp8")
    assert g.peak_flops == 989.4e12  # at_precision keeps the bf16 peak: attention and the rest run there
    L = Ly.layer_shape(ModelSpec(layers=1, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672, seq_len=8192,
                                 vocab=128256, swiglu=True), 1, 1, dtype=1, flash=True)  # up: n = 2·28672
    k = _by_name(Ly.forward_steps(L))
    # mlp.up (8192, 57344, 8192) in fp8: h200/fp8_gemm.csv row 18, 6267.38 us, carried to the H100
    t, src = KC.kernel_cost(k["mlp.up"], g, "fp8")
    assert src == "measured" and t == pytest.approx(6267.38e-6, rel=1e-5)
    # the flash kernel costs the same under fp8 as under bf16 (cuDNN bf16 rows)
    assert KC.kernel_cost(k["attn.flash"], g, "fp8") == KC.kernel_cost(k["attn.flash"], H100, "bf16")
    assert KC.kernel_precision(k["attn.flash"], "fp8") == "bf16" and KC.kernel_precision(k["mlp.up"], "fp8") == "fp8"


def test_fp8_roofline_uses_the_fp8_peak():
    # an fp8 GEMM no table covers (A100-shaped roofline on the H100 without a table): 2mnk / (1978.9e12 · e)
    from dataclasses import replace

    g = C.at_precision(replace(H100, kernel_table="none"), "fp8")
    t, src = C.gemm_cost(8192, 8192, 8192, g, "fp8")
    e = C.gemm_efficiency(8192, 8192, 8192, g, 1, 1)
    assert src == "roofline" and t == pytest.approx(2 * 8192**3 / (1978.9e12 * e) + 4e-6)


def test_casts_move_their_bytes_at_the_measured_cast_bandwidth():
    # h200/elementwise.csv row 10: a cast at 3672 of 4800 GB/s (0.765); on the H100 0.765 · 3350 GB/s.
    # qkv.fp8_cast_x of the small model: 155648 B / (3350e9 · 3672/4800) = 60.735 ns, + 4 us launch
    k = _by_name(Ly.forward_steps(_shape()))["qkv.fp8_cast_x"]
    assert k.kind == "cast"
    t, src = KC.kernel_cost(k, H100, "fp8")
    assert src == "roofline" and t == pytest.approx(155648 / (3350e9 * 3672 / 4800) + 4e-6, rel=1e-9)


def test_te_gathers_carry_the_quantised_tensor():
    # SMALL at t 2 with SP: T·h = 128·256 = 32 768 elements a gather; bf16 65 536 B, FP8 32 768 B,
    # MXFP8 32 768·(1 + 1/32) = 33 792 B, NVFP4 32 768·(1/2 + 1/16) = 18 432 B
    def gathers(recipe: str, backward: bool = False) -> dict[str, float]:
        L = Ly.layer_shape(SMALL, 1, 2, True, dtype=1, recipe=recipe)
        steps = Ly.backward_steps(L) if backward else Ly.forward_steps(L)
        return {c.name: c.bytes for c in Ly.comms(steps) if c.collective == "all_gather"}

    assert gathers("delayed") == {"ln1.ag": 32_768, "ln2.ag": 32_768}
    assert gathers("mxfp8") == {"ln1.ag": 33_792, "ln2.ag": 33_792}
    assert gathers("nvfp4") == {"ln1.ag": 18_432, "ln2.ag": 18_432}
    # the backward's: the output gradient for proj's and fc2's dgrad, the input for qkv's and fc1's wgrad
    assert gathers("delayed", backward=True) == {"mlp.down.ag_grad": 32_768, "mlp.up.ag_input": 32_768,
                                                 "proj.ag_grad": 32_768, "qkv.ag_input": 32_768}
    # MXFP8 gathers both copies of the output gradient (2 · 33 792 = 67 584 B), one of the input
    assert gathers("mxfp8", backward=True) == {"mlp.down.ag_grad": 67_584, "mlp.up.ag_input": 33_792,
                                               "proj.ag_grad": 67_584, "qkv.ag_input": 33_792}
    # the reduce-scatters carry the GEMMs' bf16 outputs: 65 536 B
    L = Ly.layer_shape(SMALL, 1, 2, True, dtype=1)
    assert {c.bytes for c in Ly.comms(Ly.forward_steps(L)) if c.collective == "reduce_scatter"} == {65_536}
    # an MoE layer's gather before its router is Megatron's own, in bf16
    moe = ModelSpec(layers=1, hidden=256, heads=4, ffn_hidden=1024, seq_len=128, vocab=512, experts=4, top_k=2)
    Lm = Ly.layer_shape(moe, 1, 2, True, dtype=1)
    assert next(c.bytes for c in Ly.comms(Ly.forward_steps(Lm)) if c.name == "ln2.ag") == 65_536


def test_fp8_params_gather_their_gemm_weights_in_one_byte():
    from emulator.scenario import load_scenario_text
    from emulator.workload.builder import build_program

    def gathered(fp8_params: bool) -> float:
        sc = load_scenario_text(
            "name: x\ncluster: {nodes: 1, node: dgx-h100}\n"
            "model: {layers: 2, hidden: 256, heads: 4, ffn_hidden: 1024, seq_len: 128, vocab: 512}\n"
            f"training: {{global_batch: 8, micro_batch: 1, precision: fp8, fp8_params: {str(fp8_params).lower()}}}\n"
            "parallel: {dp: 8, zero: 1, overlap_param_gather: false, grad_bucket: 1 GB}\n", "x.yaml")
        return sum(o.bytes for o in build_program(sc).ops if o.rank == 0 and o.name.startswith("param_ag."))

    # each layer's GEMM weights, 4h² + 2·h·ffn = 4·256² + 2·256·1024 = 786 432, move in 1 byte instead of 2;
    # two layers: 1 572 864 B fewer. Norms, biases and the embedding stay bf16.
    assert gathered(False) - gathered(True) == 1_572_864


def test_fp4_param_gathers_nvfp4_weights_and_keeps_them_in_place_of_bf16():
    """training.fp4_param (Megatron-Core's fp4_param, --fp4-param-gather) with precision nvfp4 on a B200 node."""
    from emulator.errors import ScenarioError
    from emulator.scenario import load_scenario_text
    from emulator.workload.builder import build_program
    from emulator.workload.memory import quant_weight_bytes

    def text(fp4: bool, precision: str = "nvfp4") -> str:
        return ("name: x\ncluster: {nodes: 1, node: dgx-b200}\n"
                "model: {layers: 2, hidden: 256, heads: 4, ffn_hidden: 1024, seq_len: 128, vocab: 512}\n"
                f"training: {{global_batch: 8, micro_batch: 1, precision: {precision}, fp4_param: {str(fp4).lower()}}}\n"
                "parallel: {dp: 8, zero: 1, overlap_param_gather: false, grad_bucket: 1 GB}\n")

    def gathered(fp4: bool) -> float:
        prog = build_program(load_scenario_text(text(fp4), "x.yaml"))
        return sum(o.bytes for o in prog.ops if o.rank == 0 and o.name.startswith("param_ag."))

    # each layer's 786 432 GEMM weights move in 1/2 + 1/256 B instead of 2: 786 432 · (2 − 0.50390625) =
    # 1 176 576 B a layer, 2 353 152 B for two
    assert gathered(False) - gathered(True) == 2_353_152
    # held: both NVFP4 copies in place of the bf16 weight, 2·(1/2 + 1/256) − 2 = −0.9921875 B an element,
    # against +1.0078125 B beside bf16 without it
    assert quant_weight_bytes(1000.0, "nvfp4", True) == pytest.approx(-992.1875)
    assert quant_weight_bytes(1000.0, "nvfp4", False) == pytest.approx(1007.8125)
    # the step's weight cast: only the column-wise copy from the gathered row-wise one, read and written
    assert Ly.weight_quant_bytes("nvfp4", True, True) == pytest.approx(2 * 0.50390625)
    with pytest.raises(ScenarioError) as info:  # Megatron: "fp4_param must be used together with fp4 mode"
        load_scenario_text(text(True, "mxfp8"), "x.yaml")
    assert "training.fp4_param" in str(info.value) and "nvfp4" in str(info.value)
