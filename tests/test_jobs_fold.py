"""Jobs folded alone (issue 29): each job's alone run is its single-job run, folded where its nodes
embed like a cluster of its own size (``workload.jobs.embeds_alike``), placed by a rank map
(``network.placed``); the results equal ``simulation.fold: off`` to 1e-9 (a hypothesis property
over random small clusters, jobs, placements and 1:1 to 4:1 fabrics). A one-job list costs and gives
what the top-level scenario does; jobs that never run at the same time, or share no link, have
slowdown 1 exactly."""
import dataclasses
import textwrap

import pytest
from helpers import uplink_mix
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from emulator.errors import ScenarioError
from emulator.outputs.summary import summarize
from emulator.run.simulation import simulate
from emulator.scenario import load_scenario_text
from emulator.scenario.spec import ClusterSpec, FabricSpec
from emulator.workload.jobs import embeds_alike

NODE = ('{gpu: A100-SXM4-80GB, gpus_per_node: 2, intra_bandwidth: "300 GB/s", nics: 2, '
        'nic_bandwidth: "100 Gb/s"}')
JOB = "model: {preset: gpt3-1.3b, layers: 2}, training: {global_batch: 8, micro_batch: 2}"
MODEL = "model: {preset: gpt3-1.3b, layers: 2}"


def _scenario(nodes: int, leaf: int, over: int, jobs: list[str], fold: str = "auto", iterations: int = 1,
              kind: str = "fat_tree"):
    text = f"""\
        name: mix
        cluster:
          nodes: {nodes}
          node: {NODE}
          fabric: {{kind: {kind}, leaf_size: {leaf}, oversubscription: {over}}}
        simulation: {{fold: {fold}, iterations: {iterations}}}
        jobs:
        """
    return load_scenario_text(textwrap.dedent(text) + "".join(f"  - {{{j}}}\n" for j in jobs), "mix.yaml")


def _facts(result):
    return [(r.iteration_time_s, r.alone_iteration_time_s, r.link_bytes) for r in result.jobs]


def _same(a, b):
    for (t, alone, links), (t2, alone2, links2) in zip(_facts(a), _facts(b)):
        assert t == pytest.approx(t2, rel=1e-9) and alone == pytest.approx(alone2, rel=1e-9)
        assert links == pytest.approx(links2, rel=1e-9, abs=1e-6)


@st.composite
def mixes(draw):
    leaf = draw(st.sampled_from([2, 4]))
    nodes = draw(st.sampled_from([4, 6, 8]))
    jobs, left = [], nodes
    for name in "abc"[:draw(st.integers(1, 3))]:
        if left == 0:
            break
        n = draw(st.integers(1, min(3, left)))
        left -= n
        policy = draw(st.sampled_from(["contiguous", "spread", "random"]))
        seed = f", seed: {draw(st.integers(0, 9))}" if policy == "random" else ""
        tp = draw(st.sampled_from([1, 2]))
        start = draw(st.sampled_from(["0 s", "1 ms"]))
        dp = n * 2 // tp  # 2 GPUs a node; two micro-batches of 1 per replica
        jobs.append(f"name: {name}, nodes: {n}, placement: {policy}{seed}, start: {start}, {MODEL}, "
                    f"training: {{global_batch: {2 * dp}, micro_batch: 1}}, parallel: {{tp: {tp}}}")
    return nodes, leaf, draw(st.sampled_from([1, 2, 4])), jobs, draw(st.sampled_from(["fat_tree", "rail"]))


@settings(max_examples=15, deadline=None)
@given(mixes())
def test_folded_jobs_equal_fold_off(mix):
    nodes, leaf, over, jobs, kind = mix
    try:
        folded = _scenario(nodes, leaf, over, jobs, kind=kind)
    except ScenarioError:  # a contiguous run that the jobs before it left no room for
        assume(False)
    a, b = simulate(folded), simulate(_scenario(nodes, leaf, over, jobs, fold="off", kind=kind))
    _same(a, b)
    sa, sb = summarize(a), summarize(b)  # the summary too: its mean breakdown weighs each rank's copies
    assert sa["breakdown_s"] == pytest.approx(sb["breakdown_s"], rel=1e-9, abs=1e-15)
    assert [r["link"] for r in sa["shared_links"]] == [r["link"] for r in sb["shared_links"]]
    assert sa["mix"]["slowdown"] == pytest.approx(sb["mix"]["slowdown"], rel=1e-9)


def test_a_folded_alone_run_on_a_fabric_it_shares():
    # a: 2 nodes of leaf 0 (embeds alike: folds its dp pair), b spread over leaves 0 and 1 (not alike)
    jobs = [f"name: a, nodes: 2, {JOB}, parallel: {{tp: 2}}", f"name: b, nodes: 2, placement: [2, 4], {JOB}"]
    folded = simulate(_scenario(8, 4, 4, jobs, iterations=2))
    _same(folded, simulate(_scenario(8, 4, 4, jobs, fold="off", iterations=2)))


def test_embeds_alike():
    def cluster(nodes, leaf, kind="fat_tree"):
        return ClusterSpec(nodes=nodes, node=None, fabric=FabricSpec(kind=kind, leaf_size=leaf))

    assert embeds_alike(cluster(8, 4), (5, 6, 7))  # in one leaf: nodes of a leaf are interchangeable
    assert embeds_alike(cluster(8, 4), (4, 5, 6, 7, 0, 1)) is False  # falls, not in rank order
    assert embeds_alike(cluster(12, 4), (4, 5, 6, 7, 8, 9))  # a whole leaf, then 2 nodes of another
    assert not embeds_alike(cluster(12, 4), (2, 3, 4, 5))  # the first run of 4 nodes spans two leaves
    assert not embeds_alike(cluster(8, 2), (0, 2))  # spread: one node per leaf, 2 leaves for a run of 2
    assert embeds_alike(cluster(8, 2, "torus"), (0, 5))  # only node interiors fold there
    faulty = dataclasses.replace(cluster(8, 4), overrides=(object(),))  # type: ignore[arg-type]
    assert not embeds_alike(faulty, (0, 1))


def test_one_job_list_is_the_top_level_run():
    # the same job at nodes 0.. of the cluster: the same program, fold and fabric, so the same numbers
    top = load_scenario_text(textwrap.dedent(f"""\
        name: top
        cluster: {{nodes: 4, node: {NODE}, fabric: {{kind: fat_tree, leaf_size: 2, oversubscription: 2}}}}
        model: {{preset: gpt3-1.3b, layers: 2}}
        training: {{global_batch: 8, micro_batch: 2}}
        parallel: {{tp: 2}}
        """), "top.yaml")
    one = _scenario(4, 2, 2, [f"name: a, nodes: 4, {JOB}, parallel: {{tp: 2}}"])
    t, j = simulate(top), simulate(one)
    assert j.jobs[0].iteration_time_s == t.iteration_time_s and j.jobs[0].slowdown == 1.0
    assert j.link_bytes == t.link_bytes and j.events == t.events
    assert summarize(j)["iteration_time_s"] == summarize(t)["iteration_time_s"]


def test_jobs_apart_in_time_have_slowdown_one_exactly(tmp_path):
    # the 4:1 uplink case of tests/test_jobs.py: alone each all-reduce takes S / 50 GB/s = 20 ms;
    # b starts at 25 ms, after a ended: they share the uplinks but never at once
    path = uplink_mix(tmp_path, "apart", ["{name: a, nodes: 2, placement: spread, workload: {trace: ar.json}}",
                                          "{name: b, nodes: 2, placement: spread, workload: {trace: ar.json}, "
                                          'start: "25 ms"}'])
    from emulator.scenario import load_scenario

    s = summarize(simulate(load_scenario(path)))
    assert [j["slowdown"] for j in s["jobs"]] == [1.0, 1.0]
    assert s["jobs"][1]["iteration_time_s"] == pytest.approx(0.020, rel=1e-12)
    assert len(s["shared_links"]) == 4  # they did share the uplinks, at other times


def test_fold_holds_where_each_step_carries_leaves_onto_leaves():
    from emulator.program import Fold
    from emulator.workload.jobs import fold_holds

    def cluster(nodes, leaf, kind="fat_tree", pod=1):
        return ClusterSpec(nodes=nodes, node=None, fabric=FabricSpec(kind=kind, leaf_size=leaf, pod_size=pod))

    dp4 = Fold((4,), (True,))  # 4 one-GPU replicas, rotated one step: rank r -> r + 1 mod 4
    # spread over 4 leaves of 2: nodes 0, 2, 4, 6 -> leaves 0, 1, 2, 3, each step turns the leaves round
    assert fold_holds(dp4, (0, 2, 4, 6), cluster(8, 2), 1)
    # nodes 0, 1 share leaf 0: the step 0 -> 1 keeps leaf 0, the step 1 -> 2 takes it to leaf 1
    assert not fold_holds(dp4, (0, 1, 2, 4), cluster(8, 2), 1)
    # three levels, leaves of 1 node, pods of 2 leaves: 0 -> 2 -> 1 -> 3 -> 0 alternates the pods
    assert fold_holds(dp4, (0, 2, 1, 3), cluster(4, 1, "fat_tree3", 2), 1)
    assert not fold_holds(dp4, (0, 1, 2, 3), cluster(4, 1, "fat_tree3", 2), 1)  # pod 0 -> 0, then 0 -> 1
    assert not fold_holds(dp4, (0, 2, 4, 6), cluster(8, 2, "torus"), 1)  # elsewhere nodes stay put
    tp2 = Fold((2, 2), (False, True))  # 2 GPUs a node, their pair rotated: nodes stay put anywhere
    assert fold_holds(tp2, (6, 7, 2, 3), cluster(4, 1, "torus"), 2)
    # a step that splits a node's GPUs over two nodes is no automorphism
    assert not fold_holds(Fold((4,), (True,)), (0, 1, 2, 3), cluster(2, 1), 2)
