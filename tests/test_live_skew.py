"""The arrival-skew model of a live run's emulated ranks (``live.skew``, emulator/live/skew.py)."""
import json
import math
import os
import subprocess
import sys

import pytest
from helpers import HandClock, custom_scenario, star

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable
COMM = 1.62e-3  # a ring all-reduce of 1 MB on a star of 4 (1 GB/s, 10 us per link): 2*3*20 us + 1.5 * 1e6/1e9


def test_expected_max_of_normals():
    from emulator.live.skew import expected_max

    # closed forms: e_2 = 1/sqrt(pi) = 0.5641896; e_3 = 3/(2 sqrt(pi)) = 0.8462844;
    # e_4 = 3/sqrt(pi) * (1/2 + arcsin(1/3)/pi) = 1.6925688 * (0.5 + 0.1081734) = 1.0293754
    assert expected_max(1) == 0.0 and expected_max(0) == 0.0
    assert expected_max(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-9)
    assert expected_max(3) == pytest.approx(3 / (2 * math.sqrt(math.pi)), rel=1e-9)
    assert expected_max(4) == pytest.approx(3 / math.sqrt(math.pi) * (0.5 + math.asin(1 / 3) / math.pi), rel=1e-9)
    assert expected_max(4) == pytest.approx(1.0293754, abs=1e-7)
    # more ranks, a later last arrival: e_8 = 1.4236003 (Tippett 1925, the mean of the largest of 8)
    assert expected_max(8) == pytest.approx(1.4236003, abs=1e-6)


def test_lag_is_the_rest_of_the_expected_maximum():
    from emulator.live.skew import lag, spread

    # a = 2 ms, b = 0.1: after 10 ms of compute sigma = 2 + 0.1 * 10 = 3 ms
    assert spread(2e-3, 0.1, 10e-3) == pytest.approx(3e-3, rel=1e-12)
    assert spread(2e-3, 0.1, -1e-3) == pytest.approx(2e-3, rel=1e-12)  # no negative compute
    # one real rank among 4: the last of 4 arrives e_4 * sigma = 1.0293754 * 3 ms = 3.0881261 ms after it
    assert lag(2e-3, 0.1, 10e-3, 4) == pytest.approx(3.0881261e-3, rel=1e-7)
    # 2 real members, whose own skew is measured: (e_4 - e_2) * 3 ms = (1.0293754 - 0.5641896) * 3 = 1.3955574 ms
    assert lag(2e-3, 0.1, 10e-3, 4, 2) == pytest.approx(1.3955574e-3, rel=1e-6)
    # no emulated member: no lag
    assert lag(2e-3, 0.1, 10e-3, 2, 2) == 0.0 and lag(2e-3, 0.1, 10e-3, 1) == 0.0


def _iterations(tmp_path, skew, real=1):
    """Two DDP-like iterations (compute, all-reduce of 1 MB, wait), then a send; the records."""
    from emulator.live.cost import CommCost
    from emulator.live.session import Session

    clock = HandClock()
    s = Session(clock, CommCost(custom_scenario(star(tmp_path, 4, bw=1e9, lat=1e-5)), 4), 4, real=real, skew=skew)
    out = []
    for c in (0.010, 0.004):
        clock.compute(c)
        out.append(s.issue("all_reduce", (0, 1, 2, 3), 1e6))
        s.sync("backward")
    clock.compute(0.001)
    out.append(s.issue("send", (0, 1, 2, 3), 1e6, peer=1))
    return out, clock.now()


def test_off_keeps_the_symmetric_arrival_exactly(tmp_path):
    recs, _ = _iterations(tmp_path, None)
    # today's rule: the copies arrive with the local rank; the all-reduce starts at its issue
    assert [r.start_s for r in recs[:2]] == [r.issue_s for r in recs[:2]]
    assert recs[0].end_s == pytest.approx(0.010 + COMM, rel=1e-12)
    assert recs[1].issue_s == pytest.approx(0.010 + COMM + 0.004, rel=1e-12)


def test_model_delays_a_collective_by_the_lag_of_the_compute_since_the_last_wait(tmp_path):
    a, b = 2e-3, 0.1
    recs, end = _iterations(tmp_path, (a, b))
    e4 = 1.0293754
    # iteration 1: 10 ms of compute, then the all-reduce starts e_4 * (2 + 0.1 * 10) ms = 3.0881 ms later
    assert recs[0].issue_s == pytest.approx(0.010)
    assert recs[0].start_s - recs[0].issue_s == pytest.approx(e4 * 3e-3, rel=1e-6)
    assert recs[0].end_s - recs[0].start_s == pytest.approx(COMM, rel=1e-9)
    # iteration 2: the wait restarted the count: 4 ms of compute, lag e_4 * (2 + 0.4) ms = 2.4705 ms
    assert recs[1].issue_s == pytest.approx(recs[0].end_s + 0.004, rel=1e-12)
    assert recs[1].start_s - recs[1].issue_s == pytest.approx(e4 * 2.4e-3, rel=1e-6)
    # a send keeps the symmetric rule
    assert recs[2].start_s == recs[2].issue_s


def test_with_two_real_ranks_the_emulated_add_the_rest(tmp_path):
    recs, _ = _iterations(tmp_path, (2e-3, 0.1), real=2)
    # 2 of 4 members real: (e_4 - e_2) * 3 ms = 1.3955574 ms after the (latest) real arrival
    assert recs[0].start_s - recs[0].issue_s == pytest.approx(1.3955574e-3, rel=1e-6)


def test_live_section_of_the_scenario(tmp_path):
    from emulator.errors import ScenarioError
    from emulator.scenario.reader import load_scenario_text
    from emulator.scenario.schema import scenario_schema
    from emulator.scenario.spec import LiveSpec

    graph = star(tmp_path, 4)
    head = f"name: x\ncluster:\n  fabric: {{kind: custom, graph: {graph}}}\n"
    path = str(tmp_path / "s.yaml")
    assert load_scenario_text(head, path).live == LiveSpec()  # absent: off
    s = load_scenario_text(head + "live:\n  skew: model\n  skew_base: 2 ms\n  skew_slope: 0.1\n", path)
    assert (s.live.skew, s.live.skew_base, s.live.skew_slope) == ("model", pytest.approx(2e-3), 0.1)
    bad = {"live:\n  skew: maybe\n": r"s.yaml:5: live.skew: expected one of off, model",
           "live:\n  skew: model\n  skew_slope: 3\n": r"s.yaml:6: live.skew_slope: expected a number from 0 to 1",
           "live:\n  skew: model\n  skew_base: 2\n": r"s.yaml:6: live.skew_base: expected a duration",
           "live:\n  skew_base: 2 ms\n": r"s.yaml:5: live.skew_base: skew_base is only read with live.skew: model"}
    for text, message in bad.items():
        with pytest.raises(ScenarioError, match=message):
            load_scenario_text(head + text, path)
    props = scenario_schema()["properties"]["live"]["properties"]
    assert props["skew"]["enum"] == ["off", "model"] and props["skew_slope"]["maximum"] == 1


def test_bad_skew_key_on_the_command_line_exits_2(tmp_path):
    proc = subprocess.run([PY, "-m", "emulator", "live", os.path.join(ROOT, "scenarios", "live-gloo-loopback.yaml"),
                           "--set", "live.skew=sometimes", "--", "python", "-c", "pass"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "live.skew: expected one of off, model" in proc.stderr and "Traceback" not in proc.stderr


def _live(tmp_path, name, *extra):
    out = tmp_path / name
    cmd = [PY, "-m", "emulator", "live", os.path.join(ROOT, "scenarios", "live-gloo-loopback.yaml"), "--world", "4",
           "--clock", "virtual", "--out", str(out), *extra, "--", "python",
           os.path.join(ROOT, "examples", "train_mlp.py"), "--iters", "6", "--quiet"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    with open(out / "record.json") as fh:
        return json.load(fh)


def test_a_live_run_with_the_model_waits_for_the_lag(tmp_path):
    pytest.importorskip("torch", reason="emulator live needs PyTorch (pip install '.[live]')")
    rec = _live(tmp_path, "on", "--set", "live.skew=model", "--set", "live.skew_base=50 ms", "--set",
                "live.skew_slope=0")
    # b = 0: every gradient all-reduce of the 4 ranks starts e_4 * 50 ms = 51.47 ms after its issue
    ars = [c for c in rec["comms"] if c["op"] == "all_reduce"]
    assert len(ars) == 6
    assert all(c["start_s"] - c["issue_s"] == pytest.approx(1.0293754 * 0.050, rel=1e-6) for c in ars)
    assert rec["skew"] == {"base_s": 0.05, "slope": 0.0}
    assert any(n.startswith("live.skew: model") for n in rec["notes"])
    off = _live(tmp_path, "off")
    assert all(c["start_s"] == c["issue_s"] for c in off["comms"] if c["op"] == "all_reduce")
    assert "skew" not in off


def test_a_wait_before_the_collective_is_not_negative_overlap():
    from emulator.live.report import summarize

    # iteration [1, 2]: issued at 1.1, the lag puts the start at 1.3, the all-reduce runs [1.3, 1.5] and the
    # rank waits [1.1, 1.5]: exposed 0.4 s, comm 0.2 s, all of it under the wait: overlapped 0 (was 0.2 - 0.4 < 0).
    # Iteration [2, 3]: comm [2.2, 2.6], waited [2.5, 2.6]: overlapped 0.4 - 0.1 = 0.3 s. Mean (0 + 0.3)/2 = 0.15 s
    record = {"world": 4, "rank": 0, "clock": "virtual", "hidden_s": 0.0, "end_s": 3.0, "steps_s": [1.0, 2.0, 3.0],
              "engine_runs": 1, "notes": [],
              "comms": [{"start_s": 1.3, "end_s": 1.5, "issue_s": 1.1, "bytes": 10.0, "group": [0, 1], "op": "all_reduce",
                         "stream": "c", "seq": 0},
                        {"start_s": 2.2, "end_s": 2.6, "issue_s": 2.2, "bytes": 10.0, "group": [0, 1], "op": "all_reduce",
                         "stream": "c", "seq": 1}],
              "waits": [{"start_s": 1.1, "end_s": 1.5, "reason": "backward"},
                        {"start_s": 2.5, "end_s": 2.6, "reason": "backward"}]}
    s = summarize(record, "x")
    assert s["breakdown_s"]["exposed_comm"] == pytest.approx(0.25)  # (0.4 + 0.1) / 2
    assert s["live"]["overlapped_comm_s"] == pytest.approx(0.15)
