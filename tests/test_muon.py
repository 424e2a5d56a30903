"""Megatron-Core's Muon (emulator/workload/muon.py): its matrices, states, Newton–Schulz cost, dist_muon's
collectives, the closed form's agreement with the builder, and the rule book's refusals."""
import pytest

from emulator.devices import compute
from emulator.errors import ScenarioError
from emulator.scenario import load_scenario_text
from emulator.studies.rank import estimate_iteration
from emulator.workload import muon as MU
from emulator.workload.builder import build_program
from emulator.workload.memory import memory_report

BASE = """name: m
cluster: {nodes: %(nodes)d, node: {preset: dgx-h100, gpus_per_node: %(gpn)d}}
model: {preset: %(model)s}
training: {global_batch: 16, micro_batch: 1%(training)s}
parallel: {tp: %(tp)d, pp: %(pp)d, dp: %(dp)d, zero: %(zero)d%(par)s}
"""


def _sc(model="gpt3-125m", training="", tp=1, pp=1, dp=8, zero=0, nodes=1, par=""):
    return load_scenario_text(BASE % dict(model=model, training=training, tp=tp, pp=pp, dp=dp, zero=zero, par=par,
                                          nodes=nodes, gpn=tp * pp * dp // nodes), "m.yaml")


def test_one_newton_schulz_step_of_a_kimi_expert_fc1():
    # fc1 of a Kimi K2 expert, 4096 x 7168 (m = 4096 <= n = 7168): 4m²n + 2m³
    # = 4·16 777 216·7168 + 2·68 719 476 736 = 481 036 337 152 + 137 438 953 472
    assert MU.ns_step_flops(4096, 7168) == 618_475_290_624
    assert MU.ns_step_flops(7168, 4096) == 618_475_290_624  # transposed to whiten the smaller side
    gpu = _sc().cluster.node.gpu
    sec, flops, by = MU.ns_cost(4096, 7168, 5, gpu)
    assert flops == 5 * 618_475_290_624
    # per step the three bf16 GEMMs A = X·Xᵀ (4096×4096×7168), A·A (4096³), B·X (4096×7168×4096)
    gemms = sum(compute.gemm_cost(*dims, gpu, "bf16")[0] for dims in ((4096, 4096, 7168), (4096, 4096, 4096),
                                                                       (4096, 7168, 4096)))
    assert sec == pytest.approx(5 * gemms, rel=1e-12) and sum(by) == pytest.approx(sec, rel=1e-12)


def test_kimi_k2s_moe_layer_matrices():
    sc = load_scenario_text("name: k\ncluster: {nodes: 64, node: {preset: gb200-nvl72, nvlink_domain: 64}}\n"
                            "model: {preset: kimi-k2}\ntraining: {global_batch: 2048, micro_batch: 1, optimizer: "
                            "dist_muon}\nparallel: {tp: 1, pp: 4, dp: 64, ep: 64, zero: 1, schedule: "
                            "interleaved-1f1b, virtual_stages: 4, first_chunk_layers: 4, last_chunk_layers: 1}\n",
                            "k.yaml")
    mats = MU.layer_matrices(sc.model, 5, sc.parallel, sc.training)
    shapes = [(x.rows, x.cols, x.count, x.expert) for x in mats]
    # MLA: q_down 1536×7168, q_up 64·192×1536, kv_down (512+64)×7168, kv_up 64·(128+128)×512, proj 7168×64·128;
    # the router 384×7168; the shared expert's fc1 2·2048×7168 and fc2; 384/64 = 6 local experts of each
    assert shapes == [(1536, 7168, 1, False), (12288, 1536, 1, False), (576, 7168, 1, False),
                      (16384, 512, 1, False), (7168, 8192, 1, False), (384, 7168, 1, False),
                      (4096, 7168, 1, False), (7168, 2048, 1, False), (4096, 7168, 6, True), (7168, 2048, 6, True)]
    # a dense leading layer: the attention and the 18432-wide MLP
    assert [(x.rows, x.cols) for x in MU.layer_matrices(sc.model, 0, sc.parallel, sc.training)][-2:] == \
        [(36864, 7168), (7168, 18432)]


def test_muon_keeps_8_bytes_for_each_weight_matrix_parameter():
    adam = memory_report(_sc(dp=1)).breakdown
    muon = memory_report(_sc(dp=1, training=", optimizer: muon")).breakdown
    # GPT-3 125M: 12 layers of Q, K, V, proj (768² each) and fc1, fc2 (3072·768 each):
    # 12·(4·589 824 + 2·2 359 296) = 84 934 656 Muon parameters at 8 B instead of Adam's 12
    assert adam["optimizer"] - muon["optimizer"] == 4 * 84_934_656
    assert (adam["params"], adam["grads"]) == (muon["params"], muon["grads"])
    # dist_muon over 8 ranks (zero 1): the parameters are dealt out whole, Adam's with Muon's (the legacy path), the
    # gradients stay whole. The ping-pong (test_dist_muon_all_reduces_steps_a_share_and_all_gathers) gives rank 3
    # two projs, a QKV and three fcs, 1 179 648 + 1 769 472 + 7 077 888 = 10 027 008 Muon parameters at 8 B, and
    # the word embedding, 50 304·768 = 38 633 472 at Adam's 12: 80 216 064 + 463 601 664 = 543 817 728 B, the most
    # of any rank. Adam at ZeRO 1 shards them all evenly: 12·(84 934 656 + 38 633 472 + the positions'
    # 2048·768 = 1 572 864)/8 = 187 711 488 B. The rank that draws the embedding holds 356 106 240 B more
    dist = memory_report(_sc(dp=8, zero=1, training=", optimizer: dist_muon")).breakdown
    z1 = memory_report(_sc(dp=8, zero=1)).breakdown
    assert dist["optimizer"] - z1["optimizer"] == 356_106_240
    assert dist["grads"] == z1["grads"] == adam["grads"]


def test_dist_muon_all_reduces_steps_a_share_and_all_gathers():
    prog = build_program(_sc(dp=8, zero=1, training=", optimizer: dist_muon", par=", overlap_param_gather: false"))
    ops = [op for op in prog.ops if op.rank == 0]
    names = [op.name for op in ops]
    assert any(n.startswith("grad_all_reduce") for n in names) and not any("reduce_scatter" in n for n in names)
    ns = next(op for op in ops if op.name == "newton_schulz")
    # 12 layers of QKV (one 2304×768 parameter, three 768×768 blocks: 3P a step, P = 6·768³ = 2 717 908 992),
    # proj 768×768 (P), fc1 and fc2 3072×768 (4·768²·3072 + 2·768³ = 18·768³ = 3P each); all of it over 5 steps
    # 5·12·10P = 1 630 745 395 200. Dealt whole, ping-pong over 8 ranks (loop 0..7, 7..0), by size, after 98 1-D
    # parameters (two LayerNorms of gain and shift and four biases a layer, 96, and the final LayerNorm's 2: the
    # loop starts at 98 mod 16 = 2): the 12 projs (589 824) to ranks 2..7, 7..2; the positions' embedding
    # (2048·768 = 1 572 864, Adam's) to 1; the 12 QKVs (1 769 472) to 0, 0..7, 7..5; the 24 fcs (2 359 296) to
    # 4..0, 0..7, 7..0, 0..2. Rank 0: two QKVs and four fcs, 6P + 12P = 18P a step, the most (rank 2: 2P + 3P +
    # 12P = 17P; the mean 15P). The heaviest, 5·18P = 244 611 809 280, runs the step
    assert ns.flops == pytest.approx(244_611_809_280, rel=1e-12)
    gathers = [op for op in ops if op.name.startswith("param_ag")]
    assert gathers and all(ns.id in op.deps for op in gathers)  # without overlap_param_gather: after the step
    assert all(len(op.group) == 8 for op in gathers)  # dense weights over dp·cp (GPT-3 has no experts)
    muon = [op for op in build_program(_sc(dp=8, training=", optimizer: muon")).ops
            if op.rank == 0 and op.name == "newton_schulz"]
    assert muon[0].flops == pytest.approx(1_630_745_395_200, rel=1e-12)  # muon: every rank all of it


def test_duplicated_tp_gathers_the_momenta_and_blockwise_does_not():
    dup = [op for op in build_program(_sc("gpt3-1.3b", ", optimizer: dist_muon", tp=4, pp=2, dp=2, zero=1,
                                          nodes=2)).ops if op.rank == 0]
    ag = next(op for op in dup if op.name == "muon_momentum_ag")
    # GPT-3 1.3B, h 2048: per layer Q, K, V, proj (2048² each) and fc1, fc2 (8192·2048) gathered whole in fp32:
    # 4·(4·4 194 304 + 2·16 777 216) = 201 326 592 B; 12 layers a stage, half of them on each of 2 DP ranks
    assert ag.bytes == 201_326_592 * 12 / 2 and len(ag.group) == 4
    block = [op for op in build_program(_sc("gpt3-1.3b", ", optimizer: dist_muon, muon_tp_mode: blockwise", tp=4,
                                            pp=2, dp=2, zero=1, nodes=2)).ops if op.rank == 0]
    assert not any(op.name == "muon_momentum_ag" for op in block)
    f_dup = next(op.flops for op in dup if op.name == "newton_schulz")
    f_block = next(op.flops for op in block if op.name == "newton_schulz")
    assert f_block < f_dup / 4  # a quarter of each matrix's rows or columns: less than a quarter of the FLOPs


@pytest.mark.parametrize("training, zero, dp", [(", optimizer: muon", 0, 8), (", optimizer: dist_muon", 1, 8),
                                                (", optimizer: dist_muon, muon_num_ns_steps: 3", 1, 4)])
def test_the_closed_form_steps_as_the_builder(training, zero, dp):
    sc = _sc(training=training, zero=zero, dp=dp)
    step = sum(op.duration for op in build_program(sc).ops
               if op.rank == 0 and op.name in ("optimizer", "newton_schulz"))
    assert estimate_iteration(sc).optimizer_s == pytest.approx(step, rel=1e-9)


@pytest.mark.parametrize("training, zero, key, words", [
    (", optimizer: dist_muon", 0, "parallel.zero", "needs parallel.zero 1"),
    (", optimizer: dist_muon", 3, "parallel.zero", "Megatron-FSDP"),
    (", optimizer: muon", 2, "parallel.zero", "got zero 2"),
    (", optimizer: muon, precision: fp16", 0, "training.precision", "emerging optimizer with fp16"),
    (", muon_num_ns_steps: 3", 1, "training.muon_num_ns_steps", "needs training.optimizer muon or dist_muon"),
    (", optimizer: muon, use_precision_aware_optimizer: true", 0, "training.use_precision_aware_optimizer",
     "set training.optimizer megatron"),
])
def test_megatron_cores_refusals(training, zero, key, words):
    with pytest.raises(ScenarioError) as err:
        _sc(training=training, zero=zero)
    assert err.value.key == key and words in err.value.message


def test_adam_scenarios_are_untouched():
    # the default optimizer emits no Newton–Schulz op and reduce-scatters under zero 1
    ops = [op for op in build_program(_sc(zero=1)).ops if op.rank == 0]
    assert not any(op.name == "newton_schulz" for op in ops)
    assert any(op.name.startswith("grad_reduce_scatter") for op in ops)


@pytest.mark.parametrize("optimizer", ["dist_muon", "megatron"])
def test_zero_1_gathers_experts_over_their_own_group(optimizer):
    # Adam's distributed optimizer too: Megatron-Core's DDP keeps the experts in buffers over the expert-data-
    # parallel group (distributed_data_parallel.py expert_parallel_buffers), which gathers them after the step
    sc = load_scenario_text("name: q\ncluster: {nodes: 1, node: dgx-h100}\nmodel: {preset: qwen3-30b-a3b}\n"
                            f"training: {{global_batch: 8, micro_batch: 1, optimizer: {optimizer}}}\n"
                            "parallel: {tp: 1, pp: 1, dp: 8, ep: 4, zero: 1, overlap_param_gather: false}\n", "q.yaml")
    ops = [op for op in build_program(sc).ops if op.rank == 0]
    dense = [op for op in ops if op.name.startswith("param_ag.")]
    expert = [op for op in ops if op.name.startswith("expert_param_ag.")]
    # dp·cp = 8 for the dense weights; the experts' expert-data-parallel group: dp·cp/ep = 2 ranks
    assert dense and expert and {len(op.group) for op in dense} == {8} and {len(op.group) for op in expert} == {2}
    # every expert-parallel rank holds 128/4 = 32 experts of fc1 2·768×2048 and fc2 2048×768 a layer, 48 layers:
    # 48·32·3·768·2048 parameters, gathered in bf16
    assert sum(op.bytes for op in expert) == pytest.approx(2 * 48 * 32 * 3 * 768 * 2048, rel=1e-12)


def test_the_search_tries_dist_muon_at_zero_1_only():
    from emulator.studies.search import Limits, plan

    sc = _sc(zero=1, training=", optimizer: dist_muon")
    p = plan(sc, 8, Limits(max_pp=1, max_tp=2))
    assert p.layouts and {lay.zero for lay in p.layouts} == {1}
    assert p.pruned["Muon's optimizer takes ZeRO 0 or 1 (dist_muon 1)"] > 0
    # muon takes ZeRO 0 (states whole) and 1 (the layer-wise optimizer), never 2 or 3
    p = plan(_sc(training=", optimizer: muon"), 8, Limits(max_pp=1, max_tp=2))
    assert {lay.zero for lay in p.layouts} == {0, 1}


def test_muon_with_the_distributed_optimizer_reduce_scatters_where_dist_muon_all_reduces():
    # Megatron-LM (arguments.py @ d98e8a64dd) turns --optimizer muon --use-distributed-optimizer into the
    # layer-wise optimizer with its default parameter layout, which reduce-scatters the gradients (training.py
    # wrap_model_chunks_with_ddp); Megatron-Bridge's dist_muon, without the distributed optimizer, all-reduces them.
    # The rest is the same program, op for op, but for the Newton–Schulz step, whose share each path deals its own
    # way (test_layer_wise.py), and the memory: the layout path keeps Adam's parameters in a distributed optimizer
    # of their own, sharded evenly, where the legacy path deals them whole (the word embedding on one rank)
    def ops(name):
        sc = _sc(zero=1, training=f", optimizer: {name}", par=", overlap_param_gather: false")
        prog = build_program(sc).ops
        return [(op.name, op.kind, op.duration, op.bytes, op.group) for op in prog
                if not op.name.startswith("grad_") and op.name != "newton_schulz"], \
            [op.name for op in prog if op.name.startswith("grad_")], memory_report(sc).breakdown, \
            next(op.flops for op in prog if op.rank == 0 and op.name == "newton_schulz")

    muon, dist = ops("muon"), ops("dist_muon")
    assert muon[0] == dist[0]
    assert muon[1] and all(n.startswith("grad_reduce_scatter") for n in muon[1])
    assert [n.replace("reduce_scatter", "all_reduce") for n in muon[1]] == dist[1]
    # the layout path's LPT by Newton–Schulz cost over 8 shards, three buckets of 17, 15 and 16 parameters walked
    # from the last layer: ranks 0-2 hold a proj, two QKVs and three fcs, P + 6P + 9P = 16P a step (P = 6·768³),
    # the most: 5·16P = 217 432 719 360 (the legacy ping-pong's heaviest, 5·18P = 244 611 809 280). That rank's
    # 589 824 + 2·1 769 472 + 3·2 359 296 = 11 206 656 Muon parameters take 8 B, the rest Adam's 12 B shared by 8
    assert (muon[3], dist[3]) == (217_432_719_360, 244_611_809_280)
    z1 = memory_report(_sc(zero=1)).breakdown
    # against Adam: 12·84 934 656/8 − 8·11 206 656 = 127 401 984 − 89 653 248 = 37 748 736 B less
    assert z1["optimizer"] - muon[2]["optimizer"] == 37_748_736
    assert dist[2]["optimizer"] - z1["optimizer"] == 356_106_240  # test_muon_keeps_8_bytes_for_each_weight_matrix
    # GPT-3 125M over dp 8: a ring reduce-scatter moves half the bytes of a ring all-reduce, so muon's closed-form
    # iteration is the shorter (equal, were both all-reduced)
    assert estimate_iteration(_sc(zero=1, training=", optimizer: muon")).iteration_s < \
        estimate_iteration(_sc(zero=1, training=", optimizer: dist_muon")).iteration_s


V4 = "scenarios/deepseek-v4-flash-64-gb200-muon.yaml"


def test_deepseek_v4s_layer_matrices_are_its_2d_weights():
    from emulator.scenario import load_scenario
    from emulator.workload import models as M

    sc = load_scenario(V4)
    m = M.resolve(sc.model)
    # V4-Flash, h 4096, a 64 heads of D 512, q rank 1024, 8 output groups of rank 1024, TP 1: q_a 1024·4096
    # = 4,194,304; q_b 32,768·1024 = 33,554,432; kv_proj 512·4096 = 2,097,152; o_a (8·1024)·(64·512/8) = 33,554,432;
    # o_b 4096·8192 = 33,554,432: 106,954,752. Ratio 128: the compressor's kv and gate 2·512·4096 and its position
    # bias 128·512, + 4,259,840. Ratio 4: the compressor at 2D, 2·1024·4096 + 4·1024 = 8,392,704, and the indexer:
    # its compressor 2·256·4096 + 4·256 = 2,098,176, q_b (64·128)·1024 = 8,388,608, weights_proj 64·4096 = 262,144:
    # + 19,141,632
    attention = {0: 106_954_752, 128: 111_214_592, 4: 126_096_384}
    # the rest of each layer's Muon weights: mHC's two mapping_proj (4·4096 → 4² + 2·4), 2·24·16,384 = 786,432; the
    # router 256·4096 = 1,048,576; the shared expert's fc1 4096·4096 and fc2 4096·2048, 25,165,824
    rest = 786_432 + 1_048_576 + 25_165_824
    for layer, ratio in ((0, 0), (3, 128), (2, 4)):
        dense, expert = MU.muon_params(MU.layer_matrices(sc.model, layer, sc.parallel, sc.training))
        assert dense == attention[ratio] + rest
        # the attention's other weights are 1-D: q_a's norm 1024, kv_proj's 512, the sinks 64; a compressor's norm
        # 512; the indexer's compressor's norm 128 (models.py counts them all)
        one_d = 1024 + 512 + 64 + (512 if ratio else 0) + (128 if ratio == 4 else 0)
        assert M.dsv4_attention_params(m, ratio) == attention[ratio] + one_d
        # 256 experts over EP 8: 32 local, each fc1 4096·4096 and fc2 4096·2048
        assert expert == 32 * 25_165_824
    # the MTP module: its layer (ratio 0, the last entry of csa_compress_ratios) and eh_proj 4096·8192
    dense, expert = MU.muon_params(MU.mtp_matrices(sc.model, sc.parallel, sc.training, 1))
    assert dense == attention[0] + rest + 33_554_432 and expert == 32 * 25_165_824


def test_highest_precision_runs_newton_schulz_in_fp32():
    gpu = _sc().cluster.node.gpu
    sec, flops, _ = MU.ns_cost(768, 3072, 5, gpu, "fp32")
    # per step the three GEMMs of a 768×3072 matrix (m = 768): 768×768×3072, 768³, 768×3072×768, in fp32
    gemms = sum(compute.gemm_cost(*dims, gpu, "fp32")[0] for dims in ((768, 768, 3072), (768, 768, 768),
                                                                       (768, 3072, 768)))
    assert sec == pytest.approx(5 * gemms, rel=1e-12) and flops == 5 * MU.ns_step_flops(768, 3072)
    ops = {p: {op.name: op for op in build_program(_sc(dp=1, training=f", optimizer: muon, "
                                                       f"muon_fp32_matmul_prec: {p}")).ops}
           for p in ("medium", "high", "highest")}
    # the same FLOPs at the bf16, TF32 (989 TFLOP/s dense on H100) and FP32 (67 TFLOP/s) rates: slower in turn
    ns = [ops[p]["newton_schulz"] for p in ("medium", "high", "highest")]
    assert ns[0].flops == ns[1].flops == ns[2].flops
    assert ns[0].duration < ns[1].duration < ns[2].duration
    # without medium's cast to bf16 and back (4 + 2 + 2 + 4 B), 12 B less a Muon parameter: 12·84,934,656 (GPT-3
    # 125M's weight matrices, test_muon_keeps_8_bytes_for_each_weight_matrix_parameter)
    assert ops["medium"]["optimizer"].bytes - ops["highest"]["optimizer"].bytes == pytest.approx(
        12 * 84_934_656, rel=1e-12)


def test_a_gpu_without_an_fp32_rate_refuses_highest_by_name():
    sc = load_scenario_text(BASE % dict(model="gpt3-125m", training=", optimizer: muon, muon_fp32_matmul_prec: "
                                        "highest", tp=1, pp=1, dp=8, zero=0, par="", nodes=1, gpn=8), "m.yaml",
                            ["cluster.node.gpu.peak_flops_fp32=0 TFLOP/s"])
    with pytest.raises(ScenarioError) as err:
        build_program(sc)
    assert err.value.key == "training.muon_fp32_matmul_prec" and "no fp32 rate" in err.value.message


def test_deepseek_v4_flash_muon_recipe_steps_its_fp32_newton_schulz():
    from emulator.scenario import load_scenario

    sc = load_scenario(V4)
    ns = {op.rank: op for op in build_program(sc).ops if op.name == "newton_schulz"}
    # stage 0 holds layers 0-5 (ratios 0, 0, 4, 128, 4, 128), every one MoE; muon at zero 0: each rank all of it.
    # Per step, 4m²n + 2m³ with m the smaller side: an expert's fc1 (4096²) 6·4096³ = 412,316,860,416 and fc2
    # (4096×2048) 4·2048²·4096 + 2·2048³ = 85,899,345,920; 32 local experts and the shared expert: 33 of each
    expert = 33 * (412_316_860_416 + 85_899_345_920)
    # the attention, per step: q_a (1024×4096) 4·1024²·4096 + 2·1024³ = 19,327,352,832; q_b (32768×1024)
    # 4·1024²·32768 + 2·1024³ = 139,586,437,120; kv_proj (512×4096) 4·512²·4096 + 2·512³ = 4,563,402,752; o_a and
    # o_b (8192×4096) 4·4096²·8192 + 2·4096³ = 687,194,767,360 each
    attn = 19_327_352_832 + 139_586_437_120 + 4_563_402_752 + 2 * 687_194_767_360
    # ratio 128's compressor: kv and gate (512×4096) 2·4,563,402,752, its bias (128×512) 4·128²·512 + 2·128³;
    # ratio 4's: kv and gate (1024×4096) 2·19,327,352,832, its bias (4×1024) 4·16·1024 + 2·64, and the indexer's:
    # its kv and gate (256×4096) 2·(4·256²·4096 + 2·256³), bias (4×256) 4·16·256 + 2·64, q_b (8192×1024)
    # 4·1024²·8192 + 2·1024³, weights_proj (64×4096) 4·64²·4096 + 2·64³
    c128 = 2 * 4_563_402_752 + 4 * 128**2 * 512 + 2 * 128**3
    c4 = (2 * 19_327_352_832 + 4 * 16 * 1024 + 2 * 64 + 2 * (4 * 256**2 * 4096 + 2 * 256**3) + 4 * 16 * 256 + 2 * 64
          + 4 * 1024**2 * 8192 + 2 * 1024**3 + 4 * 64**2 * 4096 + 2 * 64**3)
    # mHC's two mapping_proj (24×16384) 2·(4·24²·16384 + 2·24³), the router (256×4096) 4·256²·4096 + 2·256³
    other = 2 * (4 * 24**2 * 16384 + 2 * 24**3) + 4 * 256**2 * 4096 + 2 * 256**3
    per_step = 6 * (expert + attn + other) + 2 * c4 + 2 * c128
    assert ns[0].flops == pytest.approx(5 * per_step, rel=1e-12)
    # in full FP32 on GB200 (80 TFLOP/s): ~5.4e14 FLOPs take at least 6.7 s on every rank of stage 0
    assert ns[0].duration > ns[0].flops / 80e12 > 6.7


def test_the_closed_form_steps_deepseek_v4_as_the_builder():
    from emulator.scenario import load_scenario

    sc = load_scenario(V4)
    ops = build_program(sc).ops
    # each layer's own matrices by its ratio, and the MTP module's on the last stage: the slowest rank's step. The
    # closed form's elementwise stream counts every layer's parameters as a ratio-4 layer's (rank.py params_of), a
    # few µs more of 12.6 s; its Newton–Schulz share is the builder's, layer by layer
    step = max(sum(op.duration for op in ops if op.rank == r and op.name in ("optimizer", "newton_schulz"))
               for r in {op.rank for op in ops})
    assert estimate_iteration(sc).optimizer_s == pytest.approx(step, rel=1e-5)
    ns = max(op.duration for op in ops if op.name == "newton_schulz")
    assert estimate_iteration(sc).optimizer_s - step < 1e-3 * (step - ns)
