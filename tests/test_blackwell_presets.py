"""The qwen3-30b-a3b and gpt-oss-120b presets; GPT-OSS's sliding-window attention and attention sinks."""
import dataclasses

import pytest

from emulator.scenario.catalog import model_preset
from emulator.workload import models as M
from emulator.workload.layer import attention_core_backward, attention_core_forward, layer_shape


def test_preset_shapes_from_the_hf_configs():
    q = model_preset("qwen3-30b-a3b")
    assert (q.layers, q.hidden, q.heads, q.kv_heads, q.head_dim, q.expert_ffn_hidden, q.experts, q.top_k,
            q.vocab) == (48, 2048, 32, 4, 128, 768, 128, 8, 151936)
    g = model_preset("gpt-oss-120b")
    assert (g.layers, g.hidden, g.heads, g.kv_heads, g.head_dim, g.expert_ffn_hidden, g.experts, g.top_k,
            g.vocab) == (36, 2880, 64, 8, 64, 2880, 128, 4, 201088)
    assert (g.sliding_window, g.window_attn_skip_freq, g.softmax_type, g.biases) == (128, 2, "learnable", True)
    # the published sizes: Qwen3-30B-A3B 30.5B total, 3.3B active; GPT-OSS-120B 116.8B total
    assert M.total_params(q) / 1e9 == pytest.approx(30.5, abs=0.05)
    assert M.activated_params(q) / 1e9 == pytest.approx(3.35, abs=0.05)
    assert M.total_params(g) / 1e9 == pytest.approx(116.8, abs=0.05)


def test_sinks_add_one_parameter_per_head_and_layer():
    g = model_preset("gpt-oss-120b")
    plain = dataclasses.replace(g, softmax_type="vanilla")
    assert M.total_params(g) - M.total_params(plain) == 36 * 64


def test_window_attention_flops():
    g = model_preset("gpt-oss-120b")
    L = layer_shape(g, 1, flash=True)
    # half the layers windowed (skip freq 2); a window of 128 over 4096 tokens computes
    # 4096*128 - 128^2/2 = 516,096 pairs of the causal square's 4096^2/2 = 8,388,608
    assert M.window_share(g) == 0.5
    assert L.attended == pytest.approx(0.5 * 516096 / 8388608 + 0.5)
    fwd = [k for k in attention_core_forward(L) if k.name == "attn.flash"][0]
    full = [k for k in attention_core_forward(dataclasses.replace(L, window=0)) if k.name == "attn.flash"][0]
    # 4 b a s^2 d / 2 for the full causal square: 4 * 64 heads * 4096^2 * 64 / 2
    assert full.flops == pytest.approx(4 * 64 * 4096 * 4096 * 64 / 2)
    assert fwd.flops == pytest.approx(full.flops * L.attended)
    assert fwd.n == round(4096 * L.attended)  # the key count a measured table is looked up at


def test_sinks_cost_one_small_kernel_each_way():
    L = layer_shape(model_preset("gpt-oss-120b"), 2, flash=True, t=4)
    fwd = [k for k in attention_core_forward(L) if k.name == "attn.sinks"][0]
    bwd = [k for k in attention_core_backward(L) if k.name == "attn.sinks_bwd"][0]
    # b * heads/t * s = 2 * 16 * 4096 rows, 2 flops each, 2 passes of 2 bytes
    assert fwd.flops == bwd.flops == 2 * 2 * 16 * 4096
    assert fwd.bytes == 2 * 16 * 4096 * 2 * 2
    plain = layer_shape(model_preset("qwen3-30b-a3b"), 2, flash=True)
    assert not [k for k in attention_core_forward(plain) if k.name == "attn.sinks"]


def test_kimi_k2_from_megatron_lms_example():
    # examples/post_training/modelopt/conf/moonshotai/Kimi-K2-Instruct.sh @ d98e8a64dd
    k = model_preset("kimi-k2")
    assert (k.layers, k.hidden, k.heads, k.experts, k.top_k, k.shared_experts, k.first_dense_layers, k.vocab,
            k.q_lora_rank, k.kv_lora_rank) == (61, 7168, 64, 384, 8, 1, 1, 163840, 1536, 512)
    # embedding and head 2 x 163840 x 7168 = 2,348,810,240; a layer's attention 7168·1536 + 1536·64·192 + 7168·576
    # + 512·64·256 + 64·128·7168 = 101,122,048, its norms 1536 + 512 + 2·7168: 101,138,432 x 61 = 6,169,444,352;
    # the dense MLP 3·7168·18432 = 396,361,728; 60 MoE layers of 385 experts (one shared) of 3·7168·2048 = 44,040,192
    # and a router of 7168·384: 60 x 16,958,226,432 = 1,017,493,585,920; the final norm 7168
    assert M.total_params(k) == 2_348_810_240 + 6_169_444_352 + 396_361_728 + 1_017_493_585_920 + 7168
    # activated: 9 of the experts (8 routed and the shared) and the router in each MoE layer
    assert M.activated_params(k) == 2_348_810_240 + 6_169_444_352 + 396_361_728 + 60 * (9 * 44_040_192 + 2_752_512) \
        + 7168
