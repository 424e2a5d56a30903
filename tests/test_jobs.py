"""Several jobs on one fabric (``jobs:``): placement, the shared run against each job alone,
the summary's jobs and shared_links, the trace's process per job, and bad input.

The hand-checked cases run a 1 GB all-reduce on 2 ranks per job (a trace) on 4 one-GPU nodes
with one 100 GB/s NIC each, on a fat-tree of 2 leaves of 2 nodes, with every latency and
efficiency at 0 / 1: a 2-rank ring all-reduce of S bytes costs 2(n−1)/n·S/B = S/B at its
bottleneck's rate B, and moves S bytes each way over every hop between the two nodes.
"""
import json
import os
import textwrap

import pytest

from emulator.errors import ScenarioError
from emulator.outputs.perfetto import trace_events
from emulator.outputs.summary import summarize, summary_json
from emulator.run.simulation import simulate
from emulator.scenario import load_scenario, load_scenario_text
from emulator.scenario.schema import scenario_schema

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
S = 1e9  # bytes of each job's all-reduce

TRACE = {"format": "emulator-trace", "version": 1, "ranks": 2, "ops": [
    {"id": r, "rank": r, "kind": "collective", "op": "all_reduce", "group": [0, 1], "bytes": S, "deps": []}
    for r in range(2)]}


def run_jobs(tmp_path, oversubscription, placement, start_b="0 s", iterations=1):
    (tmp_path / "ar.json").write_text(json.dumps(TRACE))
    text = f"""\
        name: two-jobs
        cluster:
          nodes: 4
          node: {{gpu: A100-SXM4-80GB, gpus_per_node: 1, intra_bandwidth: "1000 GB/s", nics: 1,
                  nic_bandwidth: "100 GB/s"}}
          fabric: {{kind: fat_tree, leaf_size: 2, oversubscription: {oversubscription}, latency: "0 s"}}
        simulation: {{iterations: {iterations}}}
        jobs:
          - {{name: a, nodes: 2, placement: {placement}, workload: {{trace: ar.json}}}}
          - {{name: b, nodes: 2, placement: {placement}, workload: {{trace: ar.json}}, start: "{start_b}"}}
        """
    path = tmp_path / "jobs.yaml"
    path.write_text(textwrap.dedent(text))
    result = simulate(load_scenario(str(path)))
    return result, summarize(result)


def test_disjoint_leaves_of_a_nonblocking_tree_run_as_fast_as_alone(tmp_path):
    # contiguous: a on nodes 0, 1 (leaf 0), b on 2, 3 (leaf 1); each all-reduce stays under its leaf:
    # bottleneck the 100 GB/s NIC, so S/B = 1e9 / 100e9 = 10 ms, alone and together
    _, s = run_jobs(tmp_path, 1, "contiguous")
    assert [(j["name"], j["nodes"]) for j in s["jobs"]] == [("a", [0, 1]), ("b", [2, 3])]
    for j in s["jobs"]:
        assert j["iteration_time_s"] == pytest.approx(0.010, rel=1e-12)
        assert j["alone_iteration_time_s"] == j["iteration_time_s"]
        assert j["slowdown"] == 1.0
    assert s["shared_links"] == []  # the jobs never met
    assert s["iteration_time_s"] == pytest.approx(0.010, rel=1e-12)


def test_interleaved_jobs_share_the_oversubscribed_uplink(tmp_path):
    # spread: a on nodes 0, 2, b on 1, 3; each all-reduce crosses leaf -> spine0 -> leaf.
    # 4:1: one spine (one NIC per node), leaf uplink = 2 nodes · 100 GB/s / 4 = 50 GB/s.
    # alone: S / 50 GB/s = 20 ms; together the two rings split each uplink: 25 GB/s each → 40 ms, slowdown 2
    result, s = run_jobs(tmp_path, 4, "spread")
    assert [(j["name"], j["nodes"]) for j in s["jobs"]] == [("a", [0, 2]), ("b", [1, 3])]
    for j in s["jobs"]:
        assert j["alone_iteration_time_s"] == pytest.approx(0.020, rel=1e-12)
        assert j["iteration_time_s"] == pytest.approx(0.040, rel=1e-12)
        assert j["slowdown"] == pytest.approx(2.0, rel=1e-12)
    # they met on the four leaf-spine links (both ways, both leaves), S bytes each per iteration
    links = {r["link"]: r for r in s["shared_links"]}
    assert sorted(links) == ["leaf0->spine0", "leaf1->spine0", "spine0->leaf0", "spine0->leaf1"]
    for r in links.values():
        assert r["bytes_per_iteration"] == {"a": S, "b": S}
        assert r["capacity_B_per_s"] == 50e9 and r["class"] == "fabric"
    assert any("folding off" in n for n in result.notes)


def test_a_start_offset_overlaps_half_of_each_job(tmp_path):
    # b starts at 10 ms. a alone 0-10 ms at 50 GB/s: 0.5 GB; then both at 25 GB/s: a's last 0.5 GB takes
    # 20 ms → a ends at 30 ms (slowdown 30/20 = 1.5); b has moved 0.5 GB by then and moves its last
    # 0.5 GB alone at 50 GB/s in 10 ms: ends at 40 ms, 30 ms after its start (slowdown 1.5)
    result, s = run_jobs(tmp_path, 4, "spread", start_b="10 ms")
    a, b = s["jobs"]
    assert (a["start_s"], b["start_s"]) == (0.0, 0.010)
    assert a["iteration_time_s"] == pytest.approx(0.030, rel=1e-12)
    assert b["iteration_time_s"] == pytest.approx(0.030, rel=1e-12)
    assert a["slowdown"] == pytest.approx(1.5, rel=1e-12) and b["slowdown"] == pytest.approx(1.5, rel=1e-12)
    # b's ranks (GPUs 1 and 3) wait on the cpu lane first: not GPU work
    waits = [x for x in result.spans if x.name == "waiting for job start"]
    assert sorted((x.rank, x.start_s, x.end_s) for x in waits) == [(1, 0.0, 0.010), (3, 0.0, 0.010)]


def test_iterations_follow_back_to_back(tmp_path):
    # 2 iterations, both jobs together throughout: 2 × 40 ms, 40 ms per iteration; alone 20 ms
    _, s = run_jobs(tmp_path, 4, "spread", iterations=2)
    for j in s["jobs"]:
        assert j["iteration_time_s"] == pytest.approx(0.040, rel=1e-12)
        assert j["alone_iteration_time_s"] == pytest.approx(0.020, rel=1e-12)
    assert s["shared_links"][0]["bytes_per_iteration"] == {"a": S, "b": S}  # per iteration, not per run


def test_the_scenarios_in_the_folder():
    """The issue's two checks on the model scenarios of scenarios/.

    Each job: TP 8 in a node, its DP-2 gradient all-reduce over 8 rails from one node to the other.
    Non-blocking: each rail flow runs at its NIC's 24 GB/s (200 Gb/s × 24/25). 4:1 alone: the leaf's
    8 uplinks of 2·8·25 GB/s/4/8 × 0.96 = 12 GB/s carry the job's 8 flows sprayed over them, 12 GB/s
    each; shared, 16 flows: 6 GB/s each. The exposed all-reduce c, 2c, 4c on top of the same compute
    makes (shared − non-blocking) = 3 × (alone − non-blocking), up to its latency terms.
    """
    free = simulate(load_scenario(os.path.join(ROOT, "scenarios", "jobs-two-disjoint-leaves.yaml")))
    assert [r.slowdown for r in free.jobs] == [1.0, 1.0]
    assert free.jobs[0].iteration_time_s == free.jobs[1].iteration_time_s
    busy = simulate(load_scenario(os.path.join(ROOT, "scenarios", "jobs-interleaved-4to1.yaml")))
    nb = free.jobs[0].iteration_time_s
    for r in busy.jobs:
        assert r.slowdown > 1.3
        assert (r.iteration_time_s - nb) / (r.alone_iteration_time_s - nb) == pytest.approx(3.0, rel=2e-3)


def test_job_memory_is_the_job_alone():
    """A job's memory row is the memory report of the same model and layout as a one-job scenario."""
    from emulator.workload.memory import memory_report

    path = os.path.join(ROOT, "scenarios", "jobs-two-disjoint-leaves.yaml")
    sc = load_scenario(path)
    s = summarize(simulate(sc))
    single = load_scenario_text(textwrap.dedent("""\
        name: one
        cluster: {nodes: 2, node: dgx-a100}
        model: {preset: gpt3-1.3b, layers: 4}
        training: {global_batch: 8, micro_batch: 4}
        parallel: {tp: 8}
        """))
    want = memory_report(single)
    assert s["jobs"][0]["memory"] == {"peak_bytes_per_gpu": want.peak_bytes_per_gpu, "fits": True}
    assert s["memory"]["peak_bytes_per_gpu"] is None  # no one top-level model


def test_same_scenario_same_bytes():
    path = os.path.join(ROOT, "scenarios", "jobs-interleaved-4to1.yaml")
    texts = []
    for _ in range(2):
        s = summarize(simulate(load_scenario(path)))
        s["sim"]["wall_s"] = 0.0
        texts.append(summary_json(s))
    assert texts[0] == texts[1]


def test_trace_has_one_process_per_job(tmp_path):
    result, _ = run_jobs(tmp_path, 4, "spread")
    events = trace_events(result)
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert names == {0: "job a · nodes 0, 2", 1: "job b · nodes 1, 3", 2: "fabric links (GB/s)"}
    # the all-reduce spans of GPU 2 (job a's rank 1) are in job a's process
    lanes = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    spans = [e for e in events if e["ph"] == "X" and e["name"] == "all_reduce"]
    assert sorted(lanes[(e["pid"], e["tid"])] for e in spans if e["pid"] == 0) == [
        "rank 0 · gpu 0 · comm", "rank 1 · gpu 2 · comm"]


def test_schema_has_the_jobs_keys():
    jobs = scenario_schema()["properties"]["jobs"]
    item = jobs["items"]
    assert jobs["type"] == "array" and item["required"] == ["name"]
    assert item["properties"]["placement"]["oneOf"][0]["enum"] == ["contiguous", "spread", "random"]
    assert item["properties"]["start"]["default"] == "0 s"
    assert set(item["properties"]) >= {"model", "training", "parallel", "workload", "nodes", "seed"}


# global_batch 60: any dp of 1 to 5 divides it, so only the placement can be wrong
JOB = "model: {preset: gpt3-1.3b, layers: 4}, training: {global_batch: 60}, parallel: {tp: 8}"
HEAD = "name: x\ncluster:\n  nodes: 4\n  node: dgx-a100\njobs:\n"


def _error(text: str) -> str:
    with pytest.raises(ScenarioError) as info:
        load_scenario_text(text, "x.yaml")
    return str(info.value)


@pytest.mark.parametrize("jobs, message", [
    (f"  - {{name: a, placement: [0, 1], {JOB}}}\n  - {{name: b, placement: [1, 2], {JOB}}}\n",
     "x.yaml:7: jobs[1].placement: node 1 is already taken by job 'a'; jobs may not share nodes"),
    (f"  - {{name: a, nodes: 3, {JOB}}}\n  - {{name: b, nodes: 2, {JOB}}}\n",
     "x.yaml:7: jobs[1].nodes: job 'b' needs 2 nodes but only 1 of the cluster's 4 are free "
     "(the other jobs hold the rest)"),
    (f"  - {{name: a, nodes: 5, {JOB}}}\n",
     "x.yaml:6: jobs[0].nodes: job 'a' needs 5 nodes but only 4 of the cluster's 4 are free "
     "(the other jobs hold the rest)"),
    (f"  - {{name: a, placement: [0, 7], {JOB}}}\n",
     "x.yaml:6: jobs[0].placement: there is no node 7: the cluster has nodes 0 to 3"),
    (f"  - {{name: a, nodes: 2, placement: packed, {JOB}}}\n",
     'x.yaml:6: jobs[0].placement: expected one of contiguous, spread, random, got "packed"'),
    (f"  - {{name: a, {JOB}}}\n",
     "x.yaml:6: jobs[0].nodes: this key is required with placement contiguous (how many nodes the job runs on)"),
    (f"  - {{name: a, nodes: 2, {JOB}}}\n  - {{name: a, nodes: 2, {JOB}}}\n",
     'x.yaml:7: jobs[1].name: job name "a" is also the name of jobs[0]; names must be unique'),
    ("  - {name: a, nodes: 2, model: {preset: gpt3-1.3b}, training: {global_batch: 8}, parallel: {tp: 8, dp: 4}}\n",
     "x.yaml:6: jobs[0].parallel: tp*pp*dp*cp = 8*1*4*1 = 32, but the job has 16 GPUs (2 nodes x 8); "
     "they must be equal (leave dp out to derive it)"),
    ("  - {name: a, nodes: 2}\n",
     "x.yaml:6: jobs[0].model: a job needs a workload: give a model (model.preset, or layers, hidden, heads, "
     "seq_len, vocab) or a workload.trace"),
    (f"  - {{name: a, nodes: 2, seed: 3, {JOB}}}\n",
     'x.yaml:6: jobs[0].seed: seed is only read with placement: random (placement is "contiguous")'),
    ("  []\n", "x.yaml:6: jobs: expected a list of jobs (- name: a, nodes: 2, model: {...}), got an empty list"),
])
def test_bad_jobs(jobs, message):
    assert _error(HEAD + jobs) == message


def test_top_level_model_and_jobs_do_not_mix():
    text = HEAD.replace("jobs:\n", "model: {preset: gpt3-1.3b}\njobs:\n") + f"  - {{name: a, nodes: 2, {JOB}}}\n"
    assert _error(text) == ("x.yaml:5: model: a scenario with jobs gives each job its own model (or workload.trace); "
                            "move the top-level model into a job")


def test_top_level_parallel_and_jobs_do_not_mix():
    text = HEAD.replace("jobs:\n", "parallel: {tp: 8}\njobs:\n") + f"  - {{name: a, nodes: 2, {JOB}}}\n"
    assert _error(text) == ("x.yaml:5: parallel: a scenario with jobs reads parallel inside each job "
                            "(jobs[i].parallel); move the top-level parallel into the jobs")


def test_a_job_layout_error_names_the_job_key():
    # dp = 16 GPUs / tp 8 = 2; a global batch of 5 is not a multiple of micro_batch·dp = 1·2
    text = HEAD + "  - {name: a, nodes: 2, model: {preset: gpt3-1.3b}, training: {global_batch: 5}, parallel: {tp: 8}}\n"
    assert _error(text) == ("x.yaml:6: jobs[0].training.global_batch: global_batch (5) must be divisible by "
                            "micro_batch*dp = 1*2 = 2")


def test_a_trace_with_more_ranks_than_the_job_has_gpus(tmp_path):
    # the trace has 2 ranks; one node of one GPU holds 1
    (tmp_path / "ar.json").write_text(json.dumps(TRACE))
    path = tmp_path / "one.yaml"
    path.write_text(textwrap.dedent("""\
        name: one
        cluster:
          nodes: 2
          node: {gpu: A100-SXM4-80GB, gpus_per_node: 1, intra_bandwidth: "1000 GB/s", nics: 1,
                 nic_bandwidth: "100 GB/s"}
        jobs:
          - {name: a, nodes: 1, workload: {trace: ar.json}}
        """))
    from emulator.errors import EmulatorError

    with pytest.raises(EmulatorError) as info:
        simulate(load_scenario(str(path)))
    assert str(info.value) == f"{path}: job 'a': the workload has 2 ranks but the job has 1 GPUs"
