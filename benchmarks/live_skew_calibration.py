"""Measure the ranks' arrival skew at a collective, per compute length, and fit the skew model.

4 real processes (gloo over TCP loopback, 1 torch thread each) alternate a synthetic kernel
with a small all-reduce (1 KiB). The kernel is REPS back-to-back 256×256 fp32 matmuls, REPS
chosen per nominal length L (0.5 .. 20 ms on one idle core, timed before the run). The
lengths are interleaved: each round runs every L once, so a slow spell of this shared machine
hits every length alike. Every rank stamps, on the machine's one monotonic clock
(``time.perf_counter``), the kernel's start, its arrival at the all-reduce and the return.

Per L, over the timed rounds:
- ``compute_s``: the median kernel time as a rank measures it (start → arrival), under the
  load of the other 3 ranks: what a live run's local rank measures as its compute;
- ``mirror_sd_s``: the standard deviation of (a rank's arrival − rank 0's arrival), ranks 1..3;
- ``late_s[m]``: the mean, over rounds, ranks r and the groups S of m ranks that contain r, of
  max_{j∈S} arrival_j − arrival_r: how late a collective of m ranks starts after rank r arrives.
  m = 2, 3, 4 from the same rounds;
- ``emulated_compute_s``: the mean kernel time as a live run measures it: one process timing the
  kernels beside 3 compute-only copies (no communication), as in the fidelity checks' 1 + 3 runs;
- ``to_start_s`` (a real rank's kernel start → the last arrival) and ``net_lag_s`` (that minus
  ``emulated_compute_s``): reported, to compare the two sides.

The model (``emulator.live.skew``): arrivals spread independently around their mean with a
standard deviation σ(c) = a + b·c, c the compute since the last synchronisation; a collective
of n ranks then starts E[max of n] − E[one] = e_n·σ(c) after a rank arrives, e_n the expected
maximum of n standard normals (e_2 = 0.564, e_3 = 0.846, e_4 = 1.029). a and b are fitted by
least squares to late_s[m] = e_m·(a + b·emulated_compute_s) over every L and m (c is what the
model is given in a live run); the residuals are printed, and the fit on the real ranks' own
compute for reference.

Usage: .venv/bin/python benchmarks/live_skew_calibration.py [--rounds R] [--lengths-ms L ...] [--json PATH]
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import live_gloo_calibration as cal  # noqa: E402

N = 4
MATMUL = 256  # the kernel's unit: one MATMUL×MATMUL fp32 matmul (about 0.3 ms on one idle core here)
LENGTHS_MS = [0.5, 1.0, 2.0, 5.0, 10.0, 20.0]
WARMUP = 3
ALLREDUCE_BYTES = 1024


def unit_time(repeats: int = 200) -> float:
    """Seconds of one MATMUL×MATMUL matmul on one thread (the median of ``repeats``), idle."""
    import torch

    torch.set_num_threads(1)
    a, b = torch.randn(MATMUL, MATMUL), torch.randn(MATMUL, MATMUL)
    for _ in range(20):
        torch.mm(a, b)
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _worker(rank: int, port: int, reps: list[int], rounds: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=N)
    gen = torch.Generator().manual_seed(rank)
    a, b = torch.randn(MATMUL, MATMUL, generator=gen), torch.randn(MATMUL, MATMUL, generator=gen)
    buf = torch.ones(ALLREDUCE_BYTES // 4)
    stamps: list[list[tuple[float, float, float]]] = [[] for _ in reps]
    dist.barrier()
    for i in range(WARMUP + rounds):
        for k, n in enumerate(reps):
            t0 = time.perf_counter()  # CLOCK_MONOTONIC: one clock for the 4 processes of this machine
            for _ in range(n):
                torch.mm(a, b)
            t1 = time.perf_counter()
            dist.all_reduce(buf)
            t2 = time.perf_counter()
            if i >= WARMUP:
                stamps[k].append((t0, t1, t2))
    with open(f"{out}.{rank}", "w") as fh:
        json.dump(stamps, fh)
    dist.destroy_process_group()


def _contended_worker(rank: int, reps: list[int], rounds: int, out: str) -> None:
    """Rank 0 times the kernels, as a live run's local rank measures its compute beside 3
    compute-only copies (ranks 1..3: the kernels in a loop, no communication, until rank 0 is done)."""
    import torch

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(rank)
    a, b = torch.randn(MATMUL, MATMUL, generator=gen), torch.randn(MATMUL, MATMUL, generator=gen)
    done = out + ".done"
    if rank:
        while not os.path.exists(done):
            for _ in range(10):
                torch.mm(a, b)
        return
    times: list[list[float]] = [[] for _ in reps]
    for i in range(WARMUP + rounds):
        for k, n in enumerate(reps):
            t0 = time.perf_counter()
            for _ in range(n):
                torch.mm(a, b)
            if i >= WARMUP:
                times[k].append(time.perf_counter() - t0)
    with open(out, "w") as fh:
        json.dump(times, fh)
    with open(done, "w") as fh:
        fh.write("done")


def measure(lengths_ms: list[float], rounds: int) -> tuple[float, list[dict]]:
    """(the kernel unit's idle time, one row per length)."""
    import torch.multiprocessing as mp

    unit = unit_time()
    reps = [max(1, round(L * 1e-3 / unit)) for L in lengths_ms]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "stamps")
        mp.spawn(_worker, args=(cal.free_port(), reps, rounds, out), nprocs=N, join=True)
        per_rank = []
        for r in range(N):
            with open(f"{out}.{r}") as fh:
                per_rank.append(json.load(fh))
        alone = os.path.join(tmp, "contended")
        mp.spawn(_contended_worker, args=(reps, rounds, alone), nprocs=N, join=True)
        with open(alone) as fh:
            contended = json.load(fh)
    rows = []
    for k, (L, n) in enumerate(zip(lengths_ms, reps)):
        row = _row(L, n * unit, [per_rank[r][k] for r in range(N)])
        row["emulated_compute_s"] = statistics.mean(contended[k])
        row["net_lag_s"] = row["to_start_s"] - row["emulated_compute_s"]
        rows.append(row)
    return unit, rows


def _row(nominal_ms: float, idle_s: float, stamps: list[list[list[float]]]) -> dict:
    """One length: every rank's (kernel start, arrival, return) per round."""
    rounds = list(zip(*stamps))  # per round: one (t0, t1, t2) per rank
    compute = statistics.median(t1 - t0 for rd in rounds for t0, t1, _ in rd)
    mirror = [rd[r][1] - rd[0][1] for rd in rounds for r in range(1, N)]
    late: dict[int, float] = {}
    for m in range(2, N + 1):
        vals = []
        for rd in rounds:
            arr = [t1 for _, t1, _ in rd]
            for r in range(N):
                for group in itertools.combinations(range(N), m):
                    if r in group:
                        vals.append(max(arr[j] for j in group) - arr[r])
        late[m] = statistics.mean(vals)
    spread = [max(t1 for _, t1, _ in rd) - min(t1 for _, t1, _ in rd) for rd in rounds]
    to_start = [max(t1 for _, t1, _ in rd) - t0 for rd in rounds for t0, _, _ in rd]
    return {"nominal_ms": nominal_ms, "idle_s": idle_s, "compute_s": compute,
            "mirror_sd_s": statistics.pstdev(mirror), "late_s": {str(m): v for m, v in late.items()},
            "first_to_last_s": statistics.median(spread), "rounds": len(rounds),
            "compute_mean_s": statistics.mean(t1 - t0 for rd in rounds for t0, t1, _ in rd),
            "to_start_s": statistics.mean(to_start)}


def fit(rows: list[dict], x: str = "emulated_compute_s") -> tuple[float, float]:
    """(a, b) of late_m = e_m·(a + b·c), least squares over every row and group size m; c is
    ``x`` of each row: by default the compute as a live run measures it (beside 3 compute-only
    copies), the input the model gets in a live run."""
    import numpy as np

    from emulator.live.skew import expected_max

    A, y = [], []
    for r in rows:
        for m, v in r["late_s"].items():
            e = expected_max(int(m))
            A.append([e, e * r[x]])
            y.append(v)
    (a, b), *_ = np.linalg.lstsq(np.array(A), np.array(y), rcond=None)
    return float(a), float(b)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=150)
    p.add_argument("--lengths-ms", type=float, nargs="+", default=LENGTHS_MS)
    p.add_argument("--json", help="also write the rows and the fit here")
    args = p.parse_args()
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"uptime before: {load}", flush=True)
    unit, rows = measure(args.lengths_ms, args.rounds)
    a, b = fit(rows)
    a_real, b_real = fit(rows, "compute_s")
    from emulator.live.skew import expected_max

    print(f"uptime after: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    print(f"kernel unit: {MATMUL}x{MATMUL} fp32 matmul, {unit * 1e3:.3f} ms idle; {args.rounds} rounds")
    print(f"fit on the compute a live run measures (c emu): sigma(c) = a + b*c, a = {a * 1e3:.3f} ms, b = {b:.4f}")
    print(f"(for reference, fit on the real ranks' own compute (c): a = {a_real * 1e3:.3f} ms, b = {b_real:.4f})")
    print(f"{'L ms':>5} {'c ms':>7} {'mirror sd':>9} {'1st-last':>8}  " + "  ".join(
        f"{'late' + str(m):>7} {'model':>6} {'resid':>6}" for m in range(2, N + 1))
        + f" {'c mean':>7} {'to start':>8} {'c emu':>7} {'net lag':>7}")
    for r in rows:
        cells = []
        for m in range(2, N + 1):
            v = r["late_s"][str(m)]
            mod = expected_max(m) * (a + b * r["emulated_compute_s"])
            cells.append(f"{v * 1e3:7.3f} {mod * 1e3:6.3f} {(mod - v) * 1e3:+6.3f}")
        print(f"{r['nominal_ms']:5.1f} {r['compute_s'] * 1e3:7.3f} {r['mirror_sd_s'] * 1e3:9.3f} "
              f"{r['first_to_last_s'] * 1e3:8.3f}  " + "  ".join(cells)
              + f" {r['compute_mean_s'] * 1e3:7.3f} {r['to_start_s'] * 1e3:8.3f} {r['emulated_compute_s'] * 1e3:7.3f}"
              f" {r['net_lag_s'] * 1e3:+7.3f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"uptime": load, "unit_s": unit, "a_s": a, "b": b, "a_real_s": a_real, "b_real": b_real,
                       "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
