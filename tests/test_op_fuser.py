"""Megatron-Core's Transformer Engine op fuser for the routed experts (model.use_transformer_engine_op_fuser): on
Blackwell under MXFP8 or NVFP4, TE's CuTe DSL fused grouped MLP (emulator/workload/layer.py _experts_forward,
_experts_backward), and Megatron-Core's refusals (emulator/scenario/op_fuser_rules.py)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from emulator.errors import ScenarioError
from emulator.scenario import load_scenario
from emulator.scenario.spec import ModelSpec
from emulator.workload import layer as Ly

# 4 experts of width 512 (SwiGLU: fc1 1024 wide), top-2, 128 tokens, one EP rank: 256 routed rows, 4 groups of 64
MOE = ModelSpec(layers=1, hidden=256, heads=4, ffn_hidden=512, seq_len=128, vocab=512, experts=4, top_k=2,
                swiglu=True)
FUSED = replace(MOE, use_transformer_engine_op_fuser=True)


def _shape(m: ModelSpec, recipe: str = "mxfp8", blackwell: bool = True) -> Ly.LayerShape:
    return Ly.layer_shape(m, 1, 1, dtype=1, recipe=recipe, non_tn=blackwell)


def _kernels(steps: list[Ly.Step]) -> dict[str, Ly.Kernel]:
    return {st.name: st for st in steps if isinstance(st, Ly.Kernel)}


def test_the_fused_grouped_mlp_folds_the_activation_and_two_casts_into_the_gemms():
    plain, fused = _shape(MOE), _shape(FUSED)
    assert fused.fused_mlp and not plain.fused_mlp
    pf, ff = _kernels(Ly.forward_steps(plain)), _kernels(Ly.forward_steps(fused))
    pb, fb = _kernels(Ly.backward_steps(plain)), _kernels(Ly.backward_steps(fused))
    # gone: the SwiGLU kernels, fc2's input cast (fc1's epilogue writes it) and fc1's output-gradient cast (fc2's
    # dgrad epilogue writes it); the other casts stay
    assert {"swiglu", "moe.down.fp8_cast_x"} <= set(pf) and not {"swiglu", "moe.down.fp8_cast_x"} & set(ff)
    assert {"swiglu_bwd", "moe.up.fp8_cast_dy"} <= set(pb) and not {"swiglu_bwd", "moe.up.fp8_cast_dy"} & set(fb)
    assert {"moe.up.fp8_cast_x", "moe.down.fp8_cast_dy"} <= set(ff) | set(fb)
    # fc1's epilogue writes fc2's input in both MXFP8 copies: 256 rows x 512 x 2 x (1 + 1/32) = 270,336 B
    assert ff["moe.up"].bytes - pf["moe.up"].bytes == pytest.approx(270_336)
    assert ff["moe.up"].flops == pf["moe.up"].flops and ff["moe.down"] == pf["moe.down"]
    # fc2's dgrad epilogue reads the BF16 pre-activation, 256 x 1024 x 2 = 524,288 B, and writes fc1's output gradient
    # in both copies, 256 x 1024 x 2.0625 = 540,672 B, not the BF16 256 x 512 x 2 = 262,144 B: +802,816 B
    assert fb["moe.down.dgrad"].bytes - pb["moe.down.dgrad"].bytes == pytest.approx(802_816)


@pytest.mark.parametrize("recipe, blackwell", [("mxfp8", False), ("tensorwise", True), ("", True)])
def test_elsewhere_the_experts_run_the_same_kernels(recipe: str, blackwell: bool):
    # TE fuses only on sm_100 under a block-scaled recipe (grouped_mlp.py fuse_grouped_mlp_ops, is_supported); its
    # unfused ops are the same GEMMs, activation and casts
    def steps(m: ModelSpec) -> list[Ly.Step]:
        if not recipe:
            L = Ly.layer_shape(m, 1, 1, non_tn=blackwell)
        else:
            L = _shape(m, recipe, blackwell)
        return Ly.forward_steps(L) + Ly.backward_steps(L)
    assert steps(FUSED) == steps(MOE)


@pytest.mark.parametrize("path, sets, words", [
    # Mixtral on TP 2 with no etp: the experts share the attention's TP 2
    ("scenarios/mixtral-8x7b-moe-32-h100.yaml", ["model.use_transformer_engine_op_fuser=true"],
     "without tensor parallelism: the experts' TP is 2"),
    ("scenarios/deepseek-v3-256-gb200-mxfp8.yaml", ["model.activation=gelu", "model.swiglu=false"],
     "SwiGLU and squared-ReLU experts only"),
])
def test_megatron_core_refuses_what_its_fused_experts_cannot_run(path: str, sets: list[str], words: str):
    with pytest.raises(ScenarioError, match=words) as err:
        load_scenario(path, sets)
    assert err.value.key == "model.use_transformer_engine_op_fuser"


def test_selective_offloading_of_the_experts_is_refused_with_it():
    with pytest.raises(ScenarioError, match="only from the unfused experts") as err:
        load_scenario("scenarios/deepseek-v3-256-gb200-mxfp8.yaml",
                      ["model.moe_paged_stash=false", "training.fine_grained_activation_offloading=true",
                       "training.offload_modules=[moe_act]"])
    assert err.value.key == "training.offload_modules"


def test_the_fused_experts_pad_each_expert_to_256_rows():
    # Megatron-Core pads for TE's grouped-tensor kernels to 256 rows with the op fuser, 32 under MXFP8 without
    # (moe_utils.py get_align_size_for_quantization); a count spread evenly modulo a gains (a - 1)/2 rows
    from emulator.scenario.spec import ParallelSpec

    par = ParallelSpec()
    pad = {m.use_transformer_engine_op_fuser: Ly._quant_padding(m, par, "mxfp8", 128, 1, False, 1, None)["pad_rows"]
           for m in (MOE, FUSED)}
    assert pad == {False: 15.5, True: 127.5}


def test_a_bf16_layer_of_a_quantised_run_runs_the_experts_unfused():
    # first_last_layers_bf16 keeps the end layers out of the quantised autocast, where TE does not fuse
    # (fuse_grouped_mlp_ops: no recipe); Nemotron 3 Super's release recipe keeps its last 14 layers in BF16
    plain, fused = (Ly.unquantised(_shape(m)) for m in (MOE, FUSED))
    assert not fused.fused_mlp
    assert Ly.forward_steps(fused) + Ly.backward_steps(fused) == Ly.forward_steps(plain) + Ly.backward_steps(plain)
    from emulator.workload.plan import make_plan

    plan = make_plan(load_scenario("scenarios/nemotron-3-super-64-gb200.yaml",
                                   ["model.use_transformer_engine_op_fuser=true"]))
    # the quantised MoE layers run no activation kernel of their own, the BF16 ones at the end do
    acts = [any(isinstance(st, Ly.Kernel) and st.name == "squared_relu" for st in u.fwd)
            for u in plan.chunk_units[0] if any(getattr(st, "name", "") == "moe.up" for st in u.fwd)]
    assert False in acts and True in acts and acts.index(True) > acts.index(False)
