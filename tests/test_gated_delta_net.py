"""A hybrid model's gated delta net (G layers; Qwen3-Next) and the attention's output gate: parameters, kernels,
FLOPs and rules, by hand."""
from dataclasses import replace

import pytest

from emulator.errors import ScenarioError
from emulator.scenario import load_scenario_text
from emulator.scenario.catalog import model_preset
from emulator.workload import delta_net as DN
from emulator.workload import flops as F
from emulator.workload import layer as Ly
from emulator.workload import models as M

NEXT = model_preset("qwen3-next-80b-a3b")


def test_qwen3_next_parameters_by_hand():
    # a G layer: in_proj 2048·(2·16·128 + 2·32·128 + 2·32) = 25,296,896, conv1d (2·2048 + 4096)·4 = 32,768,
    # A_log and dt_bias 2·32, the gated norm 128, out_proj 4096·2048 = 8,388,608, its pre-norm 2048
    assert M.part_params(NEXT, "G") == 25_296_896 + 32_768 + 64 + 128 + 8_388_608 + 2048
    # an attention layer: QKV with the gate 2048·(16·256 + 2·2·256 + 16·256) = 18,874,368, projection 4096·2048
    assert M.part_params(NEXT, "*") == 18_874_368 + 8_388_608 + 2048
    # 36 G, 12 attention and 48 MoE layers (router 512·2048, shared 3·2048·512, experts 512·3·2048·512, norm),
    # untied embeddings 2·151936·2048 and the final norm: 79.67B (the q/k norms and the shared expert's gate, 12·512
    # and 48·2048, are not modelled)
    moe = 1_048_576 + 3_145_728 + 512 * 3_145_728 + 2048
    total = 36 * 33_720_512 + 12 * 27_265_024 + 48 * moe + 2 * 151936 * 2048 + 2048
    assert M.total_params(NEXT) == total == 79_674_286_848


def test_the_kernels_by_hand():
    L = replace(Ly.layer_shape(NEXT, 2, t=2, sp=True, flash=True), parts="G")
    steps = {st.name: st for st in Ly.forward_steps(L)}
    # TP 2: 8 key and 16 value heads a rank; in_proj 8192 tokens × (2·1024 + 2·2048 + 2·16) × 2048
    inp = steps["gdn.in_proj"]
    assert (inp.m, inp.n, inp.k) == (8192, 6176, 2048)
    assert steps["gdn.ln.ag"].bytes == 8192 * 2048 * 2  # the SP all-gather into in_proj
    # the rule: 8192 tokens × 16 heads × (2·64·128 + 2·64²/3 + 4·64·256 + 6·128²)
    per = 2 * 64 * 128 + 2 * 64 * 64 / 3 + 4 * 64 * 256 + 6 * 128 * 128
    assert steps["gdn.rule"].flops == pytest.approx(8192 * 16 * per)
    # q and k repeated from 8 to 16 heads: read 2·1024, write 2·16·128 elements a token
    assert steps["gdn.repeat"].bytes == 8192 * (2 * 1024 + 2 * 16 * 128) * 2
    out = steps["gdn.out_proj"]
    assert (out.m, out.n, out.k) == (8192, 2048, 2048)
    bwd = {st.name: st for st in Ly.backward_steps(L)}
    # backward: twice the forward's FLOPs and the chunk states recomputed, 4·128·128 a token and head
    assert bwd["gdn.rule_bwd"].flops == pytest.approx(2 * 8192 * 16 * per + 4 * 8192 * 16 * 128 * 128)


def test_the_output_gate_widens_qkv():
    L = replace(Ly.layer_shape(NEXT, 1, flash=True), parts="*")
    steps = {st.name: st for st in Ly.forward_steps(L)}
    # 16 query heads, 2 KV heads and the gate's 16 heads, of 256
    assert steps["qkv"].n == (16 + 2 * 2 + 16) * 256
    assert steps["attn_gate"].bytes == 4096 * 16 * 256 * 3 * 2  # read the output and the gate, write: 3 passes


def test_megatrons_flops():
    # gdn_layer_flops: 2·s·(h·(2·2048 + 2·4096 + 64) + 4·(2·2048 + 4096) + 4·32·128² + h·4096), s = 4096
    s, h = 4096, 2048
    want = 2 * s * (h * 12352 + 4 * 8192 + 4 * 32 * 128 * 128 + h * 4096)
    assert F.part_forward_flops(NEXT, "G") == want


def _scenario(model: str, parallel: str) -> str:
    return f"""
name: gdn
cluster: {{nodes: 1, node: dgx-h100}}
model: {{preset: qwen3-next-80b-a3b, layers: 8, hybrid_layer_pattern: GEGEGE*E, experts: 16, top_k: 2{model}}}
training: {{global_batch: 8, micro_batch: 1, attention: flash}}
parallel: {{{parallel}}}
"""


@pytest.mark.parametrize("model,parallel,key,words", [
    # 12 key heads do not split over 8 ranks (GatedDeltaNet divides the heads by the TP size)
    (", linear_num_key_heads: 12, linear_num_value_heads: 36", "tp: 8, dp: 1", "parallel.tp",
     "linear_num_key_heads (12)"),
    ("", "tp: 1, cp: 2, dp: 4", "parallel.cp", "not modelled"),
    (", linear_num_value_heads: 24", "tp: 1, dp: 8", "model.linear_num_value_heads", "multiple of its key heads"),
])
def test_the_rules(model, parallel, key, words):
    with pytest.raises(ScenarioError) as err:
        load_scenario_text(_scenario(model, parallel))
    assert err.value.key == key and words in err.value.message


def test_a_small_model_runs_and_names_its_gdn_layers():
    from emulator.outputs.summary import summarize
    from emulator.run.simulation import simulate

    res = simulate(load_scenario_text(_scenario("", "tp: 2, dp: 4, ep: 4")), record_links=False)
    kinds = summarize(res)["hybrid_layers_s"]
    assert set(kinds) == {"gdn", "attention", "moe"} and kinds["gdn"] > 0
    assert DN.local_dims(replace(Ly.layer_shape(NEXT, 1, t=2), parts="G"))[2] == 16


def test_the_output_gate_is_refused_with_mla():
    text = """
name: gated-mla
cluster: {nodes: 1, node: dgx-h100}
model: {preset: deepseek-v2-lite, attention_output_gate: true}
training: {global_batch: 8, micro_batch: 1, attention: flash}
parallel: {tp: 1, dp: 8, ep: 8}
"""
    with pytest.raises(ScenarioError) as err:
        load_scenario_text(text)
    assert err.value.key == "model.attention_output_gate" and "not modelled" in err.value.message
