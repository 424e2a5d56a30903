"""FLOPs: generalised per-layer counts equal the closed forms for a plain GPT."""
import pytest

from emulator.scenario import ModelSpec
from emulator.scenario.catalog import model_preset
from emulator.workload import flops as F


@pytest.mark.parametrize("name", ["gpt3-175b", "megatron-1t", "gpt3-125m", "megatron-18b"])
def test_closed_forms(name):
    m = model_preset(name)
    B = 1536
    assert F.model_flops(m, B) == pytest.approx(
        F.gpt_model_flops_closed_form(B, m.seq_len, m.layers, m.hidden, m.vocab), rel=1e-12)
    assert F.hardware_flops(m, B, "full") == pytest.approx(
        F.gpt_full_recompute_flops_closed_form(B, m.seq_len, m.layers, m.hidden, m.vocab), rel=1e-12)


def test_gpt3_175b_value():
    # 72·1536·2048·96·12288²·(1 + 2048/73728 + 50257/14155776)
    # = 3.3415e18 · (1 + 0.0277778 + 0.0035503) = 3.38598e18
    assert F.model_flops(model_preset("gpt3-175b"), 1536) == pytest.approx(3.38598e18, rel=1e-5)


def test_gqa_swiglu_count():
    # l=1, h=8, a=2 (d=4), kv=1, f=16, s=4, V=10, SwiGLU, one sequence:
    # QKV 2·4·8·(8 + 2·1·4) = 1024; attention 4·16·8 = 512; proj 2·4·64 = 512;
    # MLP 2·4·8·16·3 = 3072 → layer 5120; head 2·4·8·10 = 640; model 3·(5120 + 640) = 17280.
    m = ModelSpec(layers=1, hidden=8, heads=2, kv_heads=1, ffn_hidden=16, seq_len=4, vocab=10, swiglu=True)
    assert F.layer_forward_flops(m) == 5120
    assert F.model_flops(m, 1) == 17280


def test_moe_count():
    # as above but dense GeLU f=16, 4 experts, top-2: MLP 2·4·8·16·2 = 2048 per expert,
    # ×2 routed + router 2·4·8·4 = 256 → 4352; QKV (kv = a) 2·4·8·24 = 1536; total
    # 1536 + 512 + 512 + 4352 = 6912.
    m = ModelSpec(layers=1, hidden=8, heads=2, ffn_hidden=16, seq_len=4, vocab=10, experts=4, top_k=2)
    assert F.layer_forward_flops(m) == 6912


def test_recompute_flops():
    # selective adds the attention core per layer and sequence: 4·s²·h = 4·16·8 = 512 per layer.
    m = ModelSpec(layers=3, hidden=8, heads=2, seq_len=4, vocab=10)
    assert F.recompute_flops(m, 2, "selective") == 2 * 3 * 512
    assert F.recompute_flops(m, 2, "selective", fused_attention=True) == 0
    assert F.recompute_flops(m, 2, "none") == 0
