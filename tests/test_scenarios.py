"""Every scenario in scenarios/ and every trace in traces/ runs, and its summary holds together."""
import glob
import json
import os

import pytest

from emulator.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCENARIOS = sorted(glob.glob(os.path.join(ROOT, "scenarios", "*.yaml")))
KEYS = {"scenario", "gpus", "iteration_time_s", "samples_per_s", "tokens_per_s", "model_tflops_per_gpu",
        "hardware_tflops_per_gpu", "mfu", "hfu", "breakdown_s", "memory", "sim"}


def _kind(path):
    from emulator.scenario import load_scenario

    sc = load_scenario(path)
    if os.path.basename(path).startswith("live-"):
        return "live", sc
    return ("run" if sc.model is not None or sc.workload.trace or sc.jobs else "collective"), sc


@pytest.mark.parametrize("path", SCENARIOS, ids=[os.path.basename(p) for p in SCENARIOS])
def test_scenario_runs(path, capsys):
    kind, sc = _kind(path)
    if kind == "live":
        pytest.skip("live scenarios run under `emulator live` (tests/test_live.py)")
    if kind == "collective":
        assert main(["collective", path, "--sizes", "1MiB:4MiB", "--json"]) == 0
        rows = json.loads(capsys.readouterr().out)
        assert [r["bytes"] for r in rows] == [2**20, 2**21, 2**22]
        assert all(r["busbw_GB_per_s"] > 0 for r in rows)
        return
    assert main(["run", path, "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert KEYS <= set(s)
    assert s["scenario"] == sc.name and s["iteration_time_s"] > 0
    bd = s["breakdown_s"]
    # the four parts add up to the iteration time
    assert sum(bd.values()) == pytest.approx(s["iteration_time_s"], rel=1e-9)
    assert set(s["memory"]) >= {"peak_bytes_per_gpu", "capacity_bytes", "fits"}
    assert set(s["sim"]) >= {"events", "wall_s", "ranks_simulated"}
    if sc.model is not None or sc.jobs:
        assert 0 < s["mfu"] <= s["hfu"] < 1
    if sc.jobs:  # one row per job, each at least as slow as alone on the same nodes
        assert [j["name"] for j in s["jobs"]] == [j.name for j in sc.jobs]
        assert all(j["slowdown"] >= 1.0 for j in s["jobs"])
    if sc.workload.format == "kineto":  # a replayed real trace: each rank's span within 10 % of measured
        assert s["replay"] and all(abs(r["span_error"]) < 0.10 for r in s["replay"])


def test_every_trace_is_used_by_a_scenario_or_test():
    used = set()
    for path in SCENARIOS + sorted(glob.glob(os.path.join(ROOT, "tests", "*.py"))):
        with open(path) as fh:
            used.add(fh.read())
    blob = "\n".join(used)
    traces = [p for p in glob.glob(os.path.join(ROOT, "traces", "*")) if not p.endswith(".md")]
    for t in traces:
        assert os.path.basename(t) in blob, f"{t} is not exercised by any scenario or test"
