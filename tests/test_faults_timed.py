"""Failures in time: link overrides with ``at`` (and ``until``) in the middle of a run.

Two 1-GPU nodes with 2 NICs of 100 GB/s each (efficiency 1), each node on its own leaf
of a fat-tree with 2 spines, every leaf–spine link C = 10 GB/s (latencies 0). Rank 0
sends S = 30 GB to rank 1: the flow is split ½/½ over the spines, so r = 2C = 20 GB/s
(the NIC allows 100) and, alone, it ends at S/2C = 1.5 s.
"""
import json
import os

import pytest

from emulator.errors import EmulatorError, ScenarioError
from emulator.outputs.perfetto import trace_events
from emulator.outputs.summary import summarize
from emulator.run.simulation import simulate
from emulator.scenario import load_scenario, load_scenario_text

S = 30e9
C = 10e9


def _scenario(folder, overrides=""):
    trace = {"format": "emulator-trace", "version": 1, "ranks": 2, "ops": [
        {"id": 0, "rank": 0, "kind": "send", "deps": [], "peer": 1, "bytes": S, "tag": 1},
        {"id": 1, "rank": 1, "kind": "recv", "deps": [], "peer": 0, "bytes": S, "tag": 1}]}
    with open(os.path.join(folder, "t.json"), "w") as fh:
        json.dump(trace, fh)
    path = os.path.join(folder, "f.yaml")
    with open(path, "w") as fh:
        fh.write("name: timed\ncluster:\n  nodes: 2\n"
                 "  node: {gpus_per_node: 1, gpu: A100-SXM4-80GB, intra_bandwidth: 100 GB/s, nics: 2,"
                 " nic_bandwidth: 100 GB/s}\n"
                 "  fabric: {kind: fat_tree, leaf_size: 1, link_bandwidth: 10 GB/s, latency: 0 us}\n"
                 f"{overrides}workload: {{trace: t.json}}\n")
    return path


def _send_end(result):
    return next(s.end_s for s in result.spans if s.kind == "send")


def _run(folder, overrides=""):
    return simulate(load_scenario(_scenario(folder, overrides)))


def test_without_a_fault_the_flow_ends_at_S_over_2C(tmp_path):
    assert _send_end(_run(str(tmp_path))) == pytest.approx(S / (2 * C), rel=1e-12)  # 30/20 = 1.5 s


def test_a_spine_link_failing_at_1s_reroutes_the_flow_and_it_ends_later(tmp_path):
    r = _run(str(tmp_path), "  overrides: [{kind: link_fail, target: 'leaf0->spine0', at: 1 s}]\n")
    # by 1 s it moved 2C·1 = 20 GB. Then leaf0→spine0 goes round by leaf0→spine1→leaf1→spine0 (the
    # shortest switch-only detour), so leaf0→spine1 carries the whole flow: r = C, and the last
    # 10 GB take 1 s: the send ends at 2.0 s instead of 1.5 s.
    assert _send_end(r) == pytest.approx(1.0 + (S - 2 * C * 1.0) / C, rel=1e-12)
    assert (r.faults[0].rerouted, r.faults[0].stalled) == (1, 0)


def test_a_nic_port_failing_stalls_the_flow_until_it_recovers(tmp_path):
    r = _run(str(tmp_path), "  overrides: [{kind: link_fail, target: 'nic0.0->leaf0', at: 1 s, until: 1.25 s}]\n")
    # a NIC port has no detour (a GPU or NIC forwards nothing): the flow stops for 0.25 s → 1.5 + 0.25
    assert _send_end(r) == pytest.approx(S / (2 * C) + 0.25, rel=1e-12)
    assert (r.faults[0].rerouted, r.faults[0].stalled) == (1 - 1, 1)


def test_a_link_degraded_for_a_while_slows_the_flow_only_then(tmp_path):
    r = _run(str(tmp_path), "  overrides: [{kind: link_degrade, target: 'leaf0<->spine1', factor: 0.25, "
                            "at: 0.5 s, until: 1 s}]\n")
    # 0–0.5 s: 2C → 10 GB. 0.5–1 s: leaf0→spine1 at C/4 carries ½r → r = C/2 = 5 GB/s → 2.5 GB.
    # After 1 s: 2C again for the last 30 − 12.5 = 17.5 GB → 0.875 s: ends at 1.875 s.
    assert _send_end(r) == pytest.approx(1.0 + (S - 2 * C * 0.5 - C / 2 * 0.5) / (2 * C), rel=1e-12)


def test_a_fault_after_the_flow_ended_changes_nothing(tmp_path):
    base = _run(str(tmp_path))
    late = _run(str(tmp_path), "  overrides: [{kind: link_fail, target: 'leaf0->spine0', at: 2 s}]\n")
    assert _send_end(late) == _send_end(base) and late.faults[0].rerouted == 0


def test_a_permanent_failure_with_no_detour_is_a_clear_deadlock(tmp_path):
    with pytest.raises(EmulatorError, match=r"link_fail nic0\.0->leaf0 at 1 s stalled 1 flows with no way round "
                                            r"and never recovers \(give it until:\); deadlock"):
        _run(str(tmp_path), "  overrides: [{kind: link_fail, target: 'nic0.0->leaf0', at: 1 s}]\n")


def test_the_fault_shows_in_the_summary_and_the_perfetto_trace(tmp_path):
    r = _run(str(tmp_path), "  overrides: [{kind: link_fail, target: 'leaf0->spine0', at: 1 s}]\n")
    assert summarize(r)["faults"] == [{"kind": "link_fail", "target": "leaf0->spine0", "at_s": 1.0,
                                       "until_s": None, "flows_rerouted": 1, "flows_stalled": 0}]
    events = [e for e in trace_events(r) if e.get("name") == "link_fail leaf0->spine0"]
    instant = next(e for e in events if e["ph"] == "i")
    span = next(e for e in events if e["ph"] == "X")
    assert instant["ts"] == 1e6 and span["ts"] == 1e6 and span["dur"] == pytest.approx(1e6)  # 1 s → end at 2 s
    assert "faults" not in summarize(_run(str(tmp_path)))  # no timed fault: the summary is as before


def test_timed_faults_see_through_link_compression():
    # A model run compresses its plans (one link stands for a group). A degrade timed at 0 s must
    # equal the same degrade given statically, and a no-op timed fault (factor 1) the plain run.
    # (Checked: with the flows left compressed, the timed run gives 0.7068 s against the static 0.7236 s.)
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scenarios",
                        "quickstart.yaml")
    two = ["cluster.nodes=2", "parallel.dp=4", "cluster.fabric.kind=fat_tree"]  # dp rings cross the fabric

    def run(*extra):
        return simulate(load_scenario(path, two + list(extra)), record_links=False).iteration_time_s

    ov = "cluster.overrides=[{kind: link_degrade, target: 'nic0.0<->leaf0', factor: %s%s}]"
    plain, noop = run(), run(ov % (1, ", at: 0.001 s"))
    static, timed = run(ov % (0.25, "")), run(ov % (0.25, ", at: 0 s"))
    assert noop == pytest.approx(plain, rel=1e-12)
    assert static > plain and timed == pytest.approx(static, rel=1e-12)


@pytest.mark.parametrize("override, key, words", [
    ("{kind: gpu_slowdown, target: 'gpu:1', factor: 2, at: 1 s}", "cluster.overrides[0].at",
     "only read with kind: link_degrade | link_fail"),
    ("{kind: link_fail, target: 'leaf0->spine0', at: 2 s, until: 1 s}", "cluster.overrides[0].until",
     "must be after at (2 s)"),
    ("{kind: link_degrade, target: 'leaf0->spine0', extra_latency: 1 us, at: 1 s}",
     "cluster.overrides[0].extra_latency", "cannot be timed"),
    ("{kind: link_fail, target: 'leaf0->spine0', at: 2}", "cluster.overrides[0].at", "unit"),
])
def test_bad_timing_keys_name_the_file_line_and_key(override, key, words):
    text = f"name: t\ncluster:\n  nodes: 2\n  node: dgx-a100\n  fabric: {{kind: fat_tree, leaf_size: 1}}\n" \
           f"  overrides: [{override}]\n"
    with pytest.raises(ScenarioError) as err:
        load_scenario_text(text, "s.yaml")
    msg = str(err.value)
    assert msg.startswith("s.yaml:6: " + key) and words in msg and "\n" not in msg


def test_the_cli_rejects_a_bad_timed_fault_with_exit_code_2(tmp_path, capsys):
    from emulator.cli import main

    path = _scenario(str(tmp_path), "  overrides: [{kind: link_fail, target: 'leaf0->spine0', at: 1 s, "
                                    "until: 0.5 s}]\n")
    assert main(["run", path, "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("f.yaml:6: cluster.overrides[0].until: until (0.5 s) must be after at (1 s)")


def test_an_unknown_timed_link_is_a_clear_error(tmp_path):
    with pytest.raises(EmulatorError, match=r"f\.yaml: cluster\.overrides\[0\]\.target: no link 'leaf0->spine9'"):
        _run(str(tmp_path), "  overrides: [{kind: link_fail, target: 'leaf0->spine9', at: 1 s}]\n")
