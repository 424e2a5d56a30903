"""Hybrid models (Nemotron-H: workload/hybrid.py, workload/mixer.py, scenario/hybrid_rules.py): the presets' sizes by
hand, the Mamba-2 mixer's kernels, FLOPs and stored activations by hand, a pattern of attention and MLP layers
against the transformer it spells, and the rule book's refusals."""
import json

import pytest

from emulator.cli import main
from emulator.errors import ScenarioError
from emulator.scenario import load_scenario_text
from emulator.scenario.catalog import model_preset
from emulator.scenario.spec import ModelSpec
from emulator.studies.rank import estimate_iteration
from emulator.workload import flops as F
from emulator.workload import hybrid, mixer
from emulator.workload import layer as Ly
from emulator.workload import models as M
from emulator.workload.activations import layer_activation_bytes

# a small hybrid model: hidden 1024, 32 Mamba heads of 64 (d_inner 2048), 8 groups of state 128, 2048 tokens
SMALL = ModelSpec(layers=4, hidden=1024, heads=8, seq_len=2048, vocab=32000, activation="squared_relu", biases=False,
                  dropout=False, hybrid_layer_pattern="M*M-", mamba_num_heads=32, mamba_head_dim=64,
                  mamba_num_groups=8, mamba_state_dim=128)


def test_nemotronh_56b_parameters_by_hand():
    m = model_preset("nemotronh-56b")
    assert [m.hybrid_layer_pattern.count(c) for c in "M*-"] == [54, 10, 54]
    # Mamba: in_proj 8192·(2·16384 + 2·8·256 + 256 = 37120) = 304,087,040; conv (16384 + 4096)·5 = 102,400;
    # dt_bias, A_log, D 3·256 = 768; norm 16384; out_proj 16384·8192 = 134,217,728; pre-norm 8192: 438,432,512
    assert M.part_params(m, "M") == 438_432_512
    # attention: qkv 8192·(64·128 + 2·8·128) = 83,886,080, proj 8192² = 67,108,864, norm 8192: 151,003,136
    assert M.part_params(m, "*") == 151_003_136
    # MLP: 2·8192·32768 + 8192 = 536,879,104
    assert M.part_params(m, "-") == 536_879_104
    # 54·438,432,512 + 10·151,003,136 + 54·536,879,104 = 54,176,858,624; embedding and head 2·131072·8192 =
    # 2,147,483,648; final norm 8192
    assert M.total_params(m) == 56_324_350_464


def test_nemotron_3_nano_parameters_by_hand():
    m = model_preset("nemotron-3-nano")
    assert [m.hybrid_layer_pattern.count(c) for c in "ME*"] == [23, 23, 6]
    # Mamba: in_proj 2688·(8192 + 2048 + 64) = 27,697,152; conv 6144·5 = 30,720; 192; norm 4096; out_proj
    # 4096·2688 = 11,010,048; pre-norm 2688: 38,744,896
    assert M.part_params(m, "M") == 38_744_896
    # attention: qkv 2688·(32·128 + 2·2·128) = 12,386,304, proj 4096·2688 = 11,010,048, norm 2688: 23,399,040
    assert M.part_params(m, "*") == 23_399_040
    # MoE but the routed experts: router 2688·128 = 344,064, shared 2·2688·3712 = 19,955,712, norm 2688
    assert M.part_params(m, "E") == 20_302_464
    # routed 128·2·2688·1856 = 1,277,165,568 per E layer; 23·38,744,896 + 6·23,399,040 + 23·(20,302,464 +
    # 1,277,165,568) = 30,873,291,584; embeddings 2·131072·2688 = 704,643,072; final norm 2688
    assert M.total_params(m) == 31_577_937_344
    # a token's: top 6 of 128 experts, 23·(20,302,464 + 6·9,977,856) + 891,132,608 + 140,394,240 + 704,645,760
    assert M.activated_params(m) == 3_580_073_408


def test_nemotron_3_super_parameters_by_hand():
    m = model_preset("nemotron-3-super")
    assert [m.hybrid_layer_pattern.count(c) for c in "ME*"] == [40, 40, 8]
    # Mamba: in_proj 4096·(2·8192 + 2·8·128 + 128 = 18560) = 76,021,760; conv (8192 + 2048)·5 = 51,200; 384; norm
    # 8192; out_proj 8192·4096 = 33,554,432; pre-norm 4096: 109,640,064
    assert M.part_params(m, "M") == 109_640_064
    # attention: qkv 4096·(32·128 + 2·2·128) = 18,874,368, proj 4096·4096 = 16,777,216, norm 4096
    assert M.part_params(m, "*") == 35_655_680
    # MoE but the routed experts: router 4096·512 = 2,097,152, shared 2·4096·5376 = 44,040,192, norm 4096, the
    # latent projections 2·4096·1024 = 8,388,608
    assert M.part_params(m, "E") == 54_530_048
    # an expert in the latent width: 2·1024·2688 = 5,505,024; 512 of them 2,818,572,288 a layer. 40·109,640,064 +
    # 8·35,655,680 + 40·(54,530,048 + 2,818,572,288) = 119,594,941,440; embeddings 2·131072·4096; final norm 4096
    assert M.total_params(m) == 120_668_687_360
    # a token's: top 22, 40·(54,530,048 + 22·5,505,024) + 4,670,848,000 + 1,073,745,920
    assert M.activated_params(m) == 12_770_216_960


def test_nemotron_3_ultra_parameters_by_hand():
    m = model_preset("nemotron-3-ultra")
    assert [m.hybrid_layer_pattern.count(c) for c in "ME*"] == [48, 48, 12]
    # Mamba: in_proj 8192·(2·16384 + 2·8·128 + 256 = 35072) = 287,309,824; conv (16384 + 2048)·5 = 92,160; 768;
    # norm 16384; out_proj 16384·8192 = 134,217,728; pre-norm 8192: 421,645,056
    assert M.part_params(m, "M") == 421_645_056
    # attention: qkv 8192·(64·128 + 2·2·128) = 71,303,168, proj 8192² = 67,108,864, norm 8192
    assert M.part_params(m, "*") == 138_420_224
    # MoE but the routed experts: router 8192·512 = 4,194,304, shared 2·8192·10240 = 167,772,160, norm 8192,
    # latent projections 2·8192·2048 = 33,554,432
    assert M.part_params(m, "E") == 205_529_088
    # experts 2·2048·5120 = 20,971,520 each, 512 a layer: 48·421,645,056 + 12·138,420,224 + 48·(205,529,088 +
    # 10,737,418,240) = 547,161,477,120; embeddings 2·131072·8192 = 2,147,483,648; the final norm 8192
    assert M.total_params(m) == 549_308_968_960
    # a token's: top 22 of 512
    assert M.activated_params(m) == 56_058_818_560


def test_layer_parts():
    assert [M.layer_parts(SMALL, i) for i in range(4)] == ["M", "*", "M", "-"]
    dense = ModelSpec(layers=3, hidden=64, heads=4, seq_len=16, vocab=8, experts=4, first_dense_layers=1)
    assert [M.layer_parts(dense, i) for i in range(3)] == ["*-", "*E", "*E"]


def test_mixer_kernels_by_hand():
    L = Ly.part_shape(Ly.layer_shape(SMALL, 1, t=2, sp=True), "M")
    # on one of 2 TP ranks: 16 heads, 4 groups, d_l 1024; in_proj 2·1024 + 2·4·128 + 16 = 3088 outputs
    assert mixer.local_dims(L) == (16, 4, 1024, 3088)
    steps = Ly.forward_steps(L)
    names = [st.name for st in steps]
    # one sequence a micro-batch: the transposes between (s, b, d) and (b, s, d) are views, no copies
    assert names == ["mamba.ln", "mamba.ln.ag", "mamba.in_proj", "mamba.conv1d", "mamba.ssd", "mamba.norm",
                     "mamba.out_proj", "mamba.out_proj.rs", "mamba.bda"]
    in_proj = steps[2]
    assert (in_proj.m, in_proj.n, in_proj.k) == (2048, 3088, 1024)
    ssd = steps[4]
    # 2048·(4·1024·128 + 2·128·4·128 + 2·128·1024) = 2048·917,504
    assert ssd.flops == 1_879_048_192
    # per token 2·(4·1024 + 4·4·128) + 8·16 + 8·4·128 + (8 + 4)·1024·128/128 = 12,288 + 128 + 4096 + 12,288 = 28,800
    assert ssd.bytes == 2048 * 28_800
    bwd = Ly.backward_steps(L)
    ssd_bwd = next(st for st in bwd if st.name == "mamba.ssd_bwd")
    # twice the forward plus the chunk states rerun, 2·2048·16·64·128
    assert ssd_bwd.flops == 2 * 1_879_048_192 + 2 * 2048 * 16 * 64 * 128
    assert ssd_bwd.bytes == 2 * 2048 * 28_800
    # two sequences: each transpose copies, reading and writing 2 bytes an element (2·4096 tokens·3088 outputs)
    L2 = Ly.part_shape(Ly.layer_shape(SMALL, 2, t=2, sp=True), "M")
    copies = {st.name: st.bytes for st in Ly.forward_steps(L2) + Ly.backward_steps(L2) if st.name.startswith(
        "mamba.transpose")}
    assert copies == {"mamba.transpose_in": 2 * 2 * 4096 * 3088, "mamba.transpose_out": 2 * 2 * 4096 * 1024,
                      "mamba.transpose_out_bwd": 2 * 2 * 4096 * 1024, "mamba.transpose_in_bwd": 2 * 2 * 4096 * 3088}


def test_mixer_flops_as_megatron_counts_them():
    # 2·s·h·6176 + 7·s·2048·128 + 2·s·2048·h, s = 2048, h = 1024 (in_proj 2·2048 + 2·8·128 + 32 = 6176):
    # 4,194,304·6176 = 25,904,021,504; 7·536,870,912 = 3,758,096,384; 4,194,304·2048 = 8,589,934,592
    assert hybrid.mixer_forward_flops(SMALL) == 25_904_021_504 + 3_758_096_384 + 8_589_934_592
    # the model's layers: two mixers, an attention and an MLP of 4096
    attention = F.part_forward_flops(SMALL, "*")
    mlp = 2.0 * 2 * 2048 * 1024 * 4096
    assert F.layers_forward_flops(SMALL) == pytest.approx(2 * hybrid.mixer_forward_flops(SMALL) + attention + mlp)


def test_mixer_activations_by_hand():
    # zxBCdt 2·6176, the scan's output and the norm's input 2·2048 each, out_proj's input 2·2048: 24,640 B a token,
    # over 2 ranks; the norm input and in_proj's input 2·1024 each, sharded by SP: (4096 + 24,640)/2 · 2048 tokens
    got = layer_activation_bytes(SMALL, 1, 2048, t=2, sp=True, flash=True, part="M")
    assert got == 2048 * (4096 + 24_640) / 2


BASE = """name: h
cluster: {nodes: 1, node: {preset: dgx-h100, host_launch: 0 s}}
model: {layers: %d, hidden: 1024, heads: 8, kv_heads: 4, ffn_hidden: 4096, seq_len: 2048, vocab: 32000,
        activation: squared_relu, biases: false, dropout: false%s}
training: {global_batch: 16, micro_batch: 1, attention: flash}
parallel: {tp: 2, pp: %d, dp: %d, zero: 1, sequence_parallel: true}
"""


def _summary(text, tmp_path, capsys):
    path = tmp_path / "h.yaml"
    path.write_text(text)
    assert main(["run", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("pp, dp, schedule", [(1, 4, ""), (2, 2, ""), (2, 2, ", schedule: interleaved-1f1b, "
                                                                               "virtual_stages: 2"),
                                              (2, 2, ", schedule: dualpipe"),
                                              (2, 2, "}\ntraining: {global_batch: 16, micro_batch: 1, attention: flash, "
                                                     "recompute: selective, recompute_modules: [layernorm, mlp]")])
def test_a_pattern_of_attention_and_mlp_is_the_transformer(pp, dp, schedule, tmp_path, capsys):
    """ "*-*-*-*-" runs the kernels of four transformer layers, in the same order: the same step, MFU, memory and
    closed form; with recompute modules too (layernorm: one norm a part, mlp: the MLP part's). (The host's cost is
    off in BASE: the host issues each layer's steps as one op, so a transformer layer issued as two hybrid layers
    lets the GPU start sooner where the host is the bound. One gradient bucket: with several, the bucket bounds fall
    between a layer's two halves in the one and between layers in the other, and the last bucket differs.)"""
    def spelled(text: str) -> str:  # the schedule, or a training section of recompute modules that replaces BASE's
        if "training" in schedule:
            text = text.replace("training: {global_batch: 16, micro_batch: 1, attention: flash}\n", "")
        return text.replace("sequence_parallel: true", "sequence_parallel: true, grad_bucket: 100 GB" + schedule)
    gpt = spelled(BASE % (4, "", pp, dp))
    hyb = spelled(BASE % (8, ', hybrid_layer_pattern: "*-*-*-*-"', pp, dp))
    a, b = _summary(gpt, tmp_path, capsys), _summary(hyb, tmp_path, capsys)
    assert b["iteration_time_s"] == a["iteration_time_s"]
    assert b["mfu"] == pytest.approx(a["mfu"], rel=1e-12)
    assert b["memory"]["peak_bytes_per_gpu"] == pytest.approx(a["memory"]["peak_bytes_per_gpu"], rel=1e-12)
    ea, eb = (estimate_iteration(load_scenario_text(t, "h.yaml")) for t in (gpt, hyb))
    assert eb.iteration_s == pytest.approx(ea.iteration_s, rel=1e-12)


MOE = """name: m
cluster: {nodes: 1, node: {preset: dgx-h100, host_launch: 0 s}}
model: {layers: %d, hidden: 1024, heads: 8, kv_heads: 4, seq_len: 2048, vocab: 32000, experts: 8, top_k: 2,
        expert_ffn_hidden: 1024, activation: squared_relu, biases: false, dropout: false, mtp_num_layers: 1%s}
training: {global_batch: 16, micro_batch: 1, attention: flash}
parallel: {tp: 2, pp: 2, dp: 2, ep: 2, zero: 1, sequence_parallel: true, grad_bucket: 100 GB}
"""


def test_an_mtp_depth_of_attention_and_moe_is_the_transformers_mtp(tmp_path, capsys):
    """ "*E*E/*E" is two MoE transformer layers and one MTP module around a third: the same step, MFU, memory
    and closed form as the transformer with mtp_num_layers 1. (One gradient bucket: with several, a layer's two
    halves close buckets at other points, and the data-parallel reductions start at other times.)"""
    gpt, hyb = MOE % (2, ""), MOE % (4, ', hybrid_layer_pattern: "*E*E/*E"')
    a, b = _summary(gpt, tmp_path, capsys), _summary(hyb, tmp_path, capsys)
    assert b["iteration_time_s"] == a["iteration_time_s"]
    assert b["mfu"] == pytest.approx(a["mfu"], rel=1e-12)
    assert b["memory"]["peak_bytes_per_gpu"] == pytest.approx(a["memory"]["peak_bytes_per_gpu"], rel=1e-12)
    ea, eb = (estimate_iteration(load_scenario_text(t, "m.yaml")) for t in (gpt, hyb))
    assert eb.iteration_s == pytest.approx(ea.iteration_s, rel=1e-12)


def test_a_hybrid_run_and_its_closed_form(tmp_path, capsys):
    text = BASE % (8, ', hybrid_layer_pattern: "M-M*M-ME", experts: 8, top_k: 2', 1, 4)
    text = text.replace("dp: 4,", "dp: 4, ep: 4,")
    s = _summary(text, tmp_path, capsys)
    assert 0 < s["mfu"] < 1
    est = estimate_iteration(load_scenario_text(text, "h.yaml"))
    assert est.iteration_s == pytest.approx(s["iteration_time_s"], rel=0.10)


@pytest.mark.parametrize("extra, key, words", [
    (', hybrid_layer_pattern: "M*MD"', "model.hybrid_layer_pattern", "'D' .DeepSeek sparse attention. is not modelled"),
    (', hybrid_layer_pattern: "M*M"', "model.hybrid_layer_pattern", "3 symbols, but layers is 4"),
    (', hybrid_layer_pattern: "M*ME"', "model.hybrid_layer_pattern", "E layers need experts"),
    (', hybrid_layer_pattern: "M*M-", mamba_num_groups: 3', "model.mamba_num_groups", "multiple of"),
    (', hybrid_layer_pattern: "M*M-", mamba_num_heads: 33, mamba_num_groups: 3', "parallel.tp",
     "tp .2. must divide the Mamba mixer's mamba_num_heads .33."),
    (', mamba_num_heads: 32', "model.mamba_num_heads", "needs a hybrid model"),
    (', hybrid_layer_pattern: "M*M-", mtp_num_layers: 1', "model.mtp_num_layers",
     "must be the MTP depths of hybrid_layer_pattern .0"),
    (', hybrid_layer_pattern: "M*M-/*-/-*", mtp_num_layers: 2', "model.hybrid_layer_pattern",
     "all MTP patterns must be identical"),
    (', hybrid_layer_pattern: "M*M-|"', "model.hybrid_layer_pattern", "a pipeline-stage boundary"),
])
def test_the_rule_books_refusals(extra, key, words):
    with pytest.raises(ScenarioError, match=words) as err:
        load_scenario_text(BASE % (4, extra, 1, 4), "h.yaml")
    assert err.value.key == key


def test_context_parallelism_over_mamba_by_hand():
    """Megatron-Core's MambaContextParallel: five all-to-alls of this rank's z, x, B, C and dt into the whole sequence
    of 1/cp of the heads, the scan on that, one all-to-all of its output back."""
    L = Ly.part_shape(Ly.layer_shape(SMALL, 1, t=2, sp=True, cp=2), "M")
    # this rank: 1024 of the 2048 tokens, 16 heads, 4 groups, d_l 1024; the scan: 2048 tokens, 8 heads, 2 groups, 512
    assert mixer.scan_dims(L) == (2048, 8, 2, 512)
    fwd = {st.name: st for st in Ly.forward_steps(L)}
    a2a = {n: st.bytes for n, st in fwd.items() if n.startswith("mamba.cp_a2a")}
    # z, x 1024 tokens of 1024, B, C of 4 groups of 128, dt of 16, y of 1024; 2 bytes each
    assert a2a == {"mamba.cp_a2a.z": 1024 * 1024 * 2, "mamba.cp_a2a.x": 1024 * 1024 * 2,
                   "mamba.cp_a2a.B": 1024 * 512 * 2, "mamba.cp_a2a.C": 1024 * 512 * 2,
                   "mamba.cp_a2a.dt": 1024 * 16 * 2, "mamba.cp_a2a.y": 1024 * 1024 * 2}
    # the scan on 2048 tokens: 2048·(4·512·128 + 2·128·2·128 + 2·128·512) = 2048·458,752: half the rank's of cp 1
    assert fwd["mamba.ssd"].flops == 2048 * 458_752
    names = list(fwd)
    assert names.index("mamba.in_proj") < names.index("mamba.cp_a2a.z") < names.index("mamba.conv1d")
    assert names.index("mamba.ssd") < names.index("mamba.cp_a2a.y") < names.index("mamba.norm")
    back = [st.name for st in Ly.backward_steps(L)]
    assert back.index("mamba.norm_bwd") < back.index("mamba.cp_a2a.y_bwd") < back.index("mamba.ssd_bwd") \
        < back.index("mamba.cp_a2a.z_bwd") < back.index("mamba.in_proj.dgrad")


def test_context_parallelism_needs_heads_per_rank():
    text = (BASE % (4, ', hybrid_layer_pattern: "M*M-", mamba_num_heads: 8, mamba_num_groups: 2', 1, 1))
    text = text.replace("dp: 1,", "dp: 1, cp: 4,").replace("global_batch: 16", "global_batch: 1")
    # 8 heads over tp 2: 4 a rank; cp 4 divides them; 2 groups: 1 a rank, which divides cp
    load_scenario_text(text, "h.yaml")
    with pytest.raises(ScenarioError, match="cp .8. must divide the Mamba heads of a TP rank .4.") as err:
        load_scenario_text(text.replace("cp: 4", "cp: 8").replace("nodes: 1", "nodes: 2"), "h.yaml")
    assert err.value.key == "parallel.cp"


def test_the_summary_gives_each_layer_kinds_kernel_time(tmp_path, capsys):
    """hybrid_layers_s: per layer kind, the kernels its layers run on a GPU in an iteration: here 4 micro-batches
    (16 / (1 × 4)) of each layer's forward and backward kernels, costed as kernel_cost costs them."""
    from emulator.workload.kernel_cost import kernel_cost
    from emulator.workload.plan import make_plan
    from emulator.workload.steps import Kernel

    text = BASE % (4, ', hybrid_layer_pattern: "M*M-"', 1, 4)
    s = _summary(text, tmp_path, capsys)
    sc = load_scenario_text(text, "h.yaml")
    plan = make_plan(sc)
    want: dict[str, float] = {}
    for u in plan.chunk_units[0]:
        if u.name.startswith("layer"):
            kind = {"M": "mamba", "*": "attention", "-": "mlp"}[M.layer_parts(sc.model, u.layer)]
            kernels = [k for k in u.fwd + u.bwd if isinstance(k, Kernel)]
            want[kind] = want.get(kind, 0.0) + 4 * sum(kernel_cost(k, sc.cluster.node.gpu)[0] for k in kernels)
    assert s["hybrid_layers_s"] == pytest.approx(want, rel=1e-9)


def test_a_repeated_mtp_layer_holds_one_module_s_weights():
    # Nemotron 3 Super's two MTP depths as Megatron-Core's mtp_use_repeated_layer builds them: one module, run twice
    from dataclasses import replace

    from emulator.scenario import load_scenario
    from emulator.workload.memory import _mtp_stage_params, stage_memory
    from emulator.workload.plan import make_plan

    path = "scenarios/nemotron-3-super-64-gb200.yaml"
    two, one = (load_scenario(path, sets) for sets in ([], ["model.mtp_use_repeated_layer=true"]))
    m = replace(M.resolve(two.model), vocab=M.padded_vocab(M.resolve(two.model).vocab, two.parallel.tp))
    dense, expert = _mtp_stage_params(m, two.parallel, 1, False)  # one module on a GPU: TP 2, EP 64
    a, b = stage_memory(two)[0].breakdown, stage_memory(one)[0].breakdown
    # one module fewer: bf16 weights and gradients, 2 B each; Adam's 12 B over DP 32 (dense) and over the experts'
    # data parallelism, TP 2 x DP 32 / EP 64 = 1
    assert a["params"] - b["params"] == a["grads"] - b["grads"] == 2 * (dense + expert)
    assert a["optimizer"] - b["optimizer"] == pytest.approx(12 * dense / 32 + 12 * expert)
    assert a["activations"] == b["activations"]  # both depths still run and keep their activations
    units = [u for u in make_plan(one).chunk_units[0] if u.name.startswith("mtp")]
    assert [u.name for u in units] == ["mtp0", "mtp1"] and units[1].params == units[1].expert_params == 0.0
    assert units[1].bwd == units[0].bwd  # the second depth's compute is the first's
