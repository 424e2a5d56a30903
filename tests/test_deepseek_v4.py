"""DeepSeek-V4 (``model.experimental_attention_variant: dsv4_hybrid``) and mHC (``model.enable_mhc_connections``):
the parameters, each compression ratio's kernels, the hyper-connections' kernels, the model FLOPs as Megatron-Bridge
counts them, the memory terms, the pipeline's wider sends and the rules, by hand."""
from dataclasses import replace

import pytest

from emulator.errors import ScenarioError
from emulator.scenario import load_scenario_text
from emulator.scenario.catalog import model_preset
from emulator.workload import activations as A
from emulator.workload import compressed_attention as CA
from emulator.workload import flops as F
from emulator.workload import hyper_connection as HC
from emulator.workload import layer as Ly
from emulator.workload import models as M
from emulator.workload.recompute import backward_with_modules

FLASH = model_preset("deepseek-v4-flash")


def _shape(ratio: int, **model):
    L = Ly.layer_shape(replace(FLASH, **model), 1, flash=True)
    return replace(L, csa=ratio)


def _named(steps):
    return {st.name: st for st in steps}


def test_the_attention_parameters_by_hand():
    # h 4096, 64 heads of D 512, r_q 1024, 8 groups of 1024: q_a 4096·1024 + its norm 1024 + q_b 1024·64·512
    # + kv_proj 4096·512 + its norm 512 + o_a 64·512·1024 + o_b 8·1024·4096 + the sinks 64
    base = 4_194_304 + 1_024 + 33_554_432 + 2_097_152 + 512 + 33_554_432 + 33_554_432 + 64
    assert M.dsv4_attention_params(FLASH, 0) == base == 106_956_352
    # HCA's compressor: kv_proj and gate_proj 4096·512 each, a position bias 128·512, its norm 512
    assert M.dsv4_attention_params(FLASH, 128) == base + 4_194_304 + 65_536 + 512
    # CSA's: 4096·1024 each, a bias 4·1024, a norm 512; the indexer's compressor 4096·256 each, a bias 4·256, a norm
    # 128, its q_b 1024·64·128 and weights_proj 4096·64
    indexer = 2_097_152 + 1_024 + 128 + 8_388_608 + 262_144
    assert M.dsv4_attention_params(FLASH, 4) == base + 8_388_608 + 4_096 + 512 + indexer == 126_098_624


def test_the_hyper_connections_parameters_by_hand():
    # two modules a layer: mapping_proj 4·4096 → 4² + 2·4 = 24, its bias 24, three alphas
    assert HC.mapping_width(4) == 24
    assert M.mhc_params(FLASH) == 2 * ((4 * 4096) * 24 + 24 + 3) == 786_486
    assert M.mhc_params(replace(FLASH, enable_mhc_connections=False)) == 0


def test_deepseek_v4_flash_has_284b_parameters():
    # attention: 2 sliding, 21 CSA and 20 HCA layers; each layer's norms 2·4096 and mHC 786,486, router 4096·256,
    # one shared expert 3·4096·2048 and 256 routed ones of 3·4096·2048; the embedding and the head 129280·4096 each,
    # the final norm 4096 (the MTP module is not in the decoder's count)
    attention = 2 * 106_956_352 + 21 * 126_098_624 + 20 * 111_216_704
    other = 8_192 + 786_486 + 1_048_576 + 25_165_824 + 256 * 25_165_824
    assert FLASH.csa_compress_ratios.count(4) == 21 and FLASH.csa_compress_ratios[:43].count(128) == 20
    assert M.total_params(FLASH) == attention + 43 * other + 2 * 529_530_880 + 4_096 == 284_332_164_690


def test_the_keys_a_query_attends():
    assert CA.window_keys(4096, 128) == 128 - 128 * 128 / (2 * 4096) == 126  # query i: min(i + 1, w)
    assert CA.compressed_keys(4096, 128, 512) == 16  # every earlier one of 4096/128: 16 on average
    assert CA.compressed_keys(4096, 4, 512) == 512 - 512 * 512 / (2 * 1024) == 384  # top 512 of 1024
    assert CA.compressed_keys(4096, 0, 512) == 0


def test_each_ratio_has_its_own_kernels():
    sliding, csa, hca = (_named(Ly.forward_steps(_shape(r))) for r in (0, 4, 128))
    assert "compress.proj" not in sliding and "attn.indexer.scores" not in sliding
    assert "attn.indexer.scores" not in hca
    # the compressors' GEMMs: kv and gate of 2·512 at ratio 4, of 512 at 128
    assert (csa["compress.proj"].n, hca["compress.proj"].n) == (2048, 1024)
    # the core at 128: 4096 queries, 64 heads, 126 + 16 keys, QK and PV over 512 each
    assert hca["attn.core"].flops == 2.0 * 4096 * 64 * 142 * 2 * 512 == 76_235_669_504
    # at 4: 126 + 384 keys; the indexer's scores over 1024/2 compressed keys a query, 64 heads of 128
    assert csa["attn.core"].flops == 2.0 * 4096 * 64 * 510 * 2 * 512
    # its bytes: the query and the output (4096 × 64 × 512 each: 268,435,456 together), each distinct key once (the 4096 the windows slide
    # over and the 1024 compressed, of 512), in bf16; the top-512 indices (int32) and the log-sum-exp (fp32)
    assert CA.unique_keys(_shape(4)) == 5120
    assert csa["attn.core"].bytes == (268_435_456 + 5120 * 512) * 2 + 4096 * 512 * 4 + 4096 * 64 * 4 == 551_550_976
    pairs = 4096 * 1024 / 2
    assert csa["attn.indexer.scores"].flops == 2.0 * pairs * 64 * 128 + 3.0 * pairs * 64
    # the grouped o_a, 8 GEMMs of 4096 × 1024 × 4096, in BF16 under MXFP8 (a bmm); o_b 4096 × 4096 × 8192
    o_a, proj = csa["o_a"], csa["proj"]
    assert (o_a.m, o_a.n, o_a.k, o_a.batch) == (4096, 1024, 4096, 8) and (proj.n, proj.k) == (4096, 8192)


def test_the_indexer_trains_only_with_its_loss():
    with_loss = _named(Ly.backward_steps(_shape(4)))
    without = _named(Ly.backward_steps(_shape(4, dsa_indexer_loss_coeff=0.0)))
    assert "attn.indexer_bwd" in with_loss and not [n for n in without if n.startswith("attn.indexer")]


def test_the_hyper_connection_kernels_by_hand():
    L = _shape(0)
    n_h = 4096 * 4 * 4096  # the streams' elements: 4096 tokens × 4 × 4096
    unfused = _named(Ly.forward_steps(L))
    # the post replaces the bias-dropout-add: H_res's bmm (2 passes), H_post (1/4 + 1), the add (3)
    assert unfused["hc.attn.post"].bytes == (6 + 1 / 4) * n_h * 2
    assert "bda1" not in unfused and "hc.mlp.aggregate" in unfused
    fused = _named(Ly.forward_steps(replace(L, hc_fused=True)))
    assert fused["hc.attn.pre"].bytes == (1 + 1 / 4) * n_h * 2 == 167_772_160
    assert fused["hc.attn.post"].bytes == (2 + 1 / 4) * n_h * 2
    # the embedding copies to 4 streams, the head averages them
    assert _named(Ly.embedding_forward(L, False))["hc.expand"].bytes == (1 + 1 / 4) * n_h * 2
    assert "hc.contract" in _named(Ly.head_forward(L, 129280))


def test_the_mhc_recompute_reruns_the_aggregates_and_posts():
    L = _shape(0)
    steps = backward_with_modules(L, ("mhc",))
    rerun = [st.name for st in steps if st.category == Ly.RECOMPUTE]
    assert rerun == ["hc.attn.aggregate", "hc.attn.post", "hc.mlp.aggregate", "hc.mlp.post"]
    assert steps[0].category == Ly.RECOMPUTE  # before the layer's backward begins


def test_the_model_flops_as_megatron_bridge_counts_them():
    # a CSA layer's attention, one sequence of 4096 (flop_utils.py's dsv4_hybrid terms, forward: 2 × the term):
    # the window 64·128·512·2, the top-k's k̄ = 512·(1 − 4·512/8192) = 384 more keys 64·384·512·2, the compressor
    # 4096·1024·2, the indexer's linears 4096·256·2 + 1024·64·128 + 4096·64; its scores 2·4096²·64·128/4
    per_token = 8_388_608 + 25_165_824 + 8_388_608 + 2_097_152 + 8_388_608 + 262_144
    core = 2 * 4096 * per_token + 2 * 4096 * 4096 * 2048
    assert F.attention_core_flops(FLASH, 2) == pytest.approx(core) == 500_363_689_984
    # a sliding layer: the projections q 1024·(4096 + 64·512 + 1), kv 4096·512 + 512, o 64·512·1024 + 8·1024·4096;
    # the window's core 2·4096·64·128·512·2; the MoE MLP (2·4096·4096 = 33,554,432 times): 6 experts of 3·2048, the
    # router's 256, one shared expert of 3·2048
    proj = 2 * 4096 * (1024 * (4096 + 32768 + 1) + 2_097_152 + 512 + 33_554_432 + 33_554_432)
    window = 2 * 4096 * 8_388_608
    moe = 33_554_432 * (6 * 6144 + 256 + 6144)
    assert F.layer_forward_flops(FLASH, 0) == pytest.approx(proj + window + moe)
    assert F.layer_forward_flops(FLASH, 2) - F.layer_forward_flops(FLASH, 0) == pytest.approx(core - window)


def test_the_streams_memory_by_hand():
    # each block's 4·4096 streams and its 4096 output, bf16: 2·(2·4·4096 + 2·4096) bytes a token
    assert A.mhc_terms(FLASH) == 81_920
    keep = A.layer_activation_bytes(FLASH, 1, 4096, flash=True, recompute="selective", modules=())
    drop = A.layer_activation_bytes(FLASH, 1, 4096, flash=True, recompute="selective", modules=("mhc",))
    # 'mhc' drops the MLP block's streams and the two aggregates: 4096 tokens × (2·4·4096 + 2·2·4096)
    assert keep - drop == 4096 * (32_768 + 16_384)


def _scenario(model: str = "", parallel: str = "tp: 1, dp: 32, ep: 8", training: str = "",
              ratios: str = "[0, 4, 128, 4, 0]") -> str:
    return f"""
name: dsv4
cluster: {{nodes: 8, node: gb200-nvl72}}
model: {{preset: deepseek-v4-flash, layers: 4, experts: 32, csa_compress_ratios: {ratios}{model}}}
training: {{global_batch: 64, micro_batch: 1, attention: flash{training}}}
parallel: {{{parallel}}}
"""


@pytest.mark.parametrize("ratios,key,words", [
    ("[0, 4, 128]", "model.csa_compress_ratios", "one ratio a layer"),
    ("[0, 4, 64, 4]", "model.csa_compress_ratios", "0, 4 or 128"),
    ("[0, -4, 128, 4]", "model.csa_compress_ratios[1]", "expected an integer from 0"),
])
def test_the_ratios(ratios, key, words):
    with pytest.raises(ScenarioError) as err:
        load_scenario_text(_scenario(ratios=ratios))
    assert err.value.key == key and words in err.value.message


@pytest.mark.parametrize("model,parallel,training,key,words", [
    ("", "tp: 1, cp: 2, dp: 16", "", "parallel.cp", "context parallelism"),
    (", o_groups: 2", "tp: 4, dp: 8", "", "parallel.tp", "o_groups"),
    ("", "tp: 1, dp: 32", ", recompute: full", "training.recompute", "full activation recompute"),
    ("", "tp: 1, dp: 32", ", recompute: selective, recompute_modules: [mhc, mlp]", "training.recompute_modules",
     "cannot be used together"),
    (", enable_mhc_connections: false", "tp: 1, dp: 32", ", recompute: selective, recompute_modules: [mhc]",
     "training.recompute_modules", "requires enable_mhc_connections"),
    (", kv_lora_rank: 512, kv_heads: 0", "tp: 1, dp: 32", "", "model.kv_lora_rank", "not multi-latent attention's"),
    ("", "tp: 1, dp: 32", ", recompute: selective, recompute_modules: [mhc], fine_grained_activation_offloading: true, "
     "offload_modules: [core_attn]", "training.recompute_modules", "fine-grained activation offloading"),
])
def test_the_rules(model, parallel, training, key, words):
    with pytest.raises(ScenarioError) as err:
        load_scenario_text(_scenario(model, parallel, training))
    assert err.value.key == key and words in err.value.message


def test_mhc_with_mtp_needs_deepseek_v4():
    text = """
name: mhc
cluster: {nodes: 1, node: dgx-h100}
model: {preset: llama3-8b, layers: 4, mtp_num_layers: 1, enable_mhc_connections: true}
training: {global_batch: 8, micro_batch: 1}
parallel: {tp: 1, dp: 8}
"""
    with pytest.raises(ScenarioError) as err:
        load_scenario_text(text)
    assert err.value.key == "model.mtp_num_layers" and "Multi-Token Prediction" in err.value.message


def test_a_small_model_runs_and_its_pipeline_sends_the_streams():
    from emulator.run.simulation import simulate
    from emulator.workload.builder import build_program

    one = load_scenario_text(_scenario(parallel="tp: 1, pp: 2, dp: 16, ep: 8"))
    plain = load_scenario_text(_scenario(", enable_mhc_connections: false", "tp: 1, pp: 2, dp: 16, ep: 8"))
    sends = {name: max(op.bytes for op in build_program(sc).ops if op.kind.label == "send")
             for name, sc in (("mhc", one), ("plain", plain))}
    # one micro-batch's 4096 tokens of 4096 in bf16, times the 4 streams
    assert sends == {"mhc": 4 * 4096 * 4096 * 2, "plain": 4096 * 4096 * 2}
    with_streams = simulate(one, record_links=False).iteration_time_s
    assert with_streams > simulate(plain, record_links=False).iteration_time_s > 0


def test_the_cuda_graph_modules_take_the_new_kernels():
    from emulator.workload import host as H

    # DeepSeek-V4's projections and compressor with the attention; mHC's kernels with their block, the MLP's with
    # its pre-norm (the router's module in an MoE layer)
    assert {H.module_of(n, True) for n in ("q_a", "q_b.dgrad", "kv_proj.wgrad", "compress.proj", "o_a.dgrad",
                                            "hc.attn.pre", "hc.attn.post_bwd")} == {"attn"}
    assert H.module_of("hc.mlp.post", True) == "moe_router" and H.module_of("hc.mlp.pre", False) == "mlp"


def test_a_stage_keeps_each_layer_s_own_attention_activations():
    from emulator.scenario import load_scenario
    from emulator.workload.memory import stage_memory

    sc = load_scenario("scenarios/deepseek-v4-flash-64-gb200-bf16.yaml")
    m = M.resolve(sc.model)
    assert [M.compress_ratio(m, i) for i in range(4)] == [0, 0, 4, 128]
    b = [A.scenario_layer_bytes(sc, m, True, layer=i) for i in range(4)]
    # BF16, 4096 tokens, TP 1: 4096 B per per-token byte. A ratio-4 layer over a ratio-128 one: the compressor's kv and
    # gate at width 2D instead of D, 2·2·(2·512 − 512) = 2048, and the indexer: its top-k indices 4·512 = 2048, its q
    # and weights 2·(64·128 + 64) = 16,512, its compressor's kv and gate as _dsv4_parts counts them, 2·2·4·128 = 2048:
    # 2048 + 2048 + 16,512 + 2048 = 22,656 B a token, 92,798,976 B
    assert b[2] - b[3] == 22_656 * 4096
    # a ratio-0 layer (the window only) has no compressor: 2·2·512 = 2048 B a token less than a ratio-128 one
    assert b[3] - b[0] == 2048 * 4096
    # the largest kind's bytes stand for a layer not named, as before
    assert A.scenario_layer_bytes(sc, m, True) == b[2]
    # a stage keeps the mean of its layers: [2, 3] holds one of each
    assert A.differing_layer_bytes(sc, m, [2, 3], (0.0, 0.0)) == (b[2] + b[3]) / 2
    # the first stage holds layers 0-5 (ratios 0, 0, 4, 128, 4, 128) and, in 1F1B over PP 8, eight micro-batches
    # of them in flight: 48 layers at their mean, 8·(2·b0 + 2·b4 + 2·b128), not 48 ratio-4 layers
    assert stage_memory(sc)[0].breakdown["activations"] == 8 * (2 * b[0] + 2 * b[2] + 2 * b[3])


def test_fp8_param_gather_moves_each_layer_s_own_gemm_weights_in_1_byte():
    from emulator.scenario import load_scenario
    from emulator.workload.builder import make_plan

    sc = load_scenario("scenarios/deepseek-v4-flash-128-gb200.yaml")  # MXFP8 with fp8_params, TP 1
    m = M.resolve(sc.model)
    # the GEMM weights fp8 stores: q_a 4096·1024 = 4,194,304, q_b 1024·32,768 = 33,554,432, kv_proj 4096·512
    # = 2,097,152, o_b 8192·4096 = 33,554,432: 73,400,320 (o_a is a BF16 bmm); ratio 128's compressor 2·4096·512
    # = 4,194,304; ratio 4's 2·4096·1024 = 8,388,608 and its indexer's compressor 2·4096·256 = 2,097,152, q_b
    # 1024·8192 = 8,388,608, weights_proj 4096·64 = 262,144
    assert [M.dsv4_linear(m, r) for r in (0, 128, 4)] == [73_400_320, 77_594_624, 92_536_832]
    plan = make_plan(sc, 0)
    units = {u.layer: u for u in plan.chunk_units[0] if u.name.startswith("layer")}
    # an MoE layer's dense part also holds the shared expert, 3·4096·2048 = 25,165,824 GEMM weights; those move in
    # 1 B (plan.param_q) instead of 2, the rest (norms, mHC, the router, the sinks, o_a, the biases) in 2. The
    # ratio-128 layer 3 less than the ratio-4 layer 2 by its own weights, not the widest layer's for both
    for layer, ratio in ((3, 128), (2, 4)):
        u = units[layer]
        assert plan.gathered(u)[0] == 2 * u.params - (M.dsv4_linear(m, ratio) + 25_165_824) * (2 - 1)
        assert plan.gathered(u)[0] > 0
