"""How close `emulator run --estimate` comes to the run: one table, every scenario.

    python benchmarks/estimate_check.py [--cases quickstart,spine-link-failure] [--skip-slow] [--json] [--save]

For each case (every scenario in scenarios/ that `emulator run` runs, and a few variants with
folding off) it runs, each in a fresh process, the estimate (``emulator.studies.estimate.count``)
and the run (`emulator run --json`), and prints: the estimated and the real wall time and their
ratio, the real CPU time (user + system of the child: steadier than wall on a shared machine), both
over this machine's SimPy floor (``benchmarks/run.py``'s, measured in the same run), and the
estimated and the real events (the run's ``sim.events``). The estimate's wall time is compared with
the run's whole command, interpreter start included, as a user times it.

With ``--save`` the rows go to benchmarks/results/estimate.json, written atomically.
Not part of CI: tests/test_estimate.py checks the event counts of the quick cases.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from run import precompile, simpy_floor  # noqa: E402  (benchmarks/run.py: the same floor)

FAULT = "cluster.overrides=[{kind: gpu_slowdown, target: 'gpu:3', factor: 2}]"
# variants that turn folding off (issue #42: "failures turn folding off"); slow ones are marked
VARIANTS = {
    "llama3-70b-64-h100-unfolded": ("scenarios/llama3-70b-64-h100.yaml", ["simulation.fold=off"], False),
    "quickstart-unfolded": ("scenarios/quickstart.yaml", ["simulation.fold=off"], False),
    "gpt3-175b-1024-a100-straggler": ("scenarios/gpt3-175b-1024-a100.yaml", [FAULT], True),
    "mixtral-8x7b-moe-32-h100-unfolded": ("scenarios/mixtral-8x7b-moe-32-h100.yaml", ["simulation.fold=off"], False),
    # a link failing and coming back mid-run (timed faults: every flow on the clock) on 128 GPUs
    "spine-link-failure-128": ("scenarios/spine-link-failure.yaml",
                               ["cluster.nodes=16", "parallel.dp=32", "training.global_batch=256",
                                "training.micro_batch=1"], False),
}
# scenarios whose run takes minutes on the reference machine (left out by --skip-slow)
SLOW = {"qwen3-235b-256-h100", "deepseek-v3-1024-h100", "gpt3-175b-1024-a100-straggler"}

COUNT = """
import json, resource, sys, time
from emulator.scenario import load_scenario
from emulator.studies.estimate import count
t0 = time.perf_counter()
e = count(load_scenario(sys.argv[1], sys.argv[2:]))
print(json.dumps({"events": e.events, "wall_s": e.wall_s, "build_s": e.build_s, "simulated": e.simulated,
                  "gpus": e.gpus, "ops": e.ops, "estimate_s": time.perf_counter() - t0}))
"""


def runnable(path: str) -> bool:
    """Whether `emulator run` runs it: a model, a trace or jobs (not a live or collective scenario)."""
    sys.path.insert(0, ROOT)
    from emulator.scenario import load_scenario

    if os.path.basename(path).startswith("live-"):
        return False
    sc = load_scenario(path)
    return sc.model is not None or bool(sc.workload.trace) or bool(sc.jobs)


def cases() -> dict[str, tuple[str, list[str], bool]]:
    out = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "scenarios", "*.yaml"))):
        if runnable(path):
            name = os.path.basename(path)[:-5]
            out[name] = (os.path.relpath(path, ROOT), [], name in SLOW)
    for name, (path, sets, _slow) in VARIANTS.items():
        out[name] = (path, sets, name in SLOW)
    return out


def child(cmd: list[str]) -> tuple[str, float, float]:
    """Run ``cmd`` from the checkout; its stdout, wall and CPU (user + system) seconds."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=ROOT)
        _pid, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(err.read().decode().strip().splitlines()[-1])
        return out.read().decode(), wall, usage.ru_utime + usage.ru_stime


def measure(path: str, sets: list[str]) -> dict:
    est_out, _w, _c = child([sys.executable, "-c", COUNT, os.path.join(ROOT, path), *sets])
    est = json.loads(est_out)
    cmd = [sys.executable, "-m", "emulator", "run", os.path.join(ROOT, path), "--json"]
    for s in sets:
        cmd += ["--set", s]
    out, wall, cpu = child(cmd)
    s = json.loads(out)
    return {"estimated_wall_s": est["wall_s"], "estimated_events": est["events"], "estimate_build_s": est["build_s"],
            "wall_s": wall, "cpu_s": cpu, "sim_wall_s": s["sim"]["wall_s"], "events": s["sim"]["events"],
            "ranks_simulated": s["sim"]["ranks_simulated"], "estimated_simulated": est["simulated"]}


def table(rows: dict[str, dict], floor: float, floor_cpu: float) -> str:
    head = (f"{'case':<34} {'est wall':>9} {'wall':>8} {'ratio':>6} {'cpu':>8} {'ratio':>6} {'wall/fl':>7} "
            f"{'cpu/fl':>7} {'est events':>11} {'events':>11} {'ratio':>6}")
    out = [head]
    for name, r in rows.items():
        if "error" in r:
            out.append(f"{name:<34} error: {r['error']}")
            continue
        ev = r["estimated_events"] / r["events"] if r["events"] else float("nan")
        out.append(f"{name:<34} {r['estimated_wall_s']:9.2f} {r['wall_s']:8.2f} "
                   f"{r['estimated_wall_s'] / r['wall_s']:6.2f} {r['cpu_s']:8.2f} "
                   f"{r['estimated_wall_s'] / r['cpu_s']:6.2f} {r['wall_s'] / floor:7.1f} {r['cpu_s'] / floor_cpu:7.1f} "
                   f"{r['estimated_events']:11,d} {r['events']:11,d} {ev:6.2f}")
    out.append(f"ratio: estimated wall over the run's wall, then over its CPU time. SimPy floor (1,000,000 "
               f"timeouts, one process) on this machine: {floor:.3f} s wall, {floor_cpu:.3f} s CPU")
    return "\n".join(out)


def save(rows: dict[str, dict], all_cases: dict, floor: float, floor_cpu: float) -> None:
    import results_file

    doc = results_file.read("estimate") or {"cases": {}}
    for name, r in rows.items():
        if "error" in r:
            continue
        path, sets, _slow = all_cases[name]
        doc["cases"][name] = dict(r, scenario=path, set=list(sets), simpy_floor_s=floor, simpy_floor_cpu_s=floor_cpu,
                                  wall_ratio=r["estimated_wall_s"] / r["wall_s"],
                                  cpu_ratio=r["estimated_wall_s"] / r["cpu_s"],
                                  wall_over_floor=r["wall_s"] / floor, cpu_over_floor=r["cpu_s"] / floor_cpu,
                                  **results_file.stamp(__file__))
    sys.stderr.write(f"wrote {results_file.write('estimate', doc)}\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", help="comma-separated case names (default: all)")
    ap.add_argument("--skip-slow", action="store_true", help="leave out the runs of minutes")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--save", action="store_true", help="keep the rows in benchmarks/results/estimate.json")
    args = ap.parse_args(argv)
    all_cases = cases()
    names = args.cases.split(",") if args.cases else [n for n, c in all_cases.items() if not (args.skip_slow and c[2])]
    unknown = [n for n in names if n not in all_cases]
    if unknown:
        ap.error(f"unknown case(s) {unknown}; known: {', '.join(all_cases)}")
    precompile(ROOT)
    floor, floor_cpu = simpy_floor()
    rows: dict[str, dict] = {}
    for name in names:
        path, sets, _slow = all_cases[name]
        try:
            rows[name] = measure(path, sets)
        except RuntimeError as exc:
            rows[name] = {"error": str(exc)}
        if not args.json:
            sys.stderr.write(f"done {name}\n")
    print(json.dumps({"floor_s": floor, "floor_cpu_s": floor_cpu, "cases": rows}, indent=1) if args.json
          else table(rows, floor, floor_cpu))
    if args.save:
        save(rows, all_cases, floor, floor_cpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
