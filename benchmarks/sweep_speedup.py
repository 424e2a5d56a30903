"""Parallel speed-up of `emulator sweep`: --jobs 2 against --jobs 1 on a 50-point sweep.

    .venv/bin/python benchmarks/sweep_speedup.py

Each point is a small GPT model layout (tens of milliseconds); both runs start from an
empty database, through the CLI in a fresh process (so process-pool start-up counts).
Prints the two wall times and their ratio.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCENARIO = """name: speedup
cluster: {nodes: 2, node: dgx-a100}
model: {preset: gpt3-350m}
training: {global_batch: 64, micro_batch: 1}
parallel: {tp: 2, pp: 2}
"""


def run(jobs: int, folder: str) -> float:
    path = os.path.join(folder, "s.yaml")
    with open(path, "w") as fh:
        fh.write(SCENARIO)
    db = os.path.join(folder, f"jobs{jobs}.sqlite")
    cmd = [sys.executable, "-m", "emulator", "sweep", path, "--db", db, "--jobs", str(jobs),
           "--vary", "cluster.node.nic_bandwidth=" + ",".join(f"{50 + 10 * i} Gb/s" for i in range(25)),
           "--vary", "cluster.node.nic_latency=1 us,2 us"]  # a single_switch reads no fabric.latency
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        t1 = run(1, folder)
        t2 = run(2, folder)
    print(f"50 points: --jobs 1 {t1:.2f} s, --jobs 2 {t2:.2f} s, speed-up {t1 / t2:.2f}x on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
