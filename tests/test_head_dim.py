"""model.head_dim: per-head dims decoupled from hidden/heads (Qwen3), for standard attention."""
import dataclasses

from emulator.scenario import catalog
from emulator.scenario.rules import model_violations
from emulator.workload import flops as F
from emulator.workload import layer as Ly
from emulator.workload import models as M
from emulator.workload.activations import layer_activation_bytes

QWEN3 = catalog.model_preset("qwen3-235b-a22b")


def test_qwen3_preset_is_the_published_shape():
    # NeMo Qwen3Config235B_A22B / Qwen3 Technical Report Table 2 (catalog.py)
    m = QWEN3
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.head_dim) == (94, 4096, 64, 4, 128)
    assert (m.experts, m.top_k, m.expert_ffn_hidden, m.vocab, m.shared_experts) == (128, 8, 1536, 151936, 0)
    assert (m.swiglu, m.biases, m.norm, m.tied_embeddings) == (True, False, "rmsnorm", False)
    # "235B-A22B": 235.09B parameters, 22.19B activated by our count
    assert round(M.total_params(m) / 1e9, 2) == 235.09 and round(M.activated_params(m) / 1e9, 2) == 22.19


def test_attention_weights_use_head_dim():
    # QKV h·(a·d + 2·kv·d) = 4096·(64·128 + 2·4·128) = 4096·9216 = 37 748 736;
    # output a·d·h = 8192·4096 = 33 554 432; no biases → 71 303 168
    assert M.attention_params(QWEN3) == 71_303_168
    # without head_dim, d = 4096/64 = 64: 4096·(4096 + 512) + 4096² = 18 874 368 + 16 777 216
    assert M.attention_params(dataclasses.replace(QWEN3, head_dim=0)) == 35_651_584


def test_gemm_shapes_use_head_dim():
    # tp 4: 16 query heads and 1 KV head per GPU; QKV T×h → T×(16 + 2·1)·128 = 2304, projection k = 16·128
    L = Ly.layer_shape(QWEN3, 1, t=4, sp=True, flash=True)
    steps = {k.name: k for k in Ly.kernels(Ly.forward_steps(L))}
    assert (steps["qkv"].m, steps["qkv"].n, steps["qkv"].k) == (4096, 2304, 4096)
    assert (steps["proj"].m, steps["proj"].n, steps["proj"].k) == (4096, 4096, 2048)
    # the fused attention runs on d = 128: 4·b·a_l·s²·d·½ (causal) = 4·16·4096²·128/2 FLOPs
    assert steps["attn.flash"].head_dim == 128
    assert steps["attn.flash"].flops == 4 * 16 * 4096 * 4096 * 128 / 2


def test_flops_use_head_dim():
    s = 4096
    # core 4·s²·a·d = 4·4096²·8192; projections 2·s·h·(a·d + 2·kv·d) + 2·s·a·d·h = 2·4096·4096·(9216 + 8192)
    assert F.attention_core_flops(QWEN3) == 4 * s * s * 8192
    assert F._projection_flops(QWEN3) == 2 * s * 4096 * 17408
    # a layer: attention + router 2·s·h·E + 8 experts of 3 matrices 2·s·h·1536·3
    layer = 4 * s * s * 8192 + 2 * s * 4096 * 17408 + 2 * s * 4096 * 128 + 8 * 2 * s * 4096 * 1536 * 3
    assert F.layer_forward_flops(QWEN3) == layer


def test_kv_and_attention_activations_use_head_dim():
    # One Qwen3 layer, b 1, s 4096, tp 4 with SP, flash, selective: per token, in bytes
    # replicated: 2 norm inputs 4h, QKV input 2h, MLP input 2h = 8h = 32 768
    # attention: Q 2·a·d = 16 384, K and V 2·2·kv·d = 2 048, projection input 2·a·d = 16 384 → 34 816
    #   (a·d = 8192 where h = 4096: without head_dim Q and the projection input would be 2h each)
    # experts: top-8 copies of (SwiGLU up outputs 2·2·1536 + its output 2·1536 + the fc1 input 2·4096 = 17 408)
    # = 139 264
    # all sharded by t with SP: 4096·(32 768 + 34 816 + 139 264)/4 = 211 812 352 B
    assert layer_activation_bytes(QWEN3, 1, 4096, 4, True, "selective", flash=True) == 211_812_352


def test_head_dim_frees_hidden_from_heads():
    # 4096 is not divisible by 48 heads: refused without head_dim, accepted with it
    odd = dataclasses.replace(QWEN3, heads=48, kv_heads=4)
    assert [v.key for v in model_violations(odd)] == []
    assert [v.key for v in model_violations(dataclasses.replace(odd, head_dim=0))] == ["model.heads"]
