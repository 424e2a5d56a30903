"""The standard benchmark set: one command, one table.

    python benchmarks/run.py [--cases node-8gpu,gpt3-1024] [--unfolded] [--baseline REV] [--repeat N] [--json] [--save]

For each case it prints wall time, the wall time over this machine's SimPy floor
(one process waiting on 1,000,000 ``env.timeout``s, the least of three runs, measured just before the
case, so the ratio travels between machines that differ by 2-3x, and holds on a machine whose speed
drifts over the minutes the set takes), the same for CPU time (the
case's user + system time over the floor's, steadier where other work shares the
cores), events, events/s, ranks
simulated, peak RSS and the predicted iteration time (so a speed-up that changes
the answer is caught).
Each case runs in a fresh process (`emulator run --json`), so peak RSS is that
run's alone; with ``--repeat N`` the fastest of N runs is kept (noise on a shared machine only adds:
on the 2-core reference machine one DeepSeek-V3 run ranged 10.4-12.6 s within an hour). With ``--baseline REV`` the same cases run first on a checkout of
git revision REV (a temporary worktree), and the table adds the wall-time ratio
baseline / now, measured on the same machine in one go.

With ``--save`` each case's row (and the floor it was measured against) replaces that case's row
in benchmarks/results/speed.json, written atomically; the docs site's Validation page and the
README's speed figures are rendered from that file, never typed.

Not part of CI except the tiny smoke case in tests/test_benchmarks.py.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CASES = {
    "node-8gpu": ("benchmarks/scenarios/node-8gpu.yaml", []),
    "gpt3-1024": ("scenarios/gpt3-175b-1024-a100.yaml", []),
    "llama3-405b-16k": ("benchmarks/scenarios/llama3-405b-16k-h100.yaml", []),
    "moe-1024": ("benchmarks/scenarios/moe-1024-h100.yaml", []),
    "fabric-4096": ("benchmarks/scenarios/fabric-4096-oversubscribed.yaml", []),
    # the published layouts of issue #13: 145B (DP 24) now folds across leaves; 1T (PP 64, DP 1) and
    # 530B (PP 35, DP 9) do not
    "gpt-145b-1536": ("benchmarks/scenarios/gpt-145b-1536-a100.yaml", []),
    "gpt-1t-512": ("benchmarks/scenarios/gpt-1t-512-a100.yaml", []),
    "gpt-530b-2520": ("benchmarks/scenarios/gpt-530b-2520-a100.yaml", []),
    # the same, its replicas folded in effect within bounds (simulation.fold_tolerance: the iteration
    # times at the least and greatest latencies of each transfer's copies agree to 1e-4; exact: 0)
    "gpt-530b-2520-bounded": ("benchmarks/scenarios/gpt-530b-2520-a100.yaml", ["simulation.fold_tolerance=1e-4"]),
    # GPT-3 125M, pure data parallelism over 8,192 A100 (1024 DGX A100, global batch 8192): one
    # 8,192-member DP group (issue #13's table), made from the GPT-3 scenario's cluster and fabric
    "dp8192": ("scenarios/gpt3-175b-1024-a100.yaml",
               ["cluster.nodes=1024", "model.preset=gpt3-125m", "training.global_batch=8192",
                "training.recompute=none", "parallel.tp=1", "parallel.pp=1", "parallel.dp=8192",
                "parallel.schedule=1f1b", "parallel.virtual_stages=1"]),
    # several jobs on one fabric (issue 29): one job as a one-entry jobs: list (the top-level cost),
    # two spread over a 2:1 tree, eight at random on a 4:1 three-tier tree, 32 staggered
    "jobs-1x175b-512": ("benchmarks/scenarios/jobs-1x175b-512.yaml", []),
    "jobs-2x70b-spread": ("benchmarks/scenarios/jobs-2x70b-spread-2to1.yaml", []),
    "jobs-8x512-random": ("benchmarks/scenarios/jobs-8x512-random-4096.yaml", []),
    "jobs-32x64-stagger": ("benchmarks/scenarios/jobs-32x64-staggered-2048.yaml", []),
    # MoE parallel folding (issue 28): the DeepSeek-V3 and Qwen3-235B recipes' layouts (EP over TP ranks)
    "qwen3-235b-256": ("scenarios/qwen3-235b-256-h100.yaml", []),
    # GLM-5.1's H100 recipe: DeepEP dispatches over 4 nodes, every rank simulated (folding.py _cp_axes)
    "glm-5-416": ("benchmarks/scenarios/glm-5-416-h100.yaml", []),
    "deepseek-v3-1024": ("scenarios/deepseek-v3-1024-h100.yaml", []),
    # issue 36: DeepEP dispatch with binomial (force-balanced) routing; the same with skewed routing (the
    # busiest EP rank 1.5x: every rank still costed as it, so the fold holds); and 4,096 GPUs (DP 128)
    "deepseek-v3-1024-skewed": ("scenarios/deepseek-v3-1024-h100.yaml",
                                ["model.moe_router_force_load_balancing=false", "model.moe_imbalance=3"]),
    "deepseek-v3-4096": ("scenarios/deepseek-v3-1024-h100.yaml", ["cluster.nodes=512", "parallel.dp=128"]),
    # the recipe's 1F1B all-to-all overlap (parallel.overlap_moe_expert_parallel_comm): a sequence-parallel
    # collective of one micro-batch begins on the NVLinks of the other's dispatch run ahead (Fabric._join)
    "qwen3-235b-256-overlap": ("scenarios/qwen3-235b-256-h100.yaml",
                               ["parallel.overlap_moe_expert_parallel_comm=true", "parallel.delay_wgrad_compute=true"]),
    "qwen3-235b-256-skewed": ("scenarios/qwen3-235b-256-h100.yaml",
                              ["model.moe_expert_capacity_factor=null", "model.moe_pad_expert_input_to_capacity=false",
                               "model.moe_imbalance=3"]),
    # Blackwell at rack scale (issue 38): Llama-3 405B on 64 GB200 NVL72 racks, 4,608 GPUs in 1,152 trays
    "llama3-405b-4608-gb200": ("benchmarks/scenarios/llama3-405b-4608-gb200.yaml", []),
    # the host's launches (docs/guides/host-launches.md): Qwen3-30B-A3B on two GB200 racks, host-bound at 100 us a
    # launch (every layer waits for the host's issuing, a cpu op a list), and the same without the host
    "qwen3-30b-gb200-host-bound": ("scenarios/buyer-qwen3-30b-144gpu.yaml",
                                   ["cluster.node=gb200-nvl72", "cluster.nodes=36", "model.seq_len=2048",
                                    "cluster.node.host_launch=100 us"]),
    "qwen3-30b-gb200-no-host": ("scenarios/buyer-qwen3-30b-144gpu.yaml",
                                ["cluster.node=gb200-nvl72", "cluster.nodes=36", "model.seq_len=2048",
                                 "cluster.node.host_launch=0 us"]),
}
UNFOLDED = {"gpt3-1024-unfolded": ("scenarios/gpt3-175b-1024-a100.yaml", ["simulation.fold=off"])}


def run_case(root: str, scenario: str, sets: list[str]) -> dict:
    """Run one case in a child process; measure its wall time and peak RSS."""
    cmd = [sys.executable, "-m", "emulator", "run", os.path.join(ROOT, scenario), "--json"]
    for s in sets:
        cmd += ["--set", s]
    env = dict(os.environ, PYTHONPATH=root)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=root)
        _pid, status, usage = os.wait4(proc.pid, 0)  # this child's own peak RSS and CPU time
        wall = time.perf_counter() - t0
        cpu = usage.ru_utime + usage.ru_stime
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    rss_kb = usage.ru_maxrss
    if proc.returncode != 0:
        return {"error": stderr.strip().splitlines()[-1] if stderr.strip() else f"exit {proc.returncode}"}
    s = json.loads(stdout)
    events = s["sim"]["events"]
    return {"wall_s": wall, "cpu_s": cpu, "sim_wall_s": s["sim"]["wall_s"], "events": events,
            "events_per_s": events / s["sim"]["wall_s"] if s["sim"]["wall_s"] > 0 else 0.0,
            "ranks_simulated": s["sim"]["ranks_simulated"], "gpus": s["gpus"],
            "peak_rss_mb": rss_kb / 1024, "iteration_time_s": s["iteration_time_s"]}


def fastest(root: str, scenario: str, sets: list[str], repeat: int) -> dict:
    """``run_case`` ``repeat`` times; the run of least wall time (an error at once)."""
    best: dict | None = None
    for _ in range(max(1, repeat)):
        r = run_case(root, scenario, sets)
        if "error" in r:
            return r
        if best is None or r["wall_s"] < best["wall_s"]:
            best = r
    assert best is not None
    return best


FLOOR = """
import time, simpy
env = simpy.Environment()
def wait(env):
    for _ in range(1_000_000):
        yield env.timeout(1)
env.process(wait(env))
t0, c0 = time.perf_counter(), time.process_time()
env.run()
print(time.perf_counter() - t0, time.process_time() - c0)
"""


FLOOR_RUNS = 3  # the floor is the least of these (a fresh process each): a shared machine's noise only adds


def simpy_floor() -> tuple[float, float]:
    """Seconds (wall, CPU) this machine takes for one SimPy process to wait on 1,000,000 timeouts
    (fresh process), the least of ``FLOOR_RUNS`` runs: on the 2-core reference machine one run ranged
    from 0.74 to 1.14 s within minutes (2026-12-06), which moved every ratio by as much. Each case is
    one run, so a ratio errs high, if at all. On a shared machine the CPU times give the steadier ratio."""
    walls, cpus = [], []
    for _ in range(FLOOR_RUNS):
        out = subprocess.run([sys.executable, "-c", FLOOR], capture_output=True, text=True, check=True)
        wall, cpu = out.stdout.split()
        walls.append(float(wall))
        cpus.append(float(cpu))
    return min(walls), min(cpus)


def precompile(root: str) -> None:
    """Write the package's bytecode once before timing. Python writes it on a module's first
    import, but an editable install under PYTHONDONTWRITEBYTECODE (set on some machines) never
    does, and every run then recompiles emulator/ (~0.1 s, a sixth of the floor): the cost of a
    development environment, not of the emulator."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(root, "emulator")], check=True)


def worktree(rev: str) -> str:
    path = tempfile.mkdtemp(prefix="emulator-baseline-")
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", path, rev], check=True, capture_output=True)
    return path


def table(rows: list[tuple[str, dict, dict | None]]) -> str:
    head = f"{'case':<20} {'wall s':>8} {'/floor':>7} {'cpu s':>7} {'/floor':>7} {'events':>10} {'events/s':>10} {'ranks':>6} {'RSS MB':>8} {'iteration s':>14}"
    out = [head + ("  baseline/now" if any(b for _, _, b in rows) else "")]
    for name, r, b in rows:
        if "error" in r:
            out.append(f"{name:<20} error: {r['error']}")
            continue
        line = (f"{name:<20} {r['wall_s']:8.2f} {r['wall_s'] / r['simpy_floor_s']:7.2f} {r['cpu_s']:7.2f} "
                f"{r['cpu_s'] / r['simpy_floor_cpu_s']:7.2f} {r['events']:10,d} {r['events_per_s']:10,.0f} "
                f"{r['ranks_simulated']:6d} {r['peak_rss_mb']:8.0f} {r['iteration_time_s']:14.6f}")
        if b and "error" not in b:
            same = "" if b["iteration_time_s"] == r["iteration_time_s"] else "  (answer changed!)"
            line += f"  {b['wall_s'] / r['wall_s']:6.2f}x{same}"
        out.append(line)
    floors = [r["simpy_floor_s"] for _, r, _ in rows if "simpy_floor_s" in r]
    if floors:
        out.append(f"SimPy floor (1,000,000 timeouts, one process, least of {FLOOR_RUNS}, before each case) on this "
                   f"machine: {min(floors):.3f}-{max(floors):.3f} s wall (cpu s / floor: CPU time over CPU time, "
                   "steadier on a shared machine)")
    return "\n".join(out)


def save(rows: list[tuple[str, dict, dict | None]], cases: dict) -> None:
    """Each measured case's row into benchmarks/results/speed.json (the other cases' rows are kept)."""
    sys.path.insert(0, HERE)
    import results_file

    doc = results_file.read("speed") or {"cases": {}}
    for name, r, _b in rows:
        if "error" in r:
            continue
        scenario, sets = cases[name]
        doc["cases"][name] = dict(r, scenario=scenario, set=list(sets), wall_over_floor=r["wall_s"] / r["simpy_floor_s"],
                                  cpu_over_floor=r["cpu_s"] / r["simpy_floor_cpu_s"], **results_file.stamp(__file__))
    sys.stderr.write(f"wrote {results_file.write('speed', doc)}\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", help="comma-separated case names (default: all)")
    ap.add_argument("--unfolded", action="store_true", help="add GPT-3 1024 unfolded (minutes)")
    ap.add_argument("--baseline", metavar="REV", help="also run a git revision and report the ratio")
    ap.add_argument("--repeat", type=int, default=1, metavar="N", help="keep the fastest of N runs of each case")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--save", action="store_true", help="keep the rows in benchmarks/results/speed.json")
    args = ap.parse_args(argv)
    cases = dict(CASES, **(UNFOLDED if args.unfolded else {}))
    names = args.cases.split(",") if args.cases else list(cases)
    unknown = [n for n in names if n not in cases and n not in UNFOLDED]
    if unknown:
        ap.error(f"unknown case(s) {unknown}; known: {', '.join(list(CASES) + list(UNFOLDED))}")
    cases.update(UNFOLDED)
    base_root = worktree(args.baseline) if args.baseline else None
    rows = []
    for root in filter(None, (ROOT, base_root)):
        precompile(root)
    try:
        for name in names:
            scenario, sets = cases[name]
            floor, floor_cpu = simpy_floor()
            b = fastest(base_root, scenario, sets, args.repeat) if base_root else None
            r = fastest(ROOT, scenario, sets, args.repeat)
            if "error" not in r:
                r.update(simpy_floor_s=floor, simpy_floor_cpu_s=floor_cpu)
            rows.append((name, r, b))
            if not args.json:
                sys.stderr.write(f"done {name}\n")
    finally:
        if base_root:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", base_root], capture_output=True)
    if args.save:
        save(rows, cases)
    if args.json:
        doc = {n: {"now": r, "baseline": b, "simpy_floor_s": r.get("simpy_floor_s"),
                   "simpy_floor_cpu_s": r.get("simpy_floor_cpu_s"),
                   "wall_over_floor": r["wall_s"] / r["simpy_floor_s"] if "wall_s" in r else None,
                   "cpu_over_floor": r["cpu_s"] / r["simpy_floor_cpu_s"] if "cpu_s" in r else None}
               for n, r, b in rows}
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        sys.stdout.write(table(rows) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
