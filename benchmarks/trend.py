"""How wall time grows with GPU count and with micro-batches (issue 4's "trend").

    python benchmarks/trend.py [--unfolded]

GPT-3 175B (TP 8, PP 8, interleaved v=4) on A100 fat-trees: DP 16 → 64 → 256
(1k → 4k → 16k GPUs) at 96 micro-batches per pipeline, then 1k GPUs at 24 → 192
micro-batches; with --unfolded, also every rank simulated at 256 → 1024 GPUs.
Each row: GPUs, micro-batches, simulated ranks, ops simulated, events, wall s.
"""
from __future__ import annotations

import argparse
import sys
import time

from emulator.run.simulation import simulate
from emulator.scenario import load_scenario

SCENARIO = "scenarios/gpt3-175b-1024-a100.yaml"


def row(dp: int, m: int, fold: str = "auto") -> str:
    sets = [f"parallel.dp={dp}", f"cluster.nodes={dp * 8}", f"training.global_batch={m * dp}",
            f"simulation.fold={fold}"]
    sc = load_scenario(SCENARIO, sets)
    t0 = time.perf_counter()
    r = simulate(sc, record_links=False)
    wall = time.perf_counter() - t0
    return (f"{dp * 64:>7} {m:>6} {fold:>5} {r.ranks_simulated:>7} {len(r.spans):>11,} {r.events:>11,} "
            f"{wall:>8.2f} {r.iteration_time_s:>10.4f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--unfolded", action="store_true")
    args = ap.parse_args()
    print(f"{'GPUs':>7} {'m':>6} {'fold':>5} {'ranks':>7} {'ops':>11} {'events':>11} {'wall s':>8} {'iter s':>10}")
    cases = [(16, 96), (64, 96), (256, 96), (16, 24), (16, 48), (16, 192)]
    for dp, m in cases:
        print(row(dp, m), flush=True)
    if args.unfolded:
        for dp in (4, 8, 16):
            print(row(dp, 96, "off"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
