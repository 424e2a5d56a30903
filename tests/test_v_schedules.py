"""V-shaped pipeline schedules (zb-v, dualpipev) end to end: the rules refused by name, the V placement in the
built program (no tied-embedding all-reduce, the V's tip sends nothing), the memory, and the bubble against
1F1B on a dense layout and on a reduced DeepSeek-V3 layout."""
import os
import subprocess
import sys

import pytest

from emulator.errors import ScenarioError
from emulator.outputs.summary import summarize
from emulator.program import RECV, SEND
from emulator.run.simulation import simulate
from emulator.scenario import load_scenario, load_scenario_text
from emulator.workload.builder import build_program
from emulator.workload.memory import stage_memory
from emulator.workload.plan import make_plan

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DSV3 = os.path.join(ROOT, "scenarios", "deepseek-v3-1024-h100.yaml")

# GPT-3 1.3B (24 layers, tied embeddings) on one DGX A100: tp 2, pp 4, dp 1, 16 micro-batches per pipeline
DENSE = """
name: v
cluster: {nodes: 1, node: dgx-a100}
model: {preset: gpt3-1.3b}
training: {global_batch: 32, micro_batch: 2}
parallel: {tp: 2, pp: 4, dp: 1}
"""
# DeepSeek-V3's layout cut to 7 layers (3 dense, 4 MoE) and one MTP layer on 4 DGX H100: tp 2, pp 4, dp 4, ep 8
# (etp 1, DeepEP), 16 micro-batches; 1F1B on 4 stages, the V schedules on the same layers in 8 chunks
V3_SETS = ["cluster.nodes=4", "model.layers=7", "parallel.pp=4", "parallel.dp=4", "parallel.ep=8",
           "training.global_batch=64"]
V3_LAYOUT = {"1f1b": "Et*2|t*2|t*2|t,mL", "zb-h1": "Et*2|t*2|t*2|t,mL", "zb-v": "Et|t|t|t|t|t|t|mL",
             "dualpipev": "Et|t|t|t|t|t|t|mL", "dualpipe": "Et*2|t*2|t*2|t,mL"}


def dense(*sets: str):
    return load_scenario_text(DENSE, "v.yaml", sets)


def v3(schedule: str):
    return load_scenario(DSV3, V3_SETS + [f"parallel.schedule={schedule}",
                                          f"parallel.pipeline_model_parallel_layout={V3_LAYOUT[schedule]}"])


@pytest.mark.parametrize("sets,key,needle", [
    (["parallel.schedule=zb-v", "parallel.virtual_stages=3"], "parallel.virtual_stages",
     "zb-v places two chunks on each pipeline rank in a V: virtual_stages must be 2 (or unset), got 3"),
    (["parallel.schedule=dualpipev", "parallel.virtual_stages=1"], "parallel.virtual_stages",
     "virtual_stages must be 2 (or unset), got 1"),
    # 16 / (2 · 1) = 8 micro-batches is 2·pp; 14 is not
    (["parallel.schedule=dualpipev", "training.global_batch=14"], "training.global_batch",
     "dualpipev needs at least 2*pp = 8 micro-batches per pipeline (global_batch/(micro_batch*dp) = 7"),
    (["parallel.schedule=zb-v", "parallel.pipeline_model_parallel_layout=Et*6|t*6|t*6|t*6L"],
     "parallel.pipeline_model_parallel_layout", "the layout needs 2*pp = 8 stages in model order, got 4"),
    # pp 3 on 6 GPUs with tp 2 (24 layers split in 3)
    (["parallel.schedule=dualpipe", "parallel.pp=3", "cluster.node.gpus_per_node=6"], "parallel.pp",
     "dualpipe needs an even pp (rank i and pp-1-i hold the same two stages), got 3"),
    (["parallel.schedule=dualpipe", "training.global_batch=18"], "training.global_batch",
     "dualpipe needs an even number of micro-batches per pipeline, at least 2*pp = 8 (global_batch/"
     "(micro_batch*dp) = 9"),
    (["parallel.schedule=dualpipe", "training.global_batch=12"], "training.global_batch", "= 6; deepseek-ai"),
    (["parallel.schedule=dualpipe", "parallel.virtual_stages=2"], "parallel.virtual_stages",
     "virtual_stages > 1 needs schedule: interleaved-1f1b"),
])
def test_rules_refused_by_name(sets, key, needle):
    with pytest.raises(ScenarioError) as err:
        dense(*sets)
    assert err.value.key == key and needle in str(err.value)


def test_cli_exits_2_with_one_line():
    # the DeepSeek-V3 scenario's layout has pp = 16 stages: a V needs 32
    out = subprocess.run([sys.executable, "-m", "emulator", "run", DSV3, "--set", "parallel.schedule=zb-v"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert "parallel.pipeline_model_parallel_layout" in out.stderr and "2*pp = 32 stages" in out.stderr


def test_the_a2a_overlap_is_refused_with_a_v():
    with pytest.raises(ScenarioError, match="runs Megatron's combined 1F1B steps"):
        load_scenario(DSV3, V3_SETS + ["parallel.schedule=zb-v", "parallel.overlap_moe_expert_parallel_comm=true",
                                       f"parallel.pipeline_model_parallel_layout={V3_LAYOUT['zb-v']}"])


@pytest.mark.parametrize("schedule", ["zb-v", "dualpipev"])
def test_v_placement_in_the_program(schedule):
    sc = dense(f"parallel.schedule={schedule}")
    assert sc.parallel.virtual_stages == 2  # set for the V when unset
    ops = build_program(sc).ops
    # rank 0 (tp rank 0 of stage 0) holds chunks 0 and 7: the embedding and the head, 3 layers each
    assert {o.stage for o in ops if o.rank == 0 and o.stage >= 0} == {0, 7}
    assert {o.stage for o in ops if o.rank == 6 and o.stage >= 0} == {3, 4}  # stage 3: the V's tip
    # tied embeddings on one rank: no embedding all-reduce; the tip's chunks exchange nothing
    assert not [o for o in ops if o.name == "embedding_grad_all_reduce"]
    tip = [o for o in ops if o.rank == 6 and o.kind in (SEND, RECV)]
    assert tip and all(o.peer == 4 for o in tip)  # only with stage 2 (rank 4), on both legs
    # in on the first leg, out on the second (the _v streams); the gradients the other way
    assert {o.stream for o in tip} == {"pp_recv_fwd", "pp_send_fwd_v", "pp_recv_bwd_v", "pp_send_bwd"}


def test_v_memory():
    # activations: 1F1B holds p − s micro-batches of a 6-layer stage (24, 18, 12, 6 layers' worth); ZB-V 2p = 8
    # chunks of 3 layers (24) on every stage (the paper's p·M_B); DualPipeV PP + 1 = 9 (27, the README's)
    acts = {s: [r.breakdown["activations"] for r in stage_memory(dense(f"parallel.schedule={s}"))]
            for s in ("1f1b", "zb-v", "dualpipev")}
    one = acts["1f1b"][3] / 6  # a layer's activations of one micro-batch (stage 3: 1 micro-batch of 6 layers)
    assert acts["1f1b"][1] == pytest.approx(18 * one) and acts["1f1b"][2] == pytest.approx(12 * one)
    assert acts["zb-v"][1:] == pytest.approx([24 * one] * 3)
    assert acts["dualpipev"][1:] == pytest.approx([27 * one] * 3)
    # the head sits on rank 0 under a V: its logits' workspace too
    work = {s: [r.breakdown["workspace"] for r in stage_memory(dense(f"parallel.schedule={s}"))]
            for s in ("1f1b", "zb-v")}
    assert work["zb-v"][0] == work["1f1b"][3] > work["zb-v"][3] == work["1f1b"][0]


@pytest.mark.parametrize("schedule", ["zb-v", "dualpipev"])
def test_the_bubble_shrinks_on_a_dense_layout(schedule):
    base = summarize(simulate(dense(), record_links=False))
    got = summarize(simulate(dense(f"parallel.schedule={schedule}"), record_links=False))
    assert got["breakdown_s"]["compute"] == pytest.approx(base["breakdown_s"]["compute"], rel=1e-6)
    assert got["breakdown_s"]["bubble"] < 0.6 * base["breakdown_s"]["bubble"]
    assert got["iteration_time_s"] < base["iteration_time_s"]


def test_the_bubble_shrinks_on_the_deepseek_v3_layout():
    bubble = {s: summarize(simulate(v3(s), record_links=False))["breakdown_s"]["bubble"]
              for s in ("1f1b", "zb-v", "dualpipev")}
    assert bubble["zb-v"] < 0.9 * bubble["1f1b"] and bubble["dualpipev"] < 0.9 * bubble["1f1b"]


def test_dualpipe_program_and_memory():
    sc = dense("parallel.schedule=dualpipe")
    assert sc.parallel.virtual_stages == 1  # the model's 4 stages; each rank holds two of them
    ops = build_program(sc).ops
    # rank 0 (stage 0) runs stage 0 forward-bound (virtual stage 0) and stage 3 reverse-bound (virtual stage 7)
    assert {o.stage for o in ops if o.rank == 0 and o.stage >= 0} == {0, 7}
    # the pair's gradient all-reduces: ranks 0 and 6 (stages 0 and 3, tp rank 0), one a chunk (the gradients
    # are reduced overlapped), stage 3 first (it finishes first on both), together both its stages' gradients:
    # 2 · (6 layers + the embedding or the head) of this GPU's TP share, in fp32 (bf16 training)
    pair = [o for o in ops if o.name.startswith("dualpipe_grad_all_reduce") and o.rank == 0]
    assert [o.name for o in pair] == ["dualpipe_grad_all_reduce.stage3", "dualpipe_grad_all_reduce.stage0"]
    assert {o.group for o in pair} == {(0, 6)}
    assert not [o for o in ops if o.name == "embedding_grad_all_reduce"]
    mem = {s: stage_memory(dense(f"parallel.schedule={s}")) for s in ("1f1b", "dualpipe")}
    # parameters x2 (the README's 2x): rank 0 holds stage 0 and stage 3, as 1F1B's stage 0 plus its stage 3,
    # less the head's copy of the tied word embedding (vocab 50,257 padded to 50,432 x 2048 / tp 2, 2 bytes): the rank's
    # embedding serves it
    assert mem["dualpipe"][0].breakdown["params"] == pytest.approx(
        mem["1f1b"][0].breakdown["params"] + mem["1f1b"][3].breakdown["params"] - 2 * 50432 * 2048 / 2, rel=1e-12)
    assert mem["dualpipe"][0].breakdown["params"] == mem["dualpipe"][3].breakdown["params"]
    plan = make_plan(sc)  # the gradients of rank 0's units, fp32 (bf16 training reduces in fp32)
    assert [o.bytes for o in pair] == pytest.approx([4 * sum(u.params for u in plan.chunk_units[vs]) for vs in (7, 0)])
    assert [u.name for u in plan.chunk_units[7]][-1] == "head" and plan.chunk_units[7][0].name == "layer18"
    # activations: PP + 1 = 5 stage micro-batches of 6 layers on every rank (stage 3 of 1F1B: 1 of 6)
    one = mem["1f1b"][3].breakdown["activations"] / 6
    assert [r.breakdown["activations"] for r in mem["dualpipe"]][1:3] == pytest.approx([30 * one] * 2)


def test_dualpipe_bubble_shrinks():
    base = summarize(simulate(dense(), record_links=False))
    got = summarize(simulate(dense("parallel.schedule=dualpipe"), record_links=False))
    assert got["breakdown_s"]["bubble"] < 0.6 * base["breakdown_s"]["bubble"]
    v3_base = summarize(simulate(v3("1f1b"), record_links=False))["breakdown_s"]["bubble"]
    assert summarize(simulate(v3("dualpipe"), record_links=False))["breakdown_s"]["bubble"] < 0.9 * v3_base


def test_dualpipe_pair_all_reduce_starts_per_chunk():
    # gpt3-1.3b, tp 1, pp 4, dp 2 (ranks 2 apart on the pipeline: rank 0's pair is rank 6): rank 0 holds stage 0
    # (6 layers + the embedding, 50,304·2048 + 2048·2048: 302,149,632 + 107,216,896 = 409,366,528 parameters)
    # and stage 3 (6 layers + the final norm 2·2048: 302,153,728); fp32 gradients
    sets = ["parallel.schedule=dualpipe", "parallel.tp=1", "parallel.dp=2"]
    sc = dense(*sets)
    ops = build_program(sc).ops
    by_id = {o.id: o for o in ops}
    mine = [o for o in ops if o.rank == 0]
    pair = [o for o in mine if o.name.startswith("dualpipe_grad_all_reduce")]
    assert [(o.name, o.group, o.bytes) for o in pair] == [
        ("dualpipe_grad_all_reduce.stage3", (0, 6), 4 * 302_153_728),
        ("dualpipe_grad_all_reduce.stage0", (0, 6), 4 * 409_366_528)]
    # rank 6 holds the same two stages and finishes stage 3 (its own) first too: the same calls in the same order
    assert [(o.name, o.bytes) for o in ops if o.rank == 6 and o.name.startswith("dualpipe_grad")] == \
        [(o.name, o.bytes) for o in pair]
    # stage 3's all-reduce waits only for its chunk's backwards, which end before rank 0's last compute
    last = max(o.id for o in mine if o.stream == "compute" and o.category != "optimizer")
    assert max(pair[0].deps) < last and all(by_id[d].stage == 7 for d in pair[0].deps)
    # on the dp stream: stage 3's pair all-reduce, its DP buckets (after it), then stage 0's and its buckets
    dp = [o for o in mine if o.stream == "dp"]
    first = [o for o in dp if o.id < pair[1].id and o.name.startswith("grad_")]
    assert dp[0] is pair[0] and first and all(pair[0].id in o.deps for o in first)
    # summed over both, the DP all-reduces move both chunks' gradients, as before
    assert sum(o.bytes for o in dp if o.name.startswith("grad_")) == 4 * (302_153_728 + 409_366_528)
    # without the overlap, one pair all-reduce of both chunks after the flush, as DualPipe's example sums them
    # after its step (examples/example_dualpipe.py)
    flush = build_program(dense(*sets, "parallel.overlap_grad_reduce=false")).ops
    one = [o for o in flush if o.rank == 0 and o.name.startswith("dualpipe_grad")]
    assert [(o.name, o.bytes) for o in one] == [("dualpipe_grad_all_reduce", 4 * 711_520_256)]
    got = {k: summarize(simulate(x, record_links=False))["breakdown_s"]["exposed_comm"]
           for k, x in (("per chunk", sc), ("flush", dense(*sets, "parallel.overlap_grad_reduce=false")))}
    assert got["per chunk"] < 0.7 * got["flush"]
