"""Checks of `emulator live --real K` on this machine: fidelity, stragglers, pipelines.

1. fidelity: examples/train_mlp.py (DDP, one gradient bucket) at hidden 256, 512, 768
   (0.53, 2.1, 4.7 MB of gradients) as
   (real)  4 gloo processes;
   (2 + 2) `emulator live --real 2 --world 4`: 2 real gloo processes (their DP all-reduce
           is mixed: data by the mirror rules, timing emulated from the later real arrival),
           beside 2 neighbour processes that stand for ranks 2 and 3's share of the 2 cores.
           --neighbours paced (default, from run 11 of the README): each in step with the real
           rank its emulated rank mirrors (benchmarks/paced_neighbour.py): it computes what that
           rank computes from each end of its waits on communication, then sleeps until the next,
           as ranks 2 and 3 of the real job do; live: a 1-rank live run of the script, which
           computes, then sleeps through its emulated all-reduce, out of step with the real ranks
           (runs 7, 8, 10: fast by 1-19%); compute: the script alone, which never pauses (runs
           1-6, 9: while the real ranks waited, the cores stayed full, and the live side ran
           2-19% slow at 4.7 MB); gloo: a real 2-rank gloo run of the script.
   Each size --reps times, interleaved; medians, ranges, relative error. The fabric is
   calibrated first with the existing procedure (benchmarks/live_gloo_calibration.py,
   into a temporary scenario; --scenario PATH to reuse one).
2. straggler: the same 2 + 2 run (hidden 512, no neighbours) without and with a
   gpu_slowdown ×2 on emulated rank 3. `emulator run` predicts the lengthening on a
   Program of the same layout with the measured compute (``phases``: per iteration the
   compute up to the issue of the gradient all-reduce, the compute beside it, the compute
   after the wait), run by ``emulator.run.simulation.run_program`` with and without the
   override: on the base run's mean compute, on each run's own, and traced (each real
   rank's own compute, iteration by iteration: the check).
3. pipeline: see ``pipeline`` (1 real stage + 3 emulated, 1F1B) against `emulator run`.

   With --skew A_MS B, each repetition also runs 2 + 2 with the arrival-skew model
   (live.skew: model), interleaved with the others.

Usage: .venv/bin/python benchmarks/live_real_check.py [fidelity|straggler|pipeline|all] [--reps R]
       [--iters N] [--hidden H ...] [--scenario PATH] [--skew A_MS B] [--neighbours live|compute|gloo]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import live_gloo_calibration as cal  # noqa: E402

SKIP = cal.SKIP


def _loaders(hidden: int, n: int, scenario: str | None = None, kind: str = "compute",
             out: str = "") -> list[subprocess.Popen]:
    """``n`` neighbour processes that load the 2 cores as the 2 emulated ranks' own processes would in
    the real job. ``kind``: "paced", each in step with real rank i (``benchmarks/paced_neighbour.py``,
    paced through the sockets ``out``/pace/rank<i>: ``_live_run`` sets EMULATOR_LIVE_PACE);
    "compute", each the script alone (it computes without a pause); "live"
    (with ``scenario``), each a 1-real-rank live run of the script (it computes, then sleeps through
    its emulated all-reduce); "gloo", the ``n`` together a real ``n``-rank gloo run of the script
    (it computes, then all-reduces among them for real, keeping the cores busy as a transport does).
    A live neighbour writes its results under ``out``."""
    procs = []
    port = str(cal.free_port())
    for i in range(n):
        if kind == "gloo":
            env = dict(os.environ, RANK=str(i), WORLD_SIZE=str(n), LOCAL_RANK=str(i), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=port)
        else:
            env = dict(os.environ, RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(cal.free_port()))
        args = [sys.executable, *cal._script_args(hidden, 10**7)]
        if kind == "paced":
            os.makedirs(os.path.join(out, "pace"), exist_ok=True)
            args = [sys.executable, os.path.join(ROOT, "benchmarks", "paced_neighbour.py"), "--socket",
                    os.path.join(out, "pace", f"rank{i}"), "--hidden", str(hidden)]
        if kind == "live":
            assert scenario is not None and out
            args = [sys.executable, "-m", "emulator", "live", scenario, "--world", "4", "--clock", "wall", "--out",
                    os.path.join(out, f"neighbour{i}"), "--", "python", *cal._script_args(hidden, 10**7)]
        # a session of its own: a live neighbour's script is its child, killed with it (``_stop``)
        procs.append(subprocess.Popen(args, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      start_new_session=True))
    time.sleep(3.0)
    return procs


def _stop(procs: list[subprocess.Popen]) -> None:
    """Kill each neighbour and everything it started."""
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


def live_run(scenario: str, hidden: int, iters: int, neighbours: int, extra: tuple[str, ...] = (),
             clock: str = "wall", kind: str = "compute") -> dict:
    """`emulator live --real 2 --world 4`: the summary, and the mean of the real ranks' iteration times
    (``kind``: of the neighbours, see ``_loaders``)."""
    with tempfile.TemporaryDirectory() as tmp:
        return _live_run(scenario, hidden, iters, neighbours, extra, clock, kind, tmp)


def _live_run(scenario: str, hidden: int, iters: int, neighbours: int, extra: tuple[str, ...], clock: str, kind: str,
              work: str) -> dict:
    loaders = _loaders(hidden, neighbours, scenario, kind, work)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [sys.executable, "-m", "emulator", "live", scenario, "--world", "4", "--real", "2", "--clock", clock,
                   "--out", tmp, *extra, "--", "python", *cal._script_args(hidden, iters)]
            env = dict(os.environ, EMULATOR_LIVE_PACE=os.path.join(work, "pace")) if kind == "paced" else None
            subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, env=env)
            with open(os.path.join(tmp, "summary.json")) as fh:
                summary = json.load(fh)
            with open(os.path.join(tmp, "record.json")) as fh:
                record = json.load(fh)
    finally:
        _stop(loaders)
    per_rank, parts = [], []
    from emulator.live.report import iterations

    for rec in [record, *record.get("real_records", [])]:
        rows = iterations(rec)[SKIP:]
        per_rank.append(statistics.mean(r["time_s"] for r in rows))
        parts.append(phases(rec)[SKIP:])
    return {"iteration_s": statistics.mean(per_rank), "summary": summary, "parts": parts}


def phases(record: dict) -> list[tuple[float, float, float, float]]:
    """Per iteration (``iterations(record)``'s rows), the local rank's compute in four parts: up to the
    issue of its gradient all-reduce (forward, backward to the bucket), from the issue to the wait on
    it (the rest of the backward, overlapping the all-reduce), the wake-up after its waits (the wall
    clock resumes the rank after a wait's end: a host's latency, which a slower GPU does not
    stretch), and the rest after the wait (the optimizer step). An iteration without such an
    all-reduce is all first part."""
    from emulator.live.report import iterations

    waits = [(w["start_s"], w["end_s"]) for w in record["waits"]]
    woken = [(w["end_s"], w.get("resumed_s", w["end_s"])) for w in record["waits"]]

    def blocked(lo: float, hi: float) -> float:
        return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in waits)

    out = []
    for row in iterations(record):
        lo, hi = row["start_s"], row["end_s"]
        issues = [c["issue_s"] for c in record["comms"] if c["op"] == "all_reduce" and len(c["group"]) > 2
                  and lo <= c["issue_s"] < hi]
        if not issues:
            out.append((row["compute_s"], 0.0, 0.0, 0.0))
            continue
        t = issues[-1]
        wait = min((a for a, _b in waits if a >= t and a < hi), default=hi)
        pre = t - lo - blocked(lo, t)
        post = wait - t - blocked(t, wait)
        wake = sum(max(0.0, min(b, hi) - max(a, wait)) for a, b in woken)
        out.append((pre, post, wake, row["compute_s"] - pre - post - wake))
    return out


def _ddp_program(parts: list[list[tuple[float, float, float, float]]], nbytes: float):
    """The Program of DDP with one gradient bucket on 4 ranks: per iteration, rank r computes
    ``parts[r][i]``'s first part, issues the all-reduce, computes the second part beside it, and
    after both the wake-up and the fourth (the optimizer step) — as the live run's ranks did."""
    from emulator.program import COLLECTIVE, COMPUTE, Op, Program

    group = (0, 1, 2, 3)
    ops: list[Op] = []
    for r in group:
        prev: tuple[int, ...] = ()
        for pre, post, wake, opt in parts[r]:
            a = Op(id=len(ops), rank=r, kind=COMPUTE, duration=pre, deps=prev, name="forward+backward")
            c = Op(id=a.id + 1, rank=r, kind=COLLECTIVE, stream="comm", collective="all_reduce", group=group,
                   bytes=nbytes, deps=(a.id,), name="grads")
            b = Op(id=a.id + 2, rank=r, kind=COMPUTE, duration=post, deps=(a.id,), name="backward after the issue")
            o = Op(id=a.id + 3, rank=r, kind=COMPUTE, duration=wake + opt, deps=(c.id, b.id), name="optimizer")
            ops += [a, c, b, o]
            prev = (o.id,)
    return Program(4, ops)


def _run_per_iteration(scenario: str, program, iters: int) -> float:
    from dataclasses import replace

    from emulator.run.simulation import run_program
    from emulator.scenario import load_scenario

    scen = load_scenario(scenario)
    scen = replace(scen, simulation=replace(scen.simulation, iterations=1))
    return run_program(program, scen, record_links=False).iteration_time_s / iters


def predicted_trace(scenario: str, parts: list[list[tuple[float, float, float, float]]], nbytes: float,
                    slow: tuple[int, float] | None) -> float:
    """`emulator run` driven by the live run's own measurements: real rank r computes, in iteration
    i, what it measured there (``parts[r][i]``: ``phases``), an emulated rank what its mirror did
    (× the straggler's factor), around the 4-rank all-reduce. The real ranks' arrival skew is in it."""
    from emulator.live.mirror import mirrors

    group = (0, 1, 2, 3)
    mirror = mirrors(group, len(parts))
    iters = min(len(p) for p in parts)
    per_rank = []
    for r in group:
        f = slow[1] if slow and slow[0] == r else 1.0
        per_rank.append([(a * f, b * f, w, c * f) for a, b, w, c in parts[mirror[r]][:iters]])
    return _run_per_iteration(scenario, _ddp_program(per_rank, nbytes), iters)


def fidelity(scenario: str, hiddens: list[int], reps: int, iters: int,
             skew: tuple[float, float] | None = None, kind: str = "paced") -> list[dict]:
    """``skew``: also run 2 + 2 with the arrival-skew model (a in s, b), interleaved. ``kind``: of the 2
    neighbour processes (``_loaders``)."""
    rows = []
    for hidden in hiddens:
        real, emu, skewed = [], [], []
        for _ in range(reps):
            real.append(cal.real_run(hidden, iters))
            emu.append(live_run(scenario, hidden, iters, neighbours=2, kind=kind)["iteration_s"])
            if skew is not None:
                skewed.append(live_run(scenario, hidden, iters, neighbours=2, extra=cal.skew_args(skew),
                                       kind=kind)["iteration_s"])
        row = {"hidden": hidden, "grad_MB": (2 * (hidden * hidden + hidden) + hidden + 1) * 4 / 1e6,
               "real_ms": [t * 1e3 for t in real], "live_2_2_ms": [t * 1e3 for t in emu],
               "real_median_ms": statistics.median(real) * 1e3, "live_median_ms": statistics.median(emu) * 1e3}
        row["error"] = row["live_median_ms"] / row["real_median_ms"] - 1
        if skew is not None:
            row["live_skew_ms"] = [t * 1e3 for t in skewed]
            row["live_skew_median_ms"] = statistics.median(skewed) * 1e3
            row["skew_error"] = row["live_skew_median_ms"] / row["real_median_ms"] - 1
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def predicted_straggler(scenario: str, part: tuple[float, float, float, float], nbytes: float, factor: float,
                        rank: int) -> tuple[float, float]:
    """`emulator run` on the same layout with the measured compute (each iteration ``part``: the mean
    of ``phases``): (iteration without, with the straggler ×``factor`` on ``rank``)."""
    iters = 4
    out = []
    for f in (1.0, factor):
        g = [f if r == rank else 1.0 for r in range(4)]
        per_rank = [[(part[0] * g[r], part[1] * g[r], part[2], part[3] * g[r])] * iters for r in range(4)]
        out.append(_run_per_iteration(scenario, _ddp_program(per_rank, nbytes), iters))  # type: ignore[arg-type]
    return out[0], out[1]


def _mean_part(run: dict) -> tuple[float, float, float, float]:
    """The mean over the real ranks and iterations of a live run's ``phases``."""
    rows = [p for rank in run["parts"] for p in rank]
    return tuple(statistics.mean(p[k] for p in rows) for k in range(4))  # type: ignore[return-value]


def straggler(scenario: str, reps: int, iters: int, hidden: int = 512, factor: float = 2.0) -> list[dict]:
    rows = []
    nbytes = (2 * (hidden * hidden + hidden) + hidden + 1) * 4.0
    for _ in range(reps):
        base = live_run(scenario, hidden, iters, neighbours=0)
        slow = live_run(scenario, hidden, iters, neighbours=0,
                        extra=("--set", f"cluster.overrides=[{{kind: gpu_slowdown, target: 'gpu:3', factor: {factor}}}]"))
        compute = base["summary"]["breakdown_s"]["compute"]
        p0, p1 = predicted_straggler(scenario, _mean_part(base), nbytes, factor, 3)
        row = {"live_base_ms": base["iteration_s"] * 1e3, "live_slow_ms": slow["iteration_s"] * 1e3,
               "measured_compute_ms": compute * 1e3, "run_base_ms": p0 * 1e3, "run_slow_ms": p1 * 1e3}
        row["live_delta_ms"] = row["live_slow_ms"] - row["live_base_ms"]
        row["run_delta_ms"] = row["run_slow_ms"] - row["run_base_ms"]
        row["error"] = row["live_delta_ms"] / row["run_delta_ms"] - 1
        # the same, free of the two runs' different compute (a shared machine): the straggler's wait is
        # the added exposed communication; `emulator run` on the slow run's own compute predicts it
        q0, q1 = predicted_straggler(scenario, _mean_part(slow), nbytes, factor, 3)
        row["live_added_wait_ms"] = (slow["summary"]["breakdown_s"]["exposed_comm"]
                                     - base["summary"]["breakdown_s"]["exposed_comm"]) * 1e3
        row["run_added_ms_same_compute"] = (q1 - q0) * 1e3
        row["wait_error"] = row["live_added_wait_ms"] / row["run_added_ms_same_compute"] - 1
        # each run against `emulator run` on its own measured compute: the two live runs are minutes
        # apart on a shared machine, and their compute drifts (5.3 → 6.8 ms in one pair); the
        # prediction then drifts with it, as the live lengthening does
        row["run_delta_own_compute_ms"] = (q1 - p0) * 1e3
        row["error_own_compute"] = row["live_delta_ms"] / row["run_delta_own_compute_ms"] - 1
        # each run against `emulator run` on its own measurements, rank by rank and iteration by
        # iteration (the real ranks' skew included)
        t0 = predicted_trace(scenario, base["parts"], nbytes, None)
        t1 = predicted_trace(scenario, slow["parts"], nbytes, (3, factor))
        row["run_delta_traced_ms"] = (t1 - t0) * 1e3
        row["error_traced"] = row["live_delta_ms"] / row["run_delta_traced_ms"] - 1
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", nargs="?", default="all", choices=("fidelity", "straggler", "pipeline", "all"))
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--hidden", type=int, nargs="+", default=[256, 512, 768])
    p.add_argument("--scenario", help="a calibrated scenario (default: calibrate now, into a temporary one)")
    p.add_argument("--neighbours", choices=("paced", "live", "compute", "gloo"), default="paced",
                   help="fidelity: the 2 processes beside the 2 real ranks: each in step with a real rank, "
                        "computing from each end of its waits to the next, as ranks 2 and 3 of the real job do "
                        "(default; from run 11 of the README); 1-rank live runs of the script, which compute, then "
                        "sleep through their emulated all-reduce, out of step (runs 7, 8, 10); the script alone, "
                        "which never pauses (runs 1-6, 9); or a real 2-rank gloo run of it")
    p.add_argument("--skew", nargs=2, type=float, metavar=("A_MS", "B"),
                   help="fidelity: also run 2 + 2 with live.skew: model, skew_base A_MS ms, skew_slope B (interleaved)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        scenario = args.scenario
        if scenario is None and args.what in ("fidelity", "all"):
            scenario = os.path.join(tmp, "live-gloo-loopback.yaml")
            c = cal.calibrate(scenario=scenario)
            print(f"calibrated: alpha = {c['alpha_s'] * 1e6:.1f} us/step, B = {c['bandwidth_B_per_s'] / 1e9:.3f} GB/s",
                  flush=True)
        scenario = scenario or cal.SCENARIO
        if args.what in ("fidelity", "all"):
            fidelity(scenario, args.hidden, args.reps, args.iters,
                     (args.skew[0] * 1e-3, args.skew[1]) if args.skew else None, args.neighbours)
        if args.what in ("straggler", "all"):
            straggler(scenario, args.reps, args.iters)
        if args.what in ("pipeline", "all"):
            from live_pipeline_check import pipeline  # noqa: E402  (benchmarks/live_pipeline_check.py)

            pipeline(args.reps)


if __name__ == "__main__":
    main()
