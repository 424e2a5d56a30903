"""Multi-latent attention (DeepSeek-V2/V3): parameter counts, FLOPs, GEMM shapes, TP communication,
activation memory, the rule book and a run."""
import dataclasses

import pytest

from emulator.errors import ScenarioError
from emulator.outputs.summary import summarize
from emulator.run.simulation import simulate
from emulator.scenario import ClusterSpec, ModelSpec, ParallelSpec, Scenario, TrainingSpec, catalog, load_scenario_text
from emulator.workload import flops as F
from emulator.workload import layer as Ly
from emulator.workload import models as M
from emulator.workload.activations import layer_activation_bytes
from emulator.workload.layer import Comm

# h 1024, 8 heads, s 512, query rank 256, key/value rank 128, d_n 64, d_r 32, d_v 64 (d_qk 96), SwiGLU 2048
MLA = ModelSpec(layers=2, hidden=1024, heads=8, seq_len=512, vocab=1000, ffn_hidden=2048, swiglu=True,
                q_lora_rank=256, kv_lora_rank=128, qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64)


def test_attention_parameters():
    # q: 1024·256 + 256 (norm) + 256·8·96 = 459 008; kv: 1024·(128 + 32) + 128 + 128·8·(64 + 64) = 295 040;
    # out: 8·64·1024 = 524 288
    assert M.attention_params(MLA) == 459_008 + 295_040 + 524_288
    assert M.head_dims(MLA) == (96, 64)


def test_deepseek_attention_parameters():
    # V3: q 7168·1536 + 1536 + 1536·128·192 = 48 760 320; kv 7168·576 + 512 + 512·128·256 = 20 906 496;
    # out 128·128·7168 = 117 440 512
    assert M.attention_params(catalog.model_preset("deepseek-v3")) == 187_107_328
    # V2-Lite (no query compression): q 2048·16·192 = 6 291 456; kv 2048·576 + 512 + 512·16·256 = 3 277 312;
    # out 16·128·2048 = 4 194 304
    assert M.attention_params(catalog.model_preset("deepseek-v2-lite")) == 13_763_072


def test_layer_flops():
    # projections 2·s·(459 008 − 256 + 295 040 − 128 + 524 288) = 2·512·1 277 952 = 1 308 622 848
    # core 2·s²·a·(96 + 64) = 2·262 144·8·160 = 671 088 640; MLP 2·s·h·2048·3 = 6 442 450 944
    assert F.layer_forward_flops(MLA) == 1_308_622_848 + 671_088_640 + 6_442_450_944
    assert F.attention_core_flops(MLA) == 671_088_640


def test_deepseek_v3_moe_layer_flops_are_two_flops_per_activated_weight():
    m = catalog.model_preset("deepseek-v3")
    s = 4096
    # per token, the activated matmul weights: MLA 187 107 328 − norms 2 048 = 187 105 280, 8 routed + 1 shared
    # experts 9·44 040 192 = 396 361 728, router 1 835 008; core 2·s·128·(192 + 128) per token
    per_token = 2 * (187_105_280 + 396_361_728 + 1_835_008) + 2 * s * 128 * 320
    assert F.layer_forward_flops(m, 3) == s * per_token == 6_169_183_649_792


def _by_name(steps):
    return {st.name: st for st in steps}


def test_gemm_shapes():
    k = _by_name(Ly.forward_steps(Ly.layer_shape(MLA, 1)))
    shape = {n: (k[n].m, k[n].n, k[n].k) for n in ("q_down", "q_up", "kv_down", "kv_up", "proj")}
    assert shape == {"q_down": (512, 256, 1024), "q_up": (512, 8 * 96, 256), "kv_down": (512, 128 + 32, 1024),
                     "kv_up": (512, 8 * (64 + 64), 128), "proj": (512, 1024, 8 * 64)}
    assert (k["attn.qk"].k, k["attn.pv"].n, k["attn.qk"].batch) == (96, 64, 8)  # d_qk, d_v, b·a
    assert "qkv" not in k
    assert k["rope"].bytes == 2 * 512 * (8 + 1) * 32 * 2  # 2 passes over 8 query heads + 1 shared key, d_r 32


def test_tensor_parallel_shards_the_up_projections_only():
    L = Ly.layer_shape(MLA, 1, t=2)
    k = _by_name(Ly.forward_steps(L))
    assert k["q_down"].n == 256 and k["kv_down"].n == 160  # replicated
    assert k["q_up"].n == 4 * 96 and k["kv_up"].n == 4 * 128 and k["proj"].k == 4 * 64
    f = _by_name(Ly.forward_steps(L))
    assert not [st for st in f.values() if isinstance(st, Comm) and st.collective == "all_gather"]  # no SP
    b = _by_name(Ly.backward_steps(L))
    # the up projections' input gradients are all-reduced: T·r·2 bytes, kv with the rope key (shared by
    # the heads that TP splits): 512·(128 + 32)·2
    assert b["kv_up.ar_dgrad"].bytes == 512 * 160 * 2
    assert b["q_up.ar_dgrad"].bytes == 512 * 256 * 2


def test_sequence_parallel_gathers_the_latents_not_the_hidden_states():
    L = Ly.layer_shape(MLA, 1, t=2, sp=True)
    f = _by_name(Ly.forward_steps(L))
    # the down projections run on the 256 tokens of this rank; the up projections gather the latents
    assert (f["q_down"].m, f["kv_down"].m, f["q_up"].m, f["kv_up"].m) == (256, 256, 512, 512)
    assert f["q_up.ag"].bytes == 512 * 256 * 2 and f["kv_up.ag"].bytes == 512 * 160 * 2
    assert "ln1.ag" not in f  # Megatron's MLA gathers T·(r_q + r_kv + d_r) = 512·416, not T·h = 512·1024
    b = _by_name(Ly.backward_steps(L))
    assert b["q_up.rs_dgrad"].bytes == 512 * 256 * 2 and b["kv_up.ag_input"].bytes == 512 * 160 * 2
    assert b["q_down.dgrad"].m == 256


def test_flash_kernel_at_the_mean_head_dim():
    L = Ly.layer_shape(MLA, 1, flash=True)
    k = _by_name(Ly.forward_steps(L))["attn.flash"]
    # 2·(b·a)·s²·(d_qk + d_v), halved for the causal mask: 2·8·512²·160/2
    assert k.flops == 2 * 8 * 512 * 512 * 160 / 2
    assert k.head_dim == 80


def test_activation_memory():
    # per token, 2-byte elements, t 1, no dropout, flash: replicated 2·2h + 2h + latents 2·(2·256 + 2·128 + 32)
    # + 2h (MLP input) = 4096 + 2048 + 1600 + 2048 = 9 792; Q, K 2·2·8·96 = 3 072, V and projection input
    # 2·2·8·64 = 2 048; MLP 2·2·2048 + 2·2048 = 12 288 → 27 200 per token
    assert layer_activation_bytes(MLA, 1, 512, flash=True) == 512 * 27_200


def test_run_counts_model_flops():
    node = catalog.node("dgx-h100")
    sc = Scenario(name="t", cluster=ClusterSpec(nodes=1, node=node), model=MLA,
                  training=TrainingSpec(global_batch=8, micro_batch=1, attention="flash"),
                  parallel=ParallelSpec(tp=2, dp=4, sequence_parallel=True))
    out = summarize(simulate(sc, record_links=False))
    # 3·B·(2 layers + head 2·s·h·1000) / 8 GPUs, the layer 8 422 162 432 (test_layer_flops)
    expected = 3 * 8 * (2 * 8_422_162_432 + 2 * 512 * 1024 * 1000) / 8
    assert out["model_tflops_per_gpu"] * 1e12 * out["iteration_time_s"] == pytest.approx(expected, rel=1e-9)
    mha = summarize(simulate(dataclasses.replace(sc, model=dataclasses.replace(
        MLA, q_lora_rank=0, kv_lora_rank=0, qk_nope_head_dim=0, qk_rope_head_dim=0, v_head_dim=0)),
        record_links=False))
    assert mha["iteration_time_s"] != out["iteration_time_s"]


HEAD = ("name: x\ncluster:\n  nodes: 1\n  node: dgx-h100\ntraining:\n  global_batch: 8\n"
        "model:\n  layers: 4\n  hidden: 1024\n  heads: 8\n  seq_len: 512\n  vocab: 1000\n")


@pytest.mark.parametrize("extra,message", [
    ("  q_lora_rank: 64\n", "x.yaml:13: model.q_lora_rank: q_lora_rank (64) needs kv_lora_rank > 0 "
                            "(multi-latent attention)"),
    ("  kv_lora_rank: 64\n  kv_heads: 4\n", "x.yaml:14: model.kv_heads: multi-latent attention has one key/value "
                                            "head per query head: kv_heads (4) must be 0 or heads (8)"),
    ("  v_head_dim: -1\n", "x.yaml:13: model.v_head_dim: expected an integer from 0 to 100000, got -1"),
])
def test_rule_book(extra, message):
    with pytest.raises(ScenarioError) as info:
        load_scenario_text(HEAD + extra, "x.yaml")
    assert str(info.value) == message


def test_the_down_projections_are_whole_on_every_tensor_parallel_rank():
    """Megatron-Core builds MLA's linear_q_down_proj and linear_kv_down_proj "duplicated" over TP: each rank holds
    them whole, with their latent norms, and splits the rest of the attention."""
    from emulator.workload.memory import _stage_params

    v3 = catalog.model_preset("deepseek-v3")
    # q_down 7168·1536 and its norm 1536, kv_down 7168·(512 + 64) and its norm 512
    assert M.replicated_attention_params(v3) == 7168 * 1536 + 1536 + 7168 * 576 + 512 == 15_140_864
    m = ModelSpec(layers=2, hidden=1024, heads=8, seq_len=1024, vocab=32000, q_lora_rank=256, kv_lora_rank=128,
                  qk_rope_head_dim=32, qk_nope_head_dim=64, v_head_dim=64, swiglu=True)
    one, two = (Scenario(name="mla", cluster=ClusterSpec(nodes=1, node=catalog.node("dgx-h100")), model=m,
                         training=TrainingSpec(global_batch=8), parallel=ParallelSpec(tp=t, dp=8 // t))
                for t in (1, 2))
    rep = M.replicated_attention_params(m)  # 1024·256 + 256 + 1024·160 + 128
    assert rep == 426_368
    # TP 2 halves all but the replicated weights, the norms, and with pp 1 nothing else: the embedding and the
    # head are split too
    split = 2 * (M.attention_params(m) - rep + M.mlp_params(m)) + 2 * 32000 * 1024
    assert _stage_params(m, one, 0, 2)[0] - _stage_params(m, two, 0, 2)[0] == pytest.approx(split / 2)
