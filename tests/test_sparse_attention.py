"""DeepSeek Sparse Attention (``model.experimental_attention_variant: dsa``; DeepSeek-V3.2, GLM-5): the indexer's
parameters and kernels, the sparse core over each query's top-k keys, context parallelism by all-gather, the
indexer's loss, the model FLOPs, and Megatron-Core's rules, by hand."""
from dataclasses import replace

import pytest

from emulator.errors import ScenarioError
from emulator.scenario import load_scenario_text
from emulator.scenario.catalog import model_preset
from emulator.scenario.spec import ParallelSpec
from emulator.workload import flops as F
from emulator.workload import layer as Ly
from emulator.workload import models as M
from emulator.workload import sparse_attention as SA


def _steps(model, t=1, cp=1, seq=4096, backward=False):
    m = replace(model, seq_len=seq)
    par = ParallelSpec(tp=t, cp=cp, cp_comm_type="all_gather" if cp > 1 else "p2p")
    L = Ly.layer_shape(m, 1, t=t, sp=t > 1, cp=cp, flash=True, parallel=par)
    steps = Ly.backward_steps(L) if backward else Ly.forward_steps(L)
    return {st.name: st for st in steps}


def test_glm5_has_the_verification_cards_bytes():
    # GLM-5's 78 layers hold 1,487,822,475,264 bytes (Megatron-Bridge's verification card): every tensor in BF16
    # but the 75 MoE layers' router biases of 256 (e_score_correction_bias, fp32), which the emulator does not
    # count: 2 · P + 4 · 75 · 256 = 2 · 743,911,199,232 + 76,800
    glm = replace(model_preset("glm-5"), mtp_num_layers=0)
    assert M.total_params(glm) == 743_911_199_232
    assert 2 * M.total_params(glm) + 4 * 75 * 256 == 1_487_822_475_264


def test_the_indexer_parameters_by_hand():
    # DeepSeek-V3.2: linear_wq_b 1536 · 64 · 128 = 12,582,912, linear_wk 7168 · 128 = 917,504, k_norm 2 · 128,
    # linear_weights_proj 7168 · 64 = 458,752
    v32 = model_preset("deepseek-v3.2")
    assert M.indexer_params(v32) == 12_582_912 + 917_504 + 256 + 458_752
    # the indexer adds 61 of them to DeepSeek-V3's 671,026,404,352
    assert M.total_params(v32) - M.total_params(model_preset("deepseek-v3")) == 61 * 13_959_424


def test_the_keys_a_query_attends():
    assert SA.mean_topk(131072, 2048) == 2048 - 2048 * 2048 / (2 * 131072) == 2032  # query i: min(i + 1, k)
    assert SA.mean_topk(4096, 2048) == 1536
    assert SA.mean_topk(1024, 2048) == 512  # the whole causal sequence: S/2
    assert SA.padded_heads(16) == 64 and SA.padded_heads(128) == 128


def test_the_absorbed_projections_replace_kv_up():
    steps = _steps(model_preset("deepseek-v3.2"), t=2)
    assert "kv_up" not in steps
    # the query's non-rope part times W_uk, per head: 4096 × 512 × 128, 64 heads; the latent output times W_uv:
    # 4096 × 128 × 512
    qa, vu = steps["q_absorb"], steps["v_up"]
    assert (qa.m, qa.n, qa.k, qa.batch) == (4096, 512, 128, 64)
    assert (vu.m, vu.n, vu.k, vu.batch) == (4096, 128, 512, 64)
    # the indexer's linears run on all 4096 tokens (replicated over TP), after SP gathers of x and the q latent
    assert steps["attn.indexer.ag_x"].bytes == 4096 * 7168 * 2
    assert steps["attn.indexer.ag_qr"].bytes == 4096 * 1536 * 2
    wq = steps["attn.indexer.wq_b"]
    assert (wq.m, wq.n, wq.k) == (4096, 64 * 128, 1536)


def test_the_sparse_core_by_hand():
    steps = _steps(model_preset("deepseek-v3.2"), t=2)
    # 4096 tokens, 64 heads, 1536 keys a query on average, 2·(576 + 512) FLOPs a (query, key, head)
    assert steps["attn.sparse"].flops == 2 * 4096 * 64 * 1536 * (576 + 512) == 876_173_328_384
    # the indexer's scores: 4096 queries · 2048 keys on average · 64 heads · (2 · 128 + 3)
    assert steps["attn.indexer.scores"].flops == 4096 * 2048 * 64 * (2 * 128 + 3)
    # FlashMLA pads 16 local heads (TP 8) to 64: the same FLOPs as TP 2's 64
    assert _steps(model_preset("deepseek-v3.2"), t=8)["attn.sparse"].flops == steps["attn.sparse"].flops


def test_context_parallelism_gathers_the_latent_key():
    glm = model_preset("glm-5")
    fwd = _steps(glm, cp=32, seq=131072)
    # 32 ranks · 4096 tokens · (512 + 64) dims · 2 bytes; the indexer's key of 128 dims likewise
    assert fwd["attn.kv_ag"].bytes == 32 * 4096 * 576 * 2 == 150_994_944
    assert fwd["attn.indexer.k_ag"].bytes == 32 * 4096 * 128 * 2
    bwd = _steps(glm, cp=32, seq=131072, backward=True)
    assert bwd["attn.dkv_rs"].bytes == fwd["attn.kv_ag"].bytes
    assert bwd["attn.indexer.dk_rs"].bytes == fwd["attn.indexer.k_ag"].bytes


def test_the_indexer_loss():
    glm = model_preset("glm-5")  # the sparse loss
    fwd = _steps(glm, cp=32, seq=131072)
    # the target over each query's top-k: 4096 queries · 2032 keys · 64 heads · 2 · 576
    assert fwd["attn.indexer_loss"].flops == 2 * 4096 * 64 * 2032 * 576
    dense = _steps(replace(glm, dsa_indexer_use_sparse_loss=False), cp=32, seq=131072)
    # the dense target: every key a query may attend, 65,536 on average
    assert dense["attn.indexer_loss"].flops == 2 * 4096 * 64 * 65536 * 576
    bwd = _steps(glm, cp=32, seq=131072, backward=True)
    assert bwd["attn.indexer_bwd"].flops == 3 * 2 * 4096 * 2032 * 32 * 128
    # without the loss the indexer runs under no_grad: no target, no backward of its own
    off = replace(glm, dsa_indexer_loss_coeff=0.0)
    assert "attn.indexer_loss" not in _steps(off, cp=32, seq=131072)
    assert not [n for n in _steps(off, cp=32, seq=131072, backward=True) if n.startswith("attn.indexer")]


def test_the_model_flops_by_hand():
    v32 = model_preset("deepseek-v3.2")
    # against DeepSeek-V3's layer: the dense core 2·s²·a·(192 + 128) gives way to the indexer's scores
    # 2·s²·64·128 and the core over 2048 keys 2·s·2048·a·(2·512 + 64); the indexer's linears add
    # 2·s·(1536·64·128 + 7168·(128 + 64))
    s, a = 4096, 128
    diff = (2 * s * s * 64 * 128 + 2 * s * 2048 * a * 1088 + 2 * s * (1536 * 64 * 128 + 7168 * 192)
            - 2 * s * s * a * 320)
    assert F.layer_forward_flops(v32) - F.layer_forward_flops(model_preset("deepseek-v3")) == pytest.approx(diff)


def _scenario(model: str, parallel: str, training: str = "attention: flash") -> str:
    return f"""
name: dsa
cluster: {{nodes: 4, node: dgx-h100}}
model: {{preset: deepseek-v3.2, layers: 4, first_dense_layers: 1, experts: 32, mtp_num_layers: 0{model}}}
training: {{global_batch: 32, micro_batch: 1, {training}}}
parallel: {{{parallel}}}
"""


@pytest.mark.parametrize("model,parallel,training,key,words", [
    (", kv_lora_rank: 0, q_lora_rank: 0, qk_rope_head_dim: 0, qk_nope_head_dim: 0, v_head_dim: 0", "tp: 1, dp: 32",
     "attention: flash", "model.experimental_attention_variant", "Currently only MLA supports sparse attention"),
    ("", "tp: 1, cp: 4, dp: 8", "attention: flash", "parallel.cp_comm_type", "cp_comm_type=allgather only"),
    ("", "tp: 1, dp: 32", "attention: unfused", "training.attention", "set attention: flash"),
    (", heads: 96, kv_heads: 96, head_dim: 128", "tp: 2, dp: 16", "attention: flash", "parallel.tp", "FlashMLA"),
])
def test_megatron_cores_rules(model, parallel, training, key, words):
    with pytest.raises(ScenarioError) as err:
        load_scenario_text(_scenario(model, parallel, training))
    assert err.value.key == key and words in err.value.message


def test_the_indexer_keys_need_the_variant():
    text = _scenario("", "tp: 1, dp: 32").replace("deepseek-v3.2", "deepseek-v3") + "\n"
    text = text.replace("mtp_num_layers: 0", "mtp_num_layers: 0, dsa_indexer_topk: 2048")
    with pytest.raises(ScenarioError) as err:
        load_scenario_text(text)
    assert err.value.key == "model.dsa_indexer_topk"
    assert "needs experimental_attention_variant: dsa" in err.value.message


def test_a_small_dsa_model_runs():
    from emulator.run.simulation import simulate

    par = "tp: 2, cp: 2, dp: 8, ep: 8, sequence_parallel: true, cp_comm_type: all_gather"
    sparse = simulate(load_scenario_text(_scenario("", par)), record_links=False)
    dense = simulate(load_scenario_text(_scenario("", par).replace("deepseek-v3.2", "deepseek-v3")),
                     record_links=False)
    # at 4096 tokens the sparse core is the dearer one: a query attends 1536 keys on average at 2·(576 + 512)
    # FLOPs a head against the dense core's 2048 at 2·(192 + 128), and the indexer comes on top
    assert sparse.iteration_time_s > dense.iteration_time_s > 0


def test_top_k_sharing_skips_the_indexer_of_the_layers_between():
    from emulator.scenario.sparse_attention_rules import skips_topk

    # Megatron-Core's is_dsa_skip_topk_layer: every 2nd layer from layer 1 computes (the offset 0 counts as 1);
    # from offset 3, layers 1-3 and then every 2nd from 3 compute
    assert [n for n in range(1, 9) if skips_topk(n, 0, 2)] == [2, 4, 6, 8]
    assert [n for n in range(1, 9) if skips_topk(n, 3, 2)] == [4, 6, 8]
    assert not any(skips_topk(n, 0, 1) for n in range(1, 9))
    glm = replace(model_preset("glm-5"), dsa_indexer_topk_freq=2)
    # 39 of GLM-5's 78 layers hold no indexer: 2048·32·128 + 6144·128 + 2·128 + 6144·32 = 9,371,904 each; the MTP
    # module numbers its layer 1: it computes
    assert M.indexer_params(glm) == 9_371_904
    assert M.total_params(model_preset("glm-5")) - M.total_params(glm) == 39 * 9_371_904
    assert not M.dsa_skips(glm, glm.layers + 1)
    # nor its GEMM weights, which fp8 stores and gathers: the indexer's 2048·32·128 + 6144·128 + 6144·32 = 9,371,648
    # (its k_norm is no GEMM's)
    r = M.resolve(glm)
    assert M.linear_weights(r)[0] - M.linear_weights(r, 1)[0] == 9_371_648  # layer 2 (0-based 1) reuses layer 1's
    assert M.linear_weights(r, 0)[0] == M.linear_weights(r)[0]


def test_a_skip_layer_runs_only_the_sparse_core():
    v32 = replace(model_preset("deepseek-v3.2"), dsa_indexer_topk_freq=2)
    L = Ly.layer_shape(v32, 1, flash=True)
    skip, compute = Ly.attention_shape(L, v32, 3), Ly.attention_shape(L, v32, 4)  # layers 4 and 5
    names = [st.name for st in Ly.forward_steps(skip) + Ly.backward_steps(skip)]
    assert "attn.sparse" in names and "attn.sparse_bwd" in names
    assert not [n for n in names if n.startswith("attn.indexer")]
    assert "attn.indexer.scores" in [st.name for st in Ly.forward_steps(compute)]
    # its FLOPs lose the indexer's scores 2·4096²·64·128 and linears 2·4096·(1536·64·128 + 7168·128 + 7168·64)
    assert F.layer_forward_flops(v32, 4) - F.layer_forward_flops(v32, 3) == pytest.approx(
        274_877_906_944 + 114_353_504_256)


def test_top_k_sharing_stays_within_a_pipeline_stage():
    # two stages of 2 layers: the second starts at layer 3, which computes at N = 2 ((3 − 1) % 2 = 0) and reuses
    # layer 1's top-k at N = 3
    ok = _scenario(", dsa_indexer_topk_freq: 2", "tp: 1, pp: 2, dp: 16")
    assert load_scenario_text(ok).model.dsa_indexer_topk_freq == 2
    with pytest.raises(ScenarioError) as err:
        load_scenario_text(_scenario(", dsa_indexer_topk_freq: 3", "tp: 1, pp: 2, dp: 16"))
    assert err.value.key == "model.dsa_indexer_topk_freq" and "layer 3 reuses the top-k of layer 1" in err.value.message


def test_a_layer_that_shares_the_top_k_keeps_no_indexer_tensors():
    from emulator.scenario import load_scenario
    from emulator.workload import activations as A

    sc = load_scenario("scenarios/glm-5-192-gb200.yaml", ["model.dsa_indexer_topk_freq=2", "training.recompute=none"])
    m = M.resolve(sc.model)
    assert [M.dsa_skips(m, i) for i in (4, 5)] == [False, True]
    own, shared = (A.scenario_layer_bytes(sc, m, True, layer=i) for i in (4, 5))
    # 131,072 tokens over CP 32: 4096 a rank, BF16, TP 1: 4096 B per per-token byte. The sharing layer keeps no top-k
    # indices, 4·2048 = 8192, and no indexer q, weights and k for the indexer loss, 2·(32·128 + 32 + 128) = 8512:
    # 16,704 B a token, 68,419,584 B
    assert own - shared == 16_704 * 4096
    assert A.differing_layer_bytes(sc, m, [4, 5], (0.0, 0.0)) == (own + shared) / 2
