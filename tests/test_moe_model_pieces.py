"""Multi-token prediction, Megatron's pipeline layout and per-module recompute (issue 36, item 4):
hand-computed parameters and FLOPs of one MTP module, the stage assignment of a layout string, the
memory and FLOPs of a recomputed module, and the errors (exit 2, one line)."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest

from emulator.errors import ScenarioError
from emulator.program import SEND
from emulator.scenario import catalog
from emulator.scenario.reader import load_scenario_text
from emulator.scenario.stages import chunk_layers, layout_chunks, parse_layout, stage_layers
from emulator.workload import flops as F
from emulator.workload import layer as Ly
from emulator.workload import models as M
from emulator.workload import mtp as MTP
from emulator.workload.activations import layer_activation_bytes
from emulator.workload.builder import build_program
from emulator.workload.memory import memory_report
from emulator.workload.recompute import backward_with_modules

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- the layout string ------------------------------------------------------------------------

def test_megatron_example_layout_assigns_stages():
    # Megatron's docs example (pipeline_parallel_layout.md): PP 16, VPP 2, 61 layers and one MTP layer:
    # "Et*3|(tt|)*29,m|L" unrolls to 1 + 29 + 1 + 1 = 32 stages
    stages = parse_layout("Et*3|(tt|)*29,m|L")
    assert len(stages) == 32 and stages[0] == "Ettt" and stages[1] == "tt" and stages[-2:] == ("m", "L")
    plan = layout_chunks("Et*3|(tt|)*29,m|L", 61, 1, 16, 2)
    assert plan.layers == (3,) + (2,) * 29 + (0, 0)  # 3 + 58 = 61
    assert plan.mtp_chunk == 30  # chunk 30 = virtual stage 1 of pipeline rank 14
    split = stage_layers(plan.layers, 16)
    # the table of the docs: rank 0 holds E + 3 and 2; ranks 1-13 2 and 2; rank 14 2 and the MTP; 15 2 and L
    assert split[0] == (3, 2) and split[7] == (2, 2) and split[14] == (2, 0) and split[15] == (2, 0)


def test_layout_of_embedding_and_loss_accounting_is_the_first_last_split():
    # Qwen3-235B: 94 layers, the embedding and loss each counted as a layer, 96 over 32 chunks of 3
    assert layout_chunks("Ett|(ttt|)*30,ttL", 94, 0, 8, 4).layers == chunk_layers(94, 8, 4, 2, 2)


@pytest.mark.parametrize("text, words", [
    ("Et*4|t*4|tx|L", "invalid symbol 'x'"),
    ("t*4|Et*4|t*4|tL", "must start with the embedding E"),
    ("Et*4|t*4|t*4|tmL", "1 MTP layers m, but model.mtp_num_layers is 0"),
    ("Et*4|t*4|t*4|t*2L", "the layout has 14 transformer layers t, but model.layers is 13"),
])
def test_layout_rules(text, words):
    with pytest.raises(ScenarioError) as err:
        layout_chunks(text, 13, 0, 4, 1)
    assert words in err.value.message


def test_mtp_must_follow_the_layers_and_sit_in_a_last_virtual_stage():
    with pytest.raises(ScenarioError, match="before the MTP layers"):
        layout_chunks("Et|m|t|L", 2, 1, 4, 1)
    with pytest.raises(ScenarioError, match="last virtual stage"):
        layout_chunks("Et|ttm||L", 3, 1, 2, 2)  # chunk 1 is virtual stage 0 of rank 1


# --- multi-token prediction -------------------------------------------------------------------

def test_deepseek_v3_mtp_module_parameters():
    m = catalog.model_preset("deepseek-v3")
    assert m.mtp_num_layers == 1
    # eh_proj 2h·h = 2·7168² = 102,760,448; enorm, hnorm, final norm (RMSNorm) 3·7168 = 21,504
    assert MTP.mtp_extra_params(m) == 102_781_952
    # plus one MoE layer (tests/test_moe.py: 11,507,286,016)
    assert MTP.mtp_params(m) == 11_507_286_016 + 102_781_952
    assert M.total_params(m) == 671_026_404_352  # the main model, as published; the MTP module is apart


def test_deepseek_v3_mtp_flops_as_megatron_counts_them():
    m = catalog.model_preset("deepseek-v3")
    # per sequence of 4096: one MoE layer 6,169,183,649,792 (tests/test_mla.py), norms and eh_proj
    # 2·4096·(3·7168 + 2·7168²) = 841,989,750,784, one more logits pass 2·4096·7168·129,280 = 7,591,354,695,680
    assert F.mtp_forward_flops(m) == 6_169_183_649_792 + 841_989_750_784 + 7_591_354_695_680
    no_mtp = dataclasses.replace(m, mtp_num_layers=0)
    assert F.model_flops(m, 8) - F.model_flops(no_mtp, 8) == pytest.approx(3 * 8 * 14_602_528_096_256, rel=1e-12)


TINY = """
name: tiny-mtp
cluster: {{nodes: 1, node: dgx-h100}}
model: {{layers: 5, hidden: 256, heads: 4, seq_len: 128, vocab: 1024, swiglu: true, experts: 8, top_k: 2,
        expert_ffn_hidden: 128, mtp_num_layers: 1}}
training: {{global_batch: 8, micro_batch: 1}}
parallel: {{tp: 1, pp: 4, dp: 2, ep: 2, pipeline_model_parallel_layout: "{layout}"}}
"""


def test_standalone_mtp_stage_sends_both_hidden_states_and_shares_the_embedding():
    sc = load_scenario_text(TINY.format(layout="Ett|ttt|m|L"))
    prog = build_program(sc)
    sends = {}
    for op in prog.ops:
        if op.kind == SEND and op.name == "mb0.send_act":
            sends[op.stage] = op.bytes
    # b·s·h·2 bytes = 1·128·256·2 = 65,536 between the layers; after the MTP stage its hidden states go
    # beside the model's: (1 + 1)·65,536
    assert sends == {0: 65_536, 1: 65_536, 2: 131_072}
    ar = [op for op in prog.ops if op.name == "embedding_grad_all_reduce"]
    # the word embedding's gradient is all-reduced between stage 0 and the MTP's stage 2 (untied: not 3);
    # ranks: pp stride dp·tp = 2
    assert {op.group for op in ar} == {(0, 4), (1, 5)}
    assert all(op.bytes == 1024 * 256 * 4 for op in ar)  # V·h fp32 main gradients (grad_reduce auto)


def test_mtp_beside_the_loss_adds_the_module_and_a_head_pass():
    sc = load_scenario_text(TINY.format(layout="Ett|tt|t|mL"))
    prog = build_program(sc)
    names = {op.name for op in prog.ops if op.stage == 3}
    assert any(n.startswith("mb0.mtp0.fwd.") for n in names)  # the module, on the loss's stage
    assert any(n.startswith("mb0.head.fwd.") and n.endswith("loss.mtp") for n in names)  # its head pass
    # no stage after the MTP: every activation send is b·s·h
    assert {op.bytes for op in prog.ops if op.kind == SEND and op.name.endswith("send_act")} == {65_536}
    ar = {op.group for op in prog.ops if op.name == "embedding_grad_all_reduce"}
    assert ar == {(0, 6), (1, 7)}  # stage 0 and the MTP's stage 3


# --- per-module recompute ------------------------------------------------------------------------

GPT = catalog.model_preset("gpt3-1.3b")  # h 2048, f 8192, GeLU, dropout, 24 layers


def test_layernorm_and_mlp_recompute_free_their_outputs():
    base = layer_activation_bytes(GPT, 1, 2048, recompute="selective", flash=True, modules=())
    ln = layer_activation_bytes(GPT, 1, 2048, recompute="selective", flash=True, modules=("layernorm",))
    mlp = layer_activation_bytes(GPT, 1, 2048, recompute="selective", flash=True, modules=("mlp",))
    # layernorm: the two norm outputs (QKV and MLP inputs), 2 B·h each: s·b·4h = 2048·4·2048
    assert base - ln == 16_777_216
    # mlp: the up output (2f) and the GeLU output (2f) per token: s·b·4f = 2048·4·8192
    assert base - mlp == 67_108_864


def test_mlp_recompute_reruns_its_gemms_in_the_backward():
    L = Ly.layer_shape(GPT, 1, flash=True)
    bwd = backward_with_modules(L, ("mlp",))
    rec = [st for st in bwd if getattr(st, "category", "") == "recompute"]
    assert [st.name for st in rec] == ["mlp.up", "gelu", "mlp.down"]
    # the two GEMMs again: 2·T·h·f each, 2·2·2048·2048·8192 = 137,438,953,472 (+ GeLU's 8 per element)
    assert sum(st.flops for st in rec if st.kind == "gemm") == 137_438_953_472
    # hardware FLOPs count it for every layer: 24 of them, per sequence
    assert F.recompute_flops(GPT, 1, "selective", True, ("mlp",)) == 24 * 137_438_953_472
    # the recompute comes before the MLP's backward
    first_mlp = next(i for i, st in enumerate(bwd) if st.name.startswith("mlp.") and st.category != "recompute")
    assert bwd.index(rec[-1]) < first_mlp


def test_mla_up_proj_recompute_before_the_attention_core():
    m = catalog.model_preset("deepseek-v3")
    L = Ly.layer_shape(m, 1, 2, True, 1, 64, 2, True, etp=1)
    bwd = backward_with_modules(L, ("mla_up_proj",))
    rec = [st.name for st in bwd if st.category == "recompute"]
    assert rec == ["q_up.ag", "q_up", "kv_up.ag", "kv_up", "rope"]
    core = next(i for i, st in enumerate(bwd) if st.name.startswith("attn."))
    assert [st.name for st in bwd[core - 5:core]] == rec


def test_recipe_scenarios_memory_with_mtp_and_layout():
    sc = load_scenario_text(open(os.path.join(ROOT, "scenarios", "deepseek-v3-1024-h100.yaml")).read(),
                            os.path.join(ROOT, "scenarios", "deepseek-v3-1024-h100.yaml"))
    assert sc.parallel.virtual_stages == 1
    r = memory_report(sc)
    assert r.fits


# --- errors: exit 2, one line ----------------------------------------------------------------------

BAD = """
name: bad
cluster: {nodes: 1, node: dgx-h100}
model: {preset: gpt3-1.3b}
training: {global_batch: 16, micro_batch: 1, recompute: selective}
parallel: {tp: 1, pp: 4, dp: 2, pipeline_model_parallel_layout: "Et*5|t*6|t*6|t*7L"}
"""


@pytest.mark.parametrize("override, words", [
    ("parallel.virtual_stages=2", "parallel.virtual_stages: virtual_stages (2) conflicts with pipeline_model_"),
    ("parallel.first_chunk_layers=3", "parallel.first_chunk_layers: pipeline_model_parallel_layout places every"),
    ("parallel.pipeline_model_parallel_layout=Et*5|t*6|t*7L", "has 3 stages, which must be pp (4) x virtual"),
    ("training.recompute_modules=[attn]", "training.recompute_modules[0]: expected one of core_attn"),
    ("training.recompute=full", None),
])
def test_errors_exit_2_with_one_line(tmp_path, override, words):
    path = tmp_path / "bad.yaml"
    text = BAD if override != "training.recompute=full" else BAD.replace(
        "recompute: selective", "recompute: full, recompute_modules: [mlp]")
    path.write_text(text)
    args = [] if words is None else ["--set", override]
    r = subprocess.run([sys.executable, "-m", "emulator", "run", str(path), *args], capture_output=True, text=True,
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1
    assert (words or "recompute_modules are recomputed under recompute: selective") in lines[0]


def test_virtual_stages_beside_a_layout_may_repeat_its_count():
    # Megatron-Core takes virtual_pipeline_model_parallel_size beside a layout when they agree (transformer_config.py
    # @ d98e8a64dd); the bridge's Llama 3 70B H100 FP8 recipe gives both. BAD's layout: 4 stages over pp 4, 1 each
    from emulator.scenario import load_scenario_text

    sc = load_scenario_text(BAD.replace("pp: 4,", "pp: 4, virtual_stages: 1,"), "x.yaml")
    assert sc.parallel.virtual_stages == 1


def test_the_embedding_and_loss_counted_in_the_split_as_megatron_core_counts_them():
    # Llama 3 405B: 126 layers + the embedding + the loss = 128 over PP 16 x 2 virtual stages = 32 chunks of 4; the
    # first chunk holds 4 - 1 = 3 layers beside the embedding, the last 3 beside the loss, the 30 others 4 each
    # (30 x 4 + 3 + 3 = 126)
    from emulator.scenario import load_scenario
    from emulator.workload import models as M
    from emulator.workload.plan import chunk_plan

    sets = ["parallel.first_chunk_layers=null", "parallel.last_chunk_layers=null", "parallel.virtual_stages=2",
            "parallel.schedule=interleaved-1f1b", "parallel.account_for_embedding_in_pipeline_split=true",
            "parallel.account_for_loss_in_pipeline_split=true"]
    sc = load_scenario("scenarios/llama3-405b-balanced-pp-h100.yaml", sets)
    assert (sc.parallel.first_chunk_layers, sc.parallel.last_chunk_layers) == (3, 3)
    assert chunk_plan(M.resolve(sc.model), sc.parallel).layers == (3,) + (4,) * 30 + (3,)
    # only the embedding: 127 layers do not split over 32 chunks, refused by key
    with pytest.raises(ScenarioError, match="127, must split evenly") as err:
        load_scenario("scenarios/llama3-405b-balanced-pp-h100.yaml", sets[:-1])
    assert err.value.key == "parallel.account_for_embedding_in_pipeline_split"


EMPTY_STAGE = """
name: empty-stage
cluster: {nodes: 1, node: dgx-a100}
model: {preset: gpt3-125m}
training: {global_batch: 8, micro_batch: 1, precision: bf16}
parallel: {tp: 1, pp: 4, dp: 2, schedule: 1f1b, pipeline_model_parallel_layout: "Et*6||t*6|L"}
"""


def test_an_empty_pipeline_stage_passes_the_hidden_states_on():
    # Megatron-Core's layout parser keeps an empty stage ("||", pipeline_parallel_layer_layout.py @ d98e8a64dd:
    # "(empty stage)"), as Megatron-Bridge's GLM-5.2 H100 recipe uses: it holds nothing and forwards what it receives
    from emulator.run.simulation import simulate
    from emulator.scenario import load_scenario_text
    from emulator.workload.memory import stage_memory

    sc = load_scenario_text(EMPTY_STAGE, "x.yaml")
    stages = stage_memory(sc)
    assert stages[1].breakdown["params"] == stages[1].breakdown["activations"] == 0.0
    # the loss stage holds the head alone: GPT-3 125M's 50,257-row vocabulary padded to 50,304, x 768 x 2 B =
    # 77,266,944 B of bf16 weights, and the final LayerNorm's 2 x 768 x 2 B = 3072 B: 77,270,016 B
    assert stages[3].breakdown["params"] == 77_270_016
    r = simulate(sc)
    assert r.iteration_time_s > 0
    # stage 1 receives each micro-batch's hidden states, 1 x 2048 x 768 x 2 B = 3,145,728 B, and sends them on after
    # a zero-cost join on that receive; its only compute
    mine = [op for op in r.program.ops if op.stage == 1 and op.microbatch == 0 and op.category != "host"]
    fwd = [(op.name, op.bytes) for op in mine if op.name.endswith(("recv_act", "join", "send_act"))]
    assert fwd[:3] == [("mb0.recv_act", 3_145_728), ("mb0.join", 0.0), ("mb0.send_act", 3_145_728)]
    assert all(op.flops == 0 for op in mine)
