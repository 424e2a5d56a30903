"""FP8 as Transformer Engine runs it (training.precision: fp8): only the linear layers' GEMMs in FP8,
at the measured FP8 rates, with TE's cast-transposes and amax-history updates around them
(emulator/workload/layer.py, emulator/workload/kernel_cost.py)."""
from __future__ import annotations

from dataclasses import replace

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


# --- FP8 attention (training.fp8_dot_product_attention) ----------------------------------------------------------
LLAMA = ModelSpec(layers=1, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, seq_len=8192, vocab=128256,
                  swiglu=True)


def _dpa(dpa: bool) -> Ly.LayerShape:
    return Ly.layer_shape(LLAMA, 1, 1, dtype=1, flash=True, fp8_dpa=dpa)


def test_fp8_attention_takes_the_h200s_measured_speed_up():
    # Llama-3 8B's causal attention, head dim 128 over 8192 keys: cudnn-frontend's H200 rows (h100/attention.csv
    # rows 282-283 and 286-287) give FP8 964 TFLOP/s forward and 430 backward, BF16 644 and 541
    k, b = _by_name(Ly.forward_steps(_dpa(True))), _by_name(Ly.backward_steps(_dpa(True)))
    fwd, bwd = k["attn.flash"], b["attn.flash_bwd"]
    assert fwd.quant == "fp8" and fwd.flops == 4.0 * 32 * 8192 * 8192 * 128 * 0.5
    assert KC.fp8_attention_speedup("attention_fwd_causal", (128, 8192)) == pytest.approx(964 / 644)
    assert KC.fp8_attention_speedup("attention_bwd_causal", (128, 8192)) == pytest.approx(430 / 541)
    # on the H100 (the same rows carried: Hopper reads the H200 ratio): the FP8 rate itself, 964 and 430
    t, src = KC.kernel_cost(fwd, H100, "fp8")
    assert src == "interpolated" and t == pytest.approx(fwd.flops / 964e12 + 4e-6)
    assert KC.kernel_cost(bwd, H100, "fp8")[0] == pytest.approx(bwd.flops / 430e12 + 4e-6)
    plain = _by_name(Ly.forward_steps(_dpa(False)))["attn.flash"]
    assert plain.quant == "" and KC.kernel_cost(plain, H100, "fp8")[0] == pytest.approx(plain.flops / 644e12 + 4e-6)
    # on the B200: its own BF16 kernel's time over the GB200's ratios (emulator/data/kernels/dpa_gb200.csv, cudnn-
    # frontend @ 3929da2 llama3.1/gb200 rows 37-38 and 43-44): FP8 2047 against 1574 forward, 1454 against 1332
    B200 = catalog.gpu("B200")
    for kern, ratio in ((fwd, 2047 / 1574), (bwd, 1454 / 1332)):
        bf16, _ = KC.kernel_cost(replace(kern, quant=""), B200, "fp8")
        assert KC.kernel_cost(kern, B200, "fp8")[0] == pytest.approx(4e-6 + (bf16 - 4e-6) / ratio)
    # under MXFP8 the MXFP8 rows (49-50): 1902 and 1287 against the same BF16
    mx = _by_name(Ly.forward_steps(Ly.layer_shape(LLAMA, 1, 1, dtype=1, flash=True, fp8_dpa=True, recipe="mxfp8")))
    assert mx["attn.flash"].quant == "mxfp8"
    assert KC.fp8_attention_speedup("attention_fwd_causal", (128, 8192), "mxfp8", B200) == pytest.approx(1902 / 1574)
    assert KC.fp8_attention_speedup("attention_bwd_causal", (128, 8192), "mxfp8", B200) == pytest.approx(1287 / 1332)
    # Blackwell Ultra (NVFP4 three times FP8) reads the GB300's rows
    assert KC.fp8_attention_speedup("attention_fwd_causal", (128, 8192), "fp8", catalog.gpu("B300")) \
        == pytest.approx(2897 / 1856)  # dpa_gb300.csv: llama3.1/gb300 rows, 128 x 8192 causal
    # a head dim no row is near (32: over an octave below 128) takes no speed-up
    assert KC.fp8_attention_speedup("attention_fwd_causal", (32, 8192)) == 1.0


def test_fp8_attention_casts_by_hand():
    # TE casts Q, K, V to FP8 and the output back; T = 8192 tokens, Q 32·128, K and V 8·128 each:
    # (4096 + 2048)·8192 = 50,331,648 elements at 3 B (read 2, write 1); the output 4096·8192 at 3 B
    k = _by_name(Ly.forward_steps(_dpa(True)))
    assert k["attn.fp8_cast_qkv"].bytes == 3 * 50_331_648 and k["attn.fp8_cast_o"].bytes == 3 * 4096 * 8192
    b = _by_name(Ly.backward_steps(_dpa(True)))
    assert b["attn.fp8_cast_do"].bytes == 3 * 4096 * 8192 and b["attn.fp8_cast_dqkv"].bytes == 3 * 50_331_648
    names = [st.name for st in Ly.forward_steps(_dpa(True))]
    assert names.index("attn.fp8_cast_qkv") + 1 == names.index("attn.flash") == names.index("attn.fp8_cast_o") - 1
    assert "attn.fp8_cast_qkv" not in _by_name(Ly.forward_steps(_dpa(False)))
    # Megatron's BF16 first and last layers run their attention in BF16
    assert not Ly.unquantised(_dpa(True)).fp8_dpa


def test_fp8_attention_saves_q_k_v_and_its_output_in_fp8():
    from emulator.workload.activations import layer_activation_bytes

    # per token Q 4096 + K 1024 + V 1024 elements, and the kept output 4096: one byte each, not two, so
    # 8192 tokens x (6144 + 4096) bytes less
    args = (LLAMA, 1, 8192, 1, False, "none", True, 2, 1)
    plain = layer_activation_bytes(*args, fp8=True, saved=1.0)
    dpa = layer_activation_bytes(*args, fp8=True, saved=1.0, dpa=True)
    assert plain - dpa == 8192 * (6144 + 4096)


@pytest.mark.parametrize("sets, words", [
    (["training.precision=bf16"], "quantised autocast"),
    (["training.attention=fa2"], "FusedAttention"),
])
def test_fp8_attention_refusals_name_the_key(sets, words):
    from emulator.errors import ScenarioError
    from emulator.scenario import load_scenario

    with pytest.raises(ScenarioError, match=words) as err:
        load_scenario("scenarios/llama3-8b-8-b200-tensorwise.yaml", ["training.fp8_dot_product_attention=true", *sets])
    assert err.value.key == "training.fp8_dot_product_attention"


def test_dpa_rows_read_cudnn_frontends_results():
    from emulator.tools.kernel_tables import dpa_rows

    head = ("config_name,model_name,backend,data_type,attn_mask,batch_size,q_seqlen,kv_seqlen,num_q_heads,num_kv_heads,"
            "head_dim_qk,head_dim_vo,profile_pass,deterministic_bwd,time_ms,tflops,max_diff,num_iterations,"
            "sliding_window_size,success,error_message,gpu_name,cudnn_version,cudnn_backend_version\n")
    rows = ["dsv3,dsv3,cudnn,fp8,top_left,2,4096,4096,128,128,192,128,fwd,False,1,2047.5,0,10,,True,,GB200,1,1",
            "dsv3,dsv3,cudnn,fp8,top_left,2,4096,4096,128,128,192,128,bwd,True,1,900,0,10,,True,,GB200,1,1",
            "oss,oss,cudnn,bfloat16,top_left,2,4096,4096,64,64,64,64,fwd,False,1,100,0,10,128,True,,GB200,1,1",
            "l,l,cudnn,bfloat16,no_mask,2,2048,2048,64,8,128,128,bwd,False,1,1124,0,10,,True,,GB200,1,1"]
    # MLA's 192/128 at their mean, 160; a deterministic backward and a sliding window left out
    assert dpa_rows(head + "\n".join(rows), "f.csv") == ["attention_fwd_causal,fp8,160x4096,2047.5,f.csv row 1\n",
                                                        "attention_bwd,bf16,128x2048,1124,f.csv row 4\n"]


def test_per_tensor_fp8_attention_sends_k_and_v_in_fp8_around_the_cp_ring():
    # CP 2 ring (p2p): K and V of this rank's 4096 tokens, 8 kv heads x (128 + 128): 4096 x 2048 elements, one byte
    # each under per-tensor FP8 attention, two otherwise (and under MXFP8, which TE keeps in BF16 around the ring)
    def ring(dpa: bool, recipe: str = "") -> float:
        L = Ly.layer_shape(LLAMA, 1, 1, cp=2, dtype=1, flash=True, fp8_dpa=dpa, recipe=recipe)
        return next(st.bytes for st in Ly.forward_steps(L) if st.name == "attn.kv_ring0")
    assert ring(True) == 4096 * 2048 and ring(False) == 2 * 4096 * 2048 and ring(True, "mxfp8") == 2 * 4096 * 2048
