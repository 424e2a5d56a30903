"""Calibrate the emulated fabric to this machine's gloo loopback transport, then check fidelity.

1. calibrate: 4 real processes (gloo over TCP loopback, 1 torch thread each) time an
   all-reduce of S bytes, S = 1 KiB .. 16 MiB, under load: each process alternates a fixed
   synthetic compute kernel (a 512×512 fp32 matmul, 2.6 ms on one idle core) with the
   all-reduce. 3 warm-up and 40 timed rounds; each round runs every size once (interleaved,
   so a slow spell of this shared machine hits every size alike). Per round and size, the
   cost is the time from the last rank's call to each rank's return, averaged over the ranks
   (the transport of 4 ranks time-sliced on 2 cores, without their arrival skew); the median
   over rounds is kept. (``--idle``: the older idle method, back-to-back calls.) A ring
   all-reduce on n = 4 costs t = 2(n−1)·α + 2(n−1)/n·S/B, a line a + b·S, fitted up to 8 MiB
   by least squares on relative error: α = a/(2(n−1)), B = 2(n−1)/(n·b). The scenario is a
   star of 4 GPUs on one switch, each cable B each way with latency α/2 per link (one ring
   step crosses 2 links); custom graphs apply no efficiency factor. Written to ``--scenario``
   (default scenarios/live-gloo-loopback.yaml) and its ``.graph.json`` beside it.
   Calibrate in the same session as the comparison, as one runs nccl-tests on the day: this
   machine's loaded gloo latency drifts by up to 50% within an hour (α 0.97 → 1.48 ms), and a
   calibration from an earlier session put the emulated job 17-21% fast.
2. fidelity: examples/train_mlp.py (DDP, one gradient bucket) at hidden 256, 384, 512, 768
   (0.53, 1.2, 2.1, 4.7 MB of gradients), as
   (real)      4 gloo processes;
   (contended) 1 real process + 3 emulated ranks (emulator live, wall clock), beside 3
               compute-only copies of the script (world 1), so the local rank's compute shares
               the 2 cores as in the real run;
   (virtual)   optional (--virtual): the same with the virtual clock.
   The mean iteration time of a run is each rank's wall time over iterations 5.. divided by
   their number. Each size runs --reps times, interleaved; the median and the range are
   reported, with the relative error of the medians. Single runs jitter by ±10-20% on this
   machine (4 processes time-sliced on 2 cores), so single runs cannot check a 10% agreement.

   (skew)      optional (--skew A_MS B): the contended run with the arrival-skew model
               (live.skew: model, benchmarks/live_skew_calibration.py), interleaved.

Usage: .venv/bin/python benchmarks/live_gloo_calibration.py [calibrate|fidelity|all] [--iters N]
       [--hidden H ...] [--reps R] [--virtual] [--idle] [--scenario PATH] [--skew A_MS B]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCENARIO = os.path.join(ROOT, "scenarios", "live-gloo-loopback.yaml")
N = 4
SIZES = [1 << k for k in range(10, 20, 2)] + [1 << k for k in range(20, 25)]  # 1 KiB .. 16 MiB
FIT_MAX = 8 << 20  # the fit covers the models' gradient buckets (0.5-4.7 MB) with room; 16 MiB is
# reported, not fitted: past the caches the loaded transport slows per byte (a line cannot hold both)
SKIP = 5  # warm-up iterations left out of the means
REPEATS = 15  # timed batches per size (after one warm-up batch); the median is kept: 4 processes on
# 2 cores make single batches jitter by tens of percent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- 1. calibration ------------------------------------------------------------------
def _bench_worker(rank: int, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=N)
    rows = []
    for size in SIZES:
        t = torch.ones(size // 4)
        batch = 20 if size <= 1 << 18 else 4  # back-to-back all-reduces: the steady-state cost, no barrier skew
        samples = []
        for i in range(REPEATS + 1):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(batch):
                dist.all_reduce(t)
            if i:
                samples.append((time.perf_counter() - t0) / batch)
        rows.append({"bytes": size, "time_s": statistics.median(samples)})
    if rank == 0:
        with open(out, "w") as fh:
            json.dump(rows, fh)
    dist.destroy_process_group()


KERNEL = 512  # the synthetic compute kernel: a KERNEL×KERNEL fp32 matmul (2.6 ms on one idle core here)
LOADED_WARMUP, LOADED_ROUNDS = 3, 40  # rounds; each runs (kernel, all-reduce) once per size
STATISTIC = "after_arrival_s"  # what the fit uses. "call_s" counts the arrival skew too: measured, the
# emulated job then came out 8-47% slow (hidden 768..256), as the skew is mostly the other ranks'
# compute, which the emulated run's contended local compute already holds


def _loaded_worker(rank: int, port: int, out: str) -> None:
    """Alternate the fixed kernel with an all-reduce of S bytes; time each all-reduce call to return.

    The sizes are interleaved: each round runs the kernel and one all-reduce of every size, so a
    slow spell of this shared machine (its gloo latency drifts by 50% within an hour) hits every
    size alike instead of bending the fitted line."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=N)
    gen = torch.Generator().manual_seed(rank)
    a, b = torch.randn(KERNEL, KERNEL, generator=gen), torch.randn(KERNEL, KERNEL, generator=gen)
    bufs = [torch.ones(size // 4) for size in SIZES]
    calls: list[list[tuple[float, float]]] = [[] for _ in SIZES]
    dist.barrier()
    for i in range(LOADED_WARMUP + LOADED_ROUNDS):
        for k, t in enumerate(bufs):
            torch.mm(a, b)
            t0 = time.perf_counter()  # CLOCK_MONOTONIC: one clock for the 4 processes of this machine
            dist.all_reduce(t)
            if i >= LOADED_WARMUP:
                calls[k].append((t0, time.perf_counter()))
    rows = [{"bytes": size, "calls": c} for size, c in zip(SIZES, calls)]
    with open(f"{out}.{rank}", "w") as fh:
        json.dump(rows, fh)
    dist.destroy_process_group()


def measure(loaded: bool = True) -> list[dict]:
    """Time per all-reduce size: loaded (default), the mean over the ranks of each rank's median;
    idle, rank 0's median of batches of back-to-back calls."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        if not loaded:
            mp.spawn(_bench_worker, args=(free_port(), out), nprocs=N, join=True)
            with open(out) as fh:
                return json.load(fh)
        mp.spawn(_loaded_worker, args=(free_port(), out), nprocs=N, join=True)
        per_rank = []
        for r in range(N):
            with open(f"{out}.{r}") as fh:
                per_rank.append(json.load(fh))
    return [_loaded_row(rows) for rows in zip(*per_rank)]


def _loaded_row(rows: tuple[dict, ...]) -> dict:
    """One size, every rank's (call, return) times. ``call_s``: call to return, each rank's median,
    averaged over the ranks (includes the wait for late ranks). ``after_arrival_s``: from the last
    rank's call to each rank's return, averaged over the ranks, median over rounds (the transport
    under load, without the arrival skew). ``span_s``: from the last call to the last return (the
    group's span; reported). ``skew_s``: median over rounds of last − first call."""
    rounds = list(zip(*(r["calls"] for r in rows)))
    after = [statistics.mean(t1 for _, t1 in rd) - max(t0 for t0, _ in rd) for rd in rounds]
    skew = [max(t0 for t0, _ in rd) - min(t0 for t0, _ in rd) for rd in rounds]
    span = [max(t1 for _, t1 in rd) - max(t0 for t0, _ in rd) for rd in rounds]
    call = statistics.mean(statistics.median(t1 - t0 for t0, t1 in r["calls"]) for r in rows)
    out = {"bytes": rows[0]["bytes"], "call_s": call, "after_arrival_s": statistics.median(after),
           "span_s": statistics.median(span), "skew_s": statistics.median(skew)}
    out["time_s"] = out[STATISTIC]
    return out


def ring_time(alpha: float, bandwidth: float, nbytes: float) -> float:
    """A ring all-reduce of ``nbytes`` on n = N ranks: 2(n−1)·α + 2(n−1)/n · S/B."""
    return 2 * (N - 1) * alpha + 2 * (N - 1) / N * nbytes / bandwidth


def fit(rows: list[dict]) -> tuple[float, float]:
    """(α, B) of t = 2(n−1)α + 2(n−1)/n · S/B, least squares on relative error."""
    import numpy as np

    s = np.array([r["bytes"] for r in rows], float)
    t = np.array([r["time_s"] for r in rows], float)
    A = np.stack([np.ones_like(s), s], axis=1) / t[:, None]
    (a, b), *_ = np.linalg.lstsq(A, np.ones_like(t), rcond=None)
    alpha = max(a, 0.0) / (2 * (N - 1))
    bandwidth = 2 * (N - 1) / N / b
    return alpha, bandwidth


def write_scenario(alpha: float, bandwidth: float, rows: list[dict], loaded: bool = True,
                   scenario: str = SCENARIO) -> None:
    """The fit as a custom-graph star: ``scenario`` and its graph ``<stem>.graph.json`` beside it."""
    sys.path.insert(0, ROOT)
    from emulator.outputs.atomic import write_text

    nodes = [{"id": f"cpu{i}", "kind": "gpu"} for i in range(N)] + [{"id": "loopback", "kind": "switch"}]
    links = []
    for i in range(N):
        for src, dst in ((f"cpu{i}", "loopback"), ("loopback", f"cpu{i}")):
            links.append({"src": src, "dst": dst, "bandwidth": bandwidth, "latency": alpha / 2})
    graph = os.path.splitext(scenario)[0] + ".graph.json"
    write_text(graph, json.dumps({"nodes": nodes, "links": links}, indent=1) + "\n")
    table = "\n".join(f"#   {r['bytes']:>9d} B  {r['time_s'] * 1e6:10.1f} us" for r in rows)
    how = (f"under load: each process\n# alternates a {KERNEL}x{KERNEL} fp32 matmul with the all-reduce; {LOADED_ROUNDS} rounds, each over\n"
           "# every size; per size the median of: from the last rank's call to each rank's return, mean over the ranks"
           if loaded else "idle: median time per size of batches of back-to-back calls")
    write_text(scenario, f"""# This machine's gloo loopback transport as an emulated fabric: 4 ranks on a star.
# Written by benchmarks/live_gloo_calibration.py from a measured gloo all-reduce
# (4 processes, TCP loopback, 1 torch thread each; {how}):
{table}
# Fit of a ring all-reduce up to {FIT_MAX >> 20} MiB, t = 2(n-1)*alpha + 2(n-1)/n * S/B with n = 4:
#   alpha = {alpha * 1e6:.2f} us per step (each link alpha/2: a step crosses 2 links),
#   B = {bandwidth / 1e9:.3f} GB/s per link each way. A custom graph: no efficiency factor.
name: live-gloo-loopback
cluster:
  fabric:
    kind: custom
    graph: {os.path.basename(graph)}
collectives:
  algorithm: ring
""")


def calibrate(loaded: bool = True, scenario: str = SCENARIO) -> dict:
    rows = measure(loaded)
    alpha, bandwidth = fit([r for r in rows if r["bytes"] <= FIT_MAX])
    write_scenario(alpha, bandwidth, rows, loaded, scenario)
    for r in rows:
        r["model_s"] = m = ring_time(alpha, bandwidth, r["bytes"])
        r["error"] = m / r["time_s"] - 1
    return {"alpha_s": alpha, "bandwidth_B_per_s": bandwidth, "rows": rows}


# -- 2. fidelity ------------------------------------------------------------------------
def _script_args(hidden: int, iters: int) -> list[str]:
    return [os.path.join(ROOT, "examples", "train_mlp.py"), "--hidden", str(hidden), "--layers", "3",
            "--batch", "64", "--iters", str(iters), "--threads", "1", "--quiet"]


def real_run(hidden: int, iters: int) -> float:
    """Mean iteration time of rank 0 in a real 4-process gloo run."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for r in range(N):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(N), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port))
            out = os.path.join(tmp, f"t{r}.json")
            procs.append(subprocess.Popen([sys.executable, *_script_args(hidden, iters), "--times", out], env=env))
        for p in procs:
            if p.wait() != 0:
                raise RuntimeError("a real gloo rank failed")
        per_rank = []
        for r in range(N):
            with open(os.path.join(tmp, f"t{r}.json")) as fh:
                per_rank.append(json.load(fh)["iteration_times_s"][SKIP:])
    # The job's mean iteration time: each rank's wall time over iterations SKIP.. divided by their
    # number (DDP couples the ranks, so the four agree to within one iteration's jitter); averaged
    # over the ranks. Not the mean of the per-iteration maximum over ranks: that adds the
    # jitter of 4 independent samples to every iteration, which no single rank experiences.
    return statistics.mean(statistics.mean(ts) for ts in per_rank)


def _loaders(hidden: int) -> list[subprocess.Popen]:
    """3 compute-only copies of the script (world 1: gloo does no transfer), to share the cores."""
    procs = []
    for _ in range(N - 1):
        env = dict(os.environ, RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        procs.append(subprocess.Popen([sys.executable, *_script_args(hidden, 10**7)], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    time.sleep(3.0)  # let them import torch and start computing
    return procs


def skew_args(skew: tuple[float, float] | None) -> tuple[str, ...]:
    """``--set`` arguments of the arrival-skew model (a in s, b), or none."""
    if skew is None:
        return ()
    return ("--set", "live.skew=model", "--set", f"live.skew_base={skew[0] * 1e3:.6g} ms",
            "--set", f"live.skew_slope={skew[1]:.6g}")


def emulated_run(hidden: int, iters: int, clock: str, contended: bool, scenario: str = SCENARIO,
                 extra: tuple[str, ...] = ()) -> dict:
    loaders = _loaders(hidden) if contended else []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [sys.executable, "-m", "emulator", "live", scenario, "--world", str(N), "--clock", clock,
                   "--out", tmp, *extra, "--", "python", *_script_args(hidden, iters)]
            subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
            with open(os.path.join(tmp, "summary.json")) as fh:
                summary = json.load(fh)
    finally:
        for p in loaders:
            p.kill()
            p.wait()
    times = summary["live"]["iteration_times_s"][SKIP:]
    return {"iteration_s": statistics.mean(times), "exposed_comm_s": summary["breakdown_s"]["exposed_comm"],
            "comm_s": summary["live"]["comm_s"]}


def fidelity(iters: int, hiddens: list[int], reps: int, virtual: bool = False,
             scenario: str = SCENARIO, skew: tuple[float, float] | None = None) -> list[dict]:
    """Each size ``reps`` times, the runs interleaved (real, emulated, real, ...) so that a slow
    spell of the machine hits both sides; the median of the repetitions and their range.
    ``skew``: also run the emulated side with the arrival-skew model (a in s, b), interleaved."""
    out = []
    modes: list[tuple[str, str, bool, tuple[str, ...]]] = [("contended", "wall", True, ())]
    if virtual:
        modes.append(("virtual", "virtual", True, ()))
    if skew is not None:
        modes.append(("skew", "wall", True, skew_args(skew)))
    for hidden in hiddens:
        runs: dict[str, list[float]] = {"real": [], **{m[0]: [] for m in modes}}
        for _ in range(reps):
            runs["real"].append(real_run(hidden, iters))
            for name, clock, contended, extra in modes:
                runs[name].append(emulated_run(hidden, iters, clock, contended, scenario, extra)["iteration_s"])
        row = {"hidden": hidden, "params": 2 * (hidden * hidden + hidden) + hidden + 1, "runs_s": runs}
        for name, ts in runs.items():
            row[name + "_s"] = statistics.median(ts)
            row[name + "_range_s"] = [min(ts), max(ts)]
        for name, *_ in modes:
            row[name + "_error"] = row[name + "_s"] / row["real_s"] - 1
        out.append(row)
        print(json.dumps(row), flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", nargs="?", default="all", choices=("calibrate", "fidelity", "all"))
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--hidden", type=int, nargs="+", default=[256, 384, 512, 768])
    p.add_argument("--reps", type=int, default=5, help="repetitions of each run (the median is reported)")
    p.add_argument("--virtual", action="store_true", help="also run 1 + 3 with the virtual clock")
    p.add_argument("--idle", action="store_true", help="calibrate idle (back-to-back calls, no compute between)")
    p.add_argument("--skew", nargs=2, type=float, metavar=("A_MS", "B"),
                   help="also run 1 + 3 with live.skew: model, skew_base A_MS ms, skew_slope B (interleaved)")
    p.add_argument("--scenario", default=SCENARIO, help="the calibrated scenario: written by calibrate, "
                   "read by fidelity (default: %(default)s)")
    args = p.parse_args()
    if args.what == "fidelity" and not os.path.isfile(args.scenario):
        p.error(f"--scenario {args.scenario}: no such file; write it first with `calibrate` (or run `all`)")
    if args.what in ("calibrate", "all"):
        cal = calibrate(loaded=not args.idle, scenario=args.scenario)
        print(f"alpha = {cal['alpha_s'] * 1e6:.2f} us/step, B = {cal['bandwidth_B_per_s'] / 1e9:.3f} GB/s")
        for r in cal["rows"]:
            print(f"  {r['bytes']:>9d} B  measured {r['time_s'] * 1e6:10.1f} us  model {r['model_s'] * 1e6:10.1f} us"
                  f"  ({r['error'] * 100:+.1f}%)"
                  + (f"  [call {r['call_s'] * 1e6:.1f} us, span {r['span_s'] * 1e6:.1f} us, skew {r['skew_s'] * 1e6:.1f} us]"
                     if "call_s" in r else ""))
    if args.what in ("fidelity", "all"):
        skew = (args.skew[0] * 1e-3, args.skew[1]) if args.skew else None
        rows = fidelity(args.iters, args.hidden, args.reps, args.virtual, args.scenario, skew)
        print(f"{'hidden':>6} {'grad MB':>8} {'real ms (median, range)':>26} {'1+3 contended ms':>26} {'err':>7}")
        for r in rows:
            rr, cr = r["real_range_s"], r["contended_range_s"]
            print(f"{r['hidden']:>6} {r['params'] * 4 / 1e6:8.2f} {r['real_s'] * 1e3:8.2f} ({rr[0] * 1e3:6.2f}-{rr[1] * 1e3:6.2f})"
                  f"   {r['contended_s'] * 1e3:8.2f} ({cr[0] * 1e3:6.2f}-{cr[1] * 1e3:6.2f}) {r['contended_error'] * 100:+6.1f}%"
                  + (f"  virtual {r['virtual_s'] * 1e3:.2f} ({r['virtual_error'] * 100:+.1f}%)" if "virtual_s" in r else "")
                  + (f"  skew model {r['skew_s'] * 1e3:.2f} ({r['skew_range_s'][0] * 1e3:.2f}-{r['skew_range_s'][1] * 1e3:.2f})"
                     f" {r['skew_error'] * 100:+.1f}%" if "skew_s" in r else ""))


if __name__ == "__main__":
    main()
