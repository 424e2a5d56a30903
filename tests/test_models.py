"""Model presets (the model catalog) and parameter counts."""
import dataclasses

import pytest

from emulator.errors import CatalogError, EmulatorError
from emulator.scenario import catalog
from emulator.scenario.rules import model_violations
from emulator.workload import models as M


def test_names_and_presets():
    names = catalog.model_names()
    for n in ["gpt3-125m", "gpt3-175b", "megatron-1.7b", "megatron-1t", "llama2-70b", "llama3-405b",
              "mixtral-8x7b", "bert-large"]:
        assert n in names
    m = catalog.model_preset("Megatron-530B")
    assert (m.layers, m.hidden, m.heads, m.seq_len, m.vocab) == (105, 20480, 128, 2048, 51200)
    assert m.ffn_hidden == 4 * 20480  # ffn 0 → 4h
    l3 = catalog.model_preset("llama3-70b")
    assert (l3.kv_heads, l3.ffn_hidden, l3.vocab, l3.swiglu) == (8, 28672, 128256, True)
    mx = catalog.model_preset("mixtral-8x7b")
    assert (mx.experts, mx.top_k) == (8, 2)


def test_unknown_name():
    with pytest.raises(CatalogError, match='did you mean "llama3-70b"'):
        catalog.model_preset("llama3-70")
    with pytest.raises(EmulatorError):
        catalog.model_preset("nope")


def test_param_counts():
    # llama2-7b: per layer 4·4096² (QKV + proj, MHA) + 3·4096·11008 (SwiGLU) + 2·4096 (RMSNorm)
    # = 67 108 864 + 135 266 304 + 8192 = 202 383 360; ×32 = 6 476 267 520;
    # embedding 32000·4096 = 131 072 000; head 131 072 000 + 4096 → 6 738 415 616.
    assert M.total_params(catalog.model_preset("llama2-7b")) == 6_738_415_616
    # gpt3-125m (tied): layer 12h² + 13h = 7 077 888 + 9 984 = 7 087 872; ×12 = 85 054 464;
    # embedding 50257·768 + 2048·768 = 38 597 376 + 1 572 864 = 40 170 240; final layernorm 1536
    # → 85 054 464 + 40 170 240 + 1536 = 125 226 240.
    assert M.total_params(catalog.model_preset("gpt3-125m")) == 125_226_240
    assert M.total_params(catalog.model_preset("llama3-70b")) / 1e9 == pytest.approx(70.55, abs=0.01)
    assert M.total_params(catalog.model_preset("mixtral-8x7b")) / 1e9 == pytest.approx(46.70, abs=0.01)


def test_override_and_checks():
    m = dataclasses.replace(catalog.model_preset("gpt3-125m"), layers=2, hidden=512, heads=8)
    assert M.resolve(dataclasses.replace(m, ffn_hidden=0)).ffn_hidden == 2048
    # 512 % 7 = 1, and the preset's 12 KV heads (filled in from its 12 heads) do not divide 7:
    # the rule book names both keys and says why
    assert [(v.key, v.message) for v in model_violations(dataclasses.replace(m, heads=7))] == \
        [("model.heads", "hidden (512) must be divisible by heads (7), or model.head_dim be given"),
         ("model.kv_heads", "kv_heads (12) must divide heads (7)")]
    assert M.padded_vocab(50257, 8) == 51200  # Megatron: multiple of 128·8 = 1024


def test_nemotron_presets_count_no_biases():
    # Nemotron-4 340B: per layer QKV h·(h + 2·8·192) = 18 432·21 504 = 396 361 728, proj h² = 339 738 624,
    # MLP 2·h·4h = 2 717 908 992 (squared ReLU: two matrices, no biases), two LayerNorms of gain and shift
    # 4h = 73 728 (NeMo's NemotronConfig: normalization "LayerNorm") → 3 454 083 072; ×96 = 331 591 974 912;
    # + embedding and untied head 2·256 000·h = 9 437 184 000 + final LayerNorm 2h = 36 864
    # → 341 029 195 776 (the report's "340B"; RMS gains would give 3 558 528 fewer)
    m = catalog.model_preset("nemotron4-340b")
    assert m.norm == "layernorm" and not M.has_biases(m) and M.has_norm_shift(m)
    assert M.mlp_params(m) == 2_717_908_992
    assert M.layer_params(m) == 3_454_083_072
    assert M.total_params(m) == 341_029_195_776
    # Nemotron-4 15B: 32 layers of h 6144 (48 heads, 8 KV) → per layer 6144·(6144 + 2048) + 6144²
    # + 2·6144·24 576 + 4·6144 = 50 331 648 + 37 748 736 + 301 989 888 + 24 576 = 390 094 848;
    # ×32 = 12 483 035 136; + 2·256 000·6144 + 2·6144 = 3 145 740 288 → 15 628 775 424
    assert M.total_params(catalog.model_preset("nemotron4-15b")) == 15_628_775_424


def test_norm_key_overrides_the_biases_default():
    from emulator.scenario import ModelSpec

    # GPT-style (biases, layernorm) forced to RMSNorm: norms h each, so 2h per layer and h at the end
    gpt = ModelSpec(layers=1, hidden=64, heads=4, seq_len=8, vocab=16)
    assert M.norm_params(gpt) == 4 * 64 and M.norm_params(ModelSpec(**{**gpt.__dict__, "norm": "rmsnorm"})) == 2 * 64
    # Llama-style (swiglu, no biases) defaults to RMSNorm
    assert M.resolve(ModelSpec(layers=1, hidden=64, heads=4, seq_len=8, vocab=16, swiglu=True)).norm == "rmsnorm"


def test_squared_relu_kernels():
    from emulator.workload import layer as Ly

    m = catalog.model_preset("nemotron4-15b")
    L = Ly.layer_shape(m, micro_batch=1, t=8)
    fwd = {k.name: k for k in Ly.kernels(Ly.forward_steps(L))}
    bwd = {k.name: k for k in Ly.kernels(Ly.backward_steps(L))}
    assert "squared_relu" in fwd and "gelu" not in fwd and "swiglu" not in fwd
    assert "squared_relu_bwd" in bwd
    # T·f/t = 4096·3072 = 12 582 912 elements: forward reads and writes them (2 passes of 2 B),
    # 2 FLOPs each (max, square); backward 3 passes (no bias gradient), 3 FLOPs each
    assert fwd["squared_relu"].bytes == 2 * 2 * 12_582_912 and fwd["squared_relu"].flops == 2 * 12_582_912
    assert bwd["squared_relu_bwd"].bytes == 3 * 2 * 12_582_912 and bwd["squared_relu_bwd"].flops == 3 * 12_582_912
    # the up GEMM is not gated: n = f/t = 3072 (SwiGLU would make it 6144)
    assert fwd["mlp.up"].n == 3072
    # no dropout: no bias-dropout-add mask, no attention dropout
    assert not any("dropout" in name for name in fwd)


def test_activation_contradicting_swiglu_is_refused():
    m = dataclasses.replace(catalog.model_preset("llama2-7b"), activation="gelu")
    assert [v.key for v in model_violations(m)] == ["model.activation"]
