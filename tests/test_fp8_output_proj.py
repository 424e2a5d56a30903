"""Megatron-Core's MXFP8 LM head (training.fp8_output_proj): the output layer as Transformer Engine's linear layer
under the MXFP8 recipe, its casts, its weight copies and Megatron-Core's rule (emulator/workload/layer.py
head_casts, emulator/workload/memory.py, emulator/scenario/rules.py)."""
from __future__ import annotations

import pytest

from emulator.errors import ScenarioError
from emulator.scenario import load_scenario
from emulator.scenario.spec import ModelSpec
from emulator.workload import layer as Ly
from emulator.workload import mtp as MTP
from emulator.workload.memory import stage_memory

SMALL = ModelSpec(layers=1, hidden=256, heads=4, ffn_hidden=1024, seq_len=128, vocab=512)


def _kernels(steps: list[Ly.Step]) -> dict[str, Ly.Kernel]:
    return {st.name: st for st in steps if isinstance(st, Ly.Kernel)}


def _shape(recipe: str, head: bool) -> Ly.LayerShape:
    return Ly.layer_shape(SMALL, 1, 1, dtype=1, recipe=recipe, fp8_head=head)


def test_the_mxfp8_head_runs_its_gemms_quantised_with_their_casts():
    L = _shape("mxfp8", True)
    fwd, bwd = _kernels(Ly.head_forward(L, 512)), _kernels(Ly.head_backward(L, 512))
    head = fwd["lm_head"]
    assert head.dtype == 1 and head.quant == "mxfp8"
    # T = 128 tokens, h = 256, v = 512: operands (T·h + h·v)·(1 + 1/32) = 163,840 · 1.03125 = 168,960 B, the BF16
    # logits T·v·2 = 131,072 B
    assert head.bytes == pytest.approx(168_960 + 131_072)
    # the input's cast: read 2, write both copies 2·1.03125, over T·h = 32,768 elements = 133,120 B; the weight's,
    # once a step of one micro-batch: the same 4.0625 B over h·v = 131,072 elements = 532,480 B
    assert fwd["lm_head.fp8_cast_x"].bytes == pytest.approx(133_120)
    assert fwd["lm_head.fp8_cast_w"].bytes == pytest.approx(532_480)
    # before dgrad, the output gradient's: T·v = 65,536 elements · 4.0625 = 266,240 B
    assert bwd["lm_head.dgrad"].dtype == 1 and bwd["lm_head.fp8_cast_dy"].bytes == pytest.approx(266_240)
    # the MTP module's pass through the same output layer: quantised too, with its own casts
    mtp = _kernels(MTP.mtp_head_forward(L, 512, 1))
    assert mtp["lm_head.mtp"].dtype == 1 and "lm_head.mtp.fp8_cast_x" in mtp


@pytest.mark.parametrize("recipe, head", [("mxfp8", False), ("tensorwise", True), ("nvfp4", True)])
def test_the_head_stays_in_bf16_otherwise(recipe: str, head: bool):
    # Megatron-Core builds TELMHeadColumnParallelLinear only under the mxfp8 recipe (fp8_utils.py
    # is_mxfp8_output_proj_active); every other head is its own ColumnParallelLinear in BF16, with no casts
    L = _shape(recipe, head)
    fwd = _kernels(Ly.head_forward(L, 512))
    assert not L.fp8_head and fwd["lm_head"].dtype == 2
    assert not [n for n in fwd | _kernels(Ly.head_backward(L, 512)) if "fp8_cast" in n]


def test_megatron_core_refuses_it_outside_mxfp8():
    with pytest.raises(ScenarioError, match="needs training.precision mxfp8") as err:
        load_scenario("scenarios/llama3-8b-8-b200-tensorwise.yaml", ["training.fp8_output_proj=true"])
    assert err.value.key == "training.fp8_output_proj"


def test_the_head_stage_holds_the_weight_s_two_mxfp8_copies():
    path = "scenarios/llama3-70b-64-b200-mxfp8.yaml"
    plain = stage_memory(load_scenario(path))
    mx = stage_memory(load_scenario(path, ["training.fp8_output_proj=true"]))
    # Llama 3 70B's vocabulary 128,256 padded to a multiple of 128·tp = 512: 128,512 rows of h = 8192 over TP 4:
    # 263,192,576 weights, each with a row-wise and a column-wise MXFP8 copy, 2·(1 + 1/32) B: 542,834,688 B, on the
    # last of the four stages only
    gain = [b.breakdown["params"] - a.breakdown["params"] for a, b in zip(plain, mx)]
    assert gain == pytest.approx([0.0, 0.0, 0.0, 542_834_688.0])
