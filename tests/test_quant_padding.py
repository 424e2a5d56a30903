"""Quantised experts' row alignment (model.moe_router_padding_for_quantization; layer.py "Quantised experts'
alignment"): who pads, by how much, and what it costs."""
import dataclasses

import pytest

from emulator.errors import ScenarioError
from emulator.scenario import ModelSpec, ParallelSpec, load_scenario_text
from emulator.workload import layer as Ly

MOE = ModelSpec(layers=2, hidden=1024, heads=8, seq_len=1024, vocab=1024, experts=8, top_k=2, expert_ffn_hidden=512,
                swiglu=True)


def shape(m: ModelSpec = MOE, dtype: int = 1, **par) -> Ly.LayerShape:
    return Ly.layer_shape(m, 1, ep=2, dtype=dtype, flash=True, parallel=ParallelSpec(ep=2, **par))


def names(steps) -> list[str]:
    return [st.name for st in steps]


def test_the_experts_pad_their_rows_themselves_by_default():
    # FP8 (align 16), alltoall: 1024 tokens · top-2 = 2048 copies, 4 local experts of 512 rows each, plus
    # (16 − 1)/2 = 7.5 rows, rounded: 520; TE pads 4 · 520 rows of 1024 (read and written: 2 · 2080 · 1024 · 2 B =
    # 8 519 680) before fc1 and unpads them after fc2, by counts the dispatcher's sync already brought to the host
    L = shape(moe_token_dispatcher_type="alltoall")
    assert (L.pad_rows, L.pad_copies) == (7.5, True)
    fwd = Ly.forward_steps(L)
    up = next(k for k in Ly.kernels(fwd) if k.name == "moe.up")
    assert (up.m, up.batch) == (520, 4)
    steps = names(fwd)
    assert steps.index("moe.sort_chunks") + 1 == steps.index("moe.quant_pad") < steps.index("moe.up")
    assert steps.index("moe.quant_unpad") > steps.index("moe.down") and steps.count("moe.host_sync") == 1
    pad = next(k for k in Ly.kernels(fwd) if k.name == "moe.quant_pad")
    assert pad.bytes == 8_519_680
    bwd = names(Ly.backward_steps(L))
    assert bwd.index("moe.quant_unpad_bwd") < bwd.index("moe.down.dgrad") < bwd.index("moe.quant_pad_bwd")
    # bf16: nothing aligned
    plain = shape(dtype=2, moe_token_dispatcher_type="alltoall")
    assert plain.pad_rows == 0 and "moe.quant_pad" not in names(Ly.forward_steps(plain))


def test_the_alltoall_router_pads_every_source_rank():
    # each of the ep 2 source ranks pads each expert's count: 2 · 7.5 = 15 more rows an expert (527), and every
    # rank sends 8 experts · 7.5 = 60 more copies of its 2048: the all-to-all's bytes 2048·1024·2 · (1 + 60/2048)
    m = dataclasses.replace(MOE, moe_router_padding_for_quantization=True)
    L = shape(m, moe_token_dispatcher_type="alltoall")
    assert (L.pad_rows, L.pad_copies) == (15.0, False) and L.a2a_scale == 1 + 60 / 2048
    fwd = Ly.forward_steps(L)
    assert next(k for k in Ly.kernels(fwd) if k.name == "moe.up").m == 527
    dispatch = next(c for c in Ly.comms(fwd) if c.name == "moe.dispatch")
    assert dispatch.bytes == pytest.approx(2048 * 1024 * 2 * (1 + 60 / 2048) + 2048 * 4 * (1 + 60 / 2048))
    assert "moe.quant_pad" not in names(fwd) and "moe.host_sync" in names(fwd)  # the dispatcher's own sync stays


def test_deepep_pads_what_it_received_and_hybridep_in_its_dispatch():
    m = dataclasses.replace(MOE, moe_router_padding_for_quantization=True)
    for L in (shape(m, moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="deepep"),
              shape(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep")):
        assert (L.pad_rows, L.pad_copies, L.a2a_scale) == (7.5, False, 1.0)  # rows, no traffic, no copies
    # MXFP8 aligns to 32: 15.5 rows
    assert Ly.layer_shape(MOE, 1, ep=2, dtype=1, flash=True, recipe="mxfp8",
                          parallel=ParallelSpec(ep=2, moe_token_dispatcher_type="alltoall")).pad_rows == 15.5


TEXT = ("name: x\ncluster: {nodes: 1, node: dgx-h100}\n"
        "model: {layers: 2, hidden: 1024, heads: 8, seq_len: 1024, vocab: 1024, experts: 8, top_k: 2, "
        "moe_router_padding_for_quantization: true}\n"
        "training: {global_batch: 8, precision: PRECISION}\nparallel: {dp: 8, ep: 2, moe_token_dispatcher_type: D}\n")


@pytest.mark.parametrize("precision, dispatcher, words", [
    ("bf16", "alltoall", "needs fp8, mxfp8 or nvfp4"),
    ("fp8", "allgather", "allgather dispatcher does not support"),
])
def test_megatrons_rules_refuse_the_router_padding(precision, dispatcher, words):
    with pytest.raises(ScenarioError) as info:
        load_scenario_text(TEXT.replace("PRECISION", precision).replace("D}", dispatcher + "}"), "x.yaml")
    assert "model.moe_router_padding_for_quantization" in str(info.value) and words in str(info.value)
    load_scenario_text(TEXT.replace("PRECISION", "fp8").replace("D}", "alltoall}"), "x.yaml")  # accepted
