"""The benchmark runner's smoke case (the full set runs on demand, outside CI)."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_benchmark_smoke_case_reports_every_figure():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "run.py"), "--cases", "node-8gpu", "--json"],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    case = json.loads(out.stdout)["node-8gpu"]
    row = case["now"]
    # the machine's SimPy floor, measured in the same run, and the wall time over it
    assert case["simpy_floor_s"] > 0 and case["wall_over_floor"] == row["wall_s"] / case["simpy_floor_s"]
    assert case["simpy_floor_cpu_s"] > 0 and case["cpu_over_floor"] == row["cpu_s"] / case["simpy_floor_cpu_s"]
    assert set(row) >= {"wall_s", "cpu_s", "events", "events_per_s", "ranks_simulated", "peak_rss_mb", "iteration_time_s"}
    # 8 GPUs, TP 2 × PP 2 × DP 2 folded over TP and DP: one simulated rank per stage = 2
    assert row["gpus"] == 8 and row["ranks_simulated"] == 2
    assert row["events"] > 0 and row["peak_rss_mb"] > 0


def test_the_issue_13_layouts_load_as_published_and_fit():
    # benchmarks/scenarios: the three layouts of issue #13's table (each runs for minutes: not run here)
    from emulator.scenario import load_scenario
    from emulator.workload.memory import memory_report

    expected = {  # file: (GPUs, tp, pp, dp, schedule, virtual stages, recompute, SP)
        "gpt-145b-1536-a100.yaml": (1536, 8, 8, 24, "interleaved-1f1b", 2, "full", False),  # 8·8·24 = 1536
        "gpt-1t-512-a100.yaml": (512, 8, 64, 1, "1f1b", 1, "selective", True),  # 8·64·1 = 512
        "gpt-530b-2520-a100.yaml": (2520, 8, 35, 9, "interleaved-1f1b", 3, "full", False),  # 8·35·9 = 2520
    }
    for name, want in expected.items():
        sc = load_scenario(os.path.join(ROOT, "benchmarks", "scenarios", name))
        par = sc.parallel
        assert (sc.gpus, par.tp, par.pp, par.dp, par.schedule, par.virtual_stages, sc.training.recompute,
                par.sequence_parallel) == want, name
        assert memory_report(sc).fits, name
