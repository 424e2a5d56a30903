"""Megatron-Core's latent MoE (``model.moe_latent_size``; Nemotron 3 Super): the projections' kernels and parameters,
the dispatch, the experts and their buffers in the latent width, by hand."""
import json

import pytest

from emulator.cli import main
from emulator.errors import ScenarioError
from emulator.scenario import load_scenario_text
from emulator.scenario.spec import ModelSpec
from emulator.workload import flops as F
from emulator.workload import layer as Ly
from emulator.workload import models as M
from emulator.workload.activations import expert_input_terms, latent_terms

# hidden 4096, 64 experts of 1024 (squared ReLU: two matrices), top 4, latent 1024; 4096 tokens
LATENT = ModelSpec(layers=2, hidden=4096, heads=32, seq_len=4096, vocab=32000, experts=64, top_k=4,
                   expert_ffn_hidden=1024, activation="squared_relu", biases=False, moe_latent_size=1024,
                   moe_permute_fusion=True)


def test_parameters_by_hand():
    # an expert takes and gives 1024-wide rows: 2·1024·1024; the projections 4096 → 1024 and back: 2·4096·1024
    assert M.expert_params(LATENT) == 2_097_152
    assert M.latent_params(LATENT) == 8_388_608
    assert M.expert_linear(LATENT) == 2_097_152
    # an MoE layer: attention 4096·(4096 + 2·4096) + 4096² = 67,108,864, router 4096·64 = 262,144, norms 2·4096,
    # projections 8,388,608, experts 64·2,097,152 = 134,217,728
    assert M.layer_params(LATENT) == 67_108_864 + 262_144 + 8192 + 8_388_608 + 134_217_728


def test_the_dispatch_and_the_experts_in_the_latent_width():
    L = Ly.layer_shape(LATENT, 1, ep=8)
    steps = {st.name: st for st in Ly.forward_steps(L)}
    down, up = steps["moe.latent_down"], steps["moe.latent_up"]
    assert (down.m, down.n, down.k) == (4096, 1024, 4096) and (up.m, up.n, up.k) == (4096, 4096, 1024)
    # 4096 tokens · top 4 = 16,384 copies of 1024 × 2 bytes, plus their fp32 probabilities (16,384 · 4)
    assert steps["moe.dispatch"].bytes == 16_384 * 1024 * 2 + 16_384 * 4
    assert steps["moe.combine"].bytes == 16_384 * 1024 * 2
    # 8 local experts of 2048 rows each, 1024 wide
    assert (steps["moe.up"].m, steps["moe.up"].k, steps["moe.down"].n) == (2048, 1024, 1024)
    # TE's permute reads the 4096 latent rows once and writes the 16,384 copies
    assert steps["moe.permute"].bytes == (16_384 + 4096) * 1024 * 2
    # the projections' own order: down after the routing, before the permutation; up after the unpermute
    names = list(steps)
    assert names.index("moe.router") < names.index("moe.latent_down") < names.index("moe.permute")
    assert names.index("moe.unpermute") < names.index("moe.latent_up")
    back = [st.name for st in Ly.backward_steps(L)]
    assert back.index("moe.latent_up.dgrad") < back.index("moe.unpermute_bwd")
    assert back.index("moe.permute_bwd") < back.index("moe.latent_down.dgrad") < back.index("moe.router.dgrad")


def test_flops_as_megatron_counts_them():
    # routed 2·4096·1024·1024·2 (two matrices) · top 4, projections 2·2·4096·4096·1024, router 2·4096·4096·64
    routed = 2.0 * 4096 * 1024 * 1024 * 2 * 4 + 4.0 * 4096 * 4096 * 1024
    attention = F.layer_forward_flops(ModelSpec(layers=2, hidden=4096, heads=32, seq_len=4096, vocab=32000,
                                                ffn_hidden=1, activation="squared_relu", biases=False))
    dense_mlp = 2.0 * 4096 * 4096 * 1 * 2
    assert F.layer_forward_flops(LATENT) == pytest.approx(attention - dense_mlp + routed + 2.0 * 4096 * 4096 * 64)


def test_stored_bytes():
    # the experts' fc1 input: 4 copies of 1024 at 2 bytes; fc2_latent_proj's input 2·1024; in FP8 (1 byte) fc1_latent_
    # proj's quantised input as well, 4096
    assert expert_input_terms(M.resolve(LATENT), 1, 2.0) == 4 * 2 * 1024
    assert latent_terms(M.resolve(LATENT), 2.0) == 2 * 1024
    assert latent_terms(M.resolve(LATENT), 1.0) == 1024 + 4096


BASE = """name: latent
cluster: {nodes: 2, node: dgx-h100}
model: {layers: 4, hidden: 4096, heads: 32, seq_len: 4096, vocab: 32000, experts: 64, top_k: 4,
        expert_ffn_hidden: 1024, activation: squared_relu, biases: false, moe_permute_fusion: true%s}
training: {global_batch: 16, micro_batch: 1, attention: flash}
parallel: {tp: 1, pp: 1, dp: 16, ep: 16, zero: 1%s}
"""


def _summary(text, tmp_path, capsys):
    path = tmp_path / "latent.yaml"
    path.write_text(text)
    assert main(["run", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_quarter_of_the_bytes_a_quarter_of_the_exchange(tmp_path, capsys):
    """Across two nodes the exchange is bandwidth-bound: latent rows of 1024 move a quarter of the bytes of 4096."""
    full = _summary(BASE % ("", ""), tmp_path, capsys)
    latent = _summary(BASE % (", moe_latent_size: 1024", ""), tmp_path, capsys)
    ratio = latent["moe"]["dispatch_s"] / full["moe"]["dispatch_s"]
    assert 0.2 < ratio < 0.35


def test_hybrideps_buffer_holds_latent_rows():
    from emulator.scenario.hybridep_buffers import buffer_bytes
    from emulator.workload.memory import hybridep_bytes

    sc = load_scenario_text(BASE % (", moe_latent_size: 1024", ", moe_token_dispatcher_type: flex, "
                                                               "moe_flex_dispatcher_backend: hybridep"), "latent.yaml")
    # 4096 tokens a rank, rows of 1024, 4 local experts; 8 ranks of each node's NVLink domain, over two domains
    assert hybridep_bytes(sc.model, sc.parallel, sc.training, 8) == buffer_bytes(4096, 1024, 4, 8, 16)


@pytest.mark.parametrize("model, parallel, key, words", [
    ("", "", "model.moe_latent_size", "needs experts"),
    (", moe_latent_size: 1024, shared_experts: 1", ", moe_shared_expert_overlap: true",
     "parallel.moe_shared_expert_overlap", "not supported with model.moe_latent_size"),
])
def test_refusals(model, parallel, key, words):
    text = BASE % (model, parallel)
    if not model:  # a dense model with a latent size
        text = text.replace("experts: 64, top_k: 4,\n        expert_ffn_hidden: 1024", "moe_latent_size: 1024")
        text = text.replace("ep: 16, ", "")
    with pytest.raises(ScenarioError, match=words) as err:
        load_scenario_text(text, "latent.yaml")
    assert err.value.key == key
