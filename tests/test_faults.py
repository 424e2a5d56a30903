"""Faults and stragglers (cluster.overrides): what they do to an iteration.

Two 1-GPU nodes, each with 2 NICs (GPU 0 uses nic0.0; nic0.1 carries nothing), and a
trace where rank 0 computes 1 ms and then sends 100 MB to rank 1 (the only transfer).
"""
import json
import os

import pytest

from emulator.errors import EmulatorError
from emulator.run.simulation import simulate
from emulator.scenario import load_scenario

S = 1e8  # bytes sent


def _scenario(folder, fabric="{kind: single_switch}", nodes=2):
    trace = {"format": "emulator-trace", "version": 1, "ranks": 2, "ops": [
        {"id": 0, "rank": 0, "kind": "compute", "deps": [], "duration": 1e-3},
        {"id": 1, "rank": 1, "kind": "compute", "deps": [], "duration": 1e-3},
        {"id": 2, "rank": 0, "kind": "send", "deps": [0], "peer": 1, "bytes": S, "tag": 1},
        {"id": 3, "rank": 1, "kind": "recv", "deps": [1], "peer": 0, "bytes": S, "tag": 1}]}
    with open(os.path.join(folder, "t.json"), "w") as fh:
        json.dump(trace, fh)
    path = os.path.join(folder, "f.yaml")
    with open(path, "w") as fh:
        fh.write(f"name: f\ncluster:\n  nodes: {nodes}\n  node: {{preset: dgx-a100, gpus_per_node: 1, nics: 2}}\n"
                 f"  fabric: {fabric}\nworkload: {{trace: t.json}}\n")
    return path


def _run(path, overrides=()):
    return simulate(load_scenario(path, list(overrides)), record_links=False)


def _ov(kind, target, factor=1.0):
    return f"cluster.overrides=[{{kind: {kind}, target: '{target}', factor: {factor}}}]"


def test_degraded_nic_on_the_critical_path_slows_the_iteration_and_an_idle_one_does_not(tmp_path):
    path = _scenario(str(tmp_path))
    node = load_scenario(path).cluster.node
    rate = node.nic_bandwidth * node.nic_efficiency  # the NIC port is the bottleneck (GPU→NIC has efficiency 1)
    base = _run(path).iteration_time_s
    idle = _run(path, [_ov("link_degrade", "nic0.1", 0.5)]).iteration_time_s
    hot = _run(path, [_ov("link_degrade", "nic0.0", 0.5)]).iteration_time_s
    assert idle == base
    # halving every link of nic0.0 halves the rate: S/(rate/2) − S/rate = S/rate more
    assert hot - base == pytest.approx(S / rate, rel=1e-9)


def test_extra_latency_adds_once_per_degraded_hop(tmp_path):
    path = _scenario(str(tmp_path))
    base = _run(path).iteration_time_s
    slow = _run(path, ["cluster.overrides=[{kind: link_degrade, target: 'nic0.0->sw', extra_latency: 7 us}]"])
    assert slow.iteration_time_s - base == pytest.approx(7e-6, rel=1e-6)  # one hop of the only path


def test_a_slower_gpu_slows_its_rank(tmp_path):
    path = _scenario(str(tmp_path))
    r = _run(path, [_ov("gpu_slowdown", "gpu:1", 1.5)])
    compute = {s.rank: s.end_s - s.start_s for s in r.spans if s.kind == "compute"}
    # 1 ms × 1.5 on rank 1; rank 0 untouched
    assert compute[1] == pytest.approx(1.5e-3, rel=1e-9) and compute[0] == pytest.approx(1e-3, rel=1e-9)


def test_a_failed_spine_link_is_routed_around(tmp_path):
    # Fat-tree, one node per leaf, 2 spines, 2:1 oversubscribed: each leaf→spine link has
    # bw/2 (1 node × 2 NICs × bw / 2 / 2 spines). ECMP halves the flow over both spines, so the
    # NIC (bw·e) is the bottleneck; with leaf0→spine0 failed all of it takes spine1 at bw/2·e.
    path = _scenario(str(tmp_path), "{kind: fat_tree, leaf_size: 1, oversubscription: 2}")
    node = load_scenario(path).cluster.node
    rate = node.nic_bandwidth * node.nic_efficiency
    base = _run(path).iteration_time_s
    failed = _run(path, [_ov("link_fail", "leaf0->spine0")]).iteration_time_s
    assert failed - base == pytest.approx(S / (rate / 2) - S / rate, rel=1e-9)


def test_no_route_left_is_an_error_naming_the_gpus(tmp_path):
    path = _scenario(str(tmp_path), "{kind: fat_tree, leaf_size: 1, oversubscription: 2}")
    both = ("cluster.overrides=[{kind: link_fail, target: 'leaf0->spine0'}, "
            "{kind: link_fail, target: 'leaf0->spine1'}]")
    with pytest.raises(EmulatorError) as err:
        _run(path, [both])
    assert "gpu0" in str(err.value) and "gpu1" in str(err.value)


def test_a_failed_node_is_rejected_clearly(tmp_path):
    path = _scenario(str(tmp_path))
    with pytest.raises(EmulatorError, match="node:1 has failed.*reduce cluster.nodes"):
        _run(path, ["cluster.overrides=[{kind: node_fail, target: 'node:1'}]"])


def test_an_unknown_link_is_rejected(tmp_path):
    path = _scenario(str(tmp_path))
    with pytest.raises(EmulatorError, match="unknown link or node 'nic9.9'"):
        _run(path, [_ov("link_degrade", "nic9.9", 0.5)])


def test_the_summary_text_names_each_fault_and_what_it_reached():
    from emulator.outputs.summary import human_table, summarize

    # 4 DGX A100 nodes (8 GPUs each), 2 per leaf, 8 spines (one per NIC)
    sc = load_scenario("scenarios/spine-link-failure.yaml", [
        "cluster.overrides=[{kind: gpu_slowdown, target: 'node:1', factor: 1.5}, "
        "{kind: link_degrade, target: 'leaf0<->spine1', factor: 0.5, extra_latency: 2 us}, "
        "{kind: link_fail, target: spine0}, {kind: link_fail, target: 'leaf1->spine2', at: 0.2 s, until: 0.5 s}]"])
    summary = summarize(simulate(sc))
    text = human_table(summary)
    # node:1 is GPUs 8..15: 8 GPUs
    assert "fault: gpu_slowdown node:1: compute 1.5x as long on 8 GPUs, the whole run" in text
    # a cable is its 2 directed links
    assert "fault: link_degrade leaf0<->spine1: 2 links at 50% of their bandwidth, +2.0 us latency" in text
    # spine0 has a cable to each of the 2 leaves: 4 directed links
    assert "fault: link_fail spine0: 4 links down the whole run" in text
    timed = summary["faults"][0]
    assert (f"fault: link_fail leaf1->spine2 at 200.0 ms, until 500.0 ms: {timed['flows_rerouted']} flows rerouted, "
            f"{timed['flows_stalled']} stalled") in text
    assert [o["links"] for o in summary["overrides"]] == [0, 2, 4] and summary["overrides"][0]["gpus"] == 8


def test_a_run_without_faults_says_none():
    from emulator.outputs.summary import human_table, summarize

    summary = summarize(simulate(load_scenario("scenarios/spine-link-failure.yaml", ["cluster.overrides=[]"])))
    assert "overrides" not in summary and "faults" not in summary
    assert "fault:" not in human_table(summary)
