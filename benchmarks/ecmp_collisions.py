"""What ECMP hash collisions cost a 1024-GPU all-reduce, against spraying, over 20 seeds.

    PYTHONPATH=. .venv/bin/python benchmarks/ecmp_collisions.py [--seeds 20] [--size 1GiB] [--json]

The cluster: 128 DGX H100 nodes (1024 GPUs, 8 NICs of 400 Gb/s each), 16 nodes per leaf,
every leaf–spine link 400 Gb/s. Two fabrics: 128 spines (one uplink per NIC, non-blocking)
and 32 spines (4:1 oversubscribed). For each, one all-reduce of ``--size`` over all 1024
GPUs (as `emulator collective`) with ``routing: spray`` (every flow split evenly over the
spines) and with ``routing: ecmp_hash`` for seeds 0..N−1 (every flow on the one spine its
hash picks). Writes plots/ecmp-collisions.png (and .svg), prints the table and keeps the
figures in benchmarks/results/ecmp.json (rendered in the Fabrics guide). Takes about 30 s on 2 cores.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from emulator.scenario import load_scenario_text  # noqa: E402
from emulator.scenario.units import parse_bytes  # noqa: E402
from emulator.tools.collective_bench import collective_table  # noqa: E402

SCENARIO = """name: ecmp-{spines}-spines
cluster:
  nodes: 128
  node: dgx-h100
  fabric: {{kind: fat_tree, leaf_size: 16, spines: {spines}, link_bandwidth: 400 Gb/s, {routing}}}
"""
FABRICS = {"128 spines (1:1)": 128, "32 spines (4:1)": 32}


def all_reduce_time(spines: int, routing: str, size: float) -> float:
    sc = load_scenario_text(SCENARIO.format(spines=spines, routing=routing), f"ecmp-{spines}.yaml")
    return float(collective_table(sc, "all_reduce", [size])[0]["time_s"])


def measure(seeds: int, size: float) -> dict[str, dict]:
    out = {}
    for label, spines in FABRICS.items():
        spray = all_reduce_time(spines, "routing: spray", size)
        hashed = [all_reduce_time(spines, f"routing: ecmp_hash, seed: {s}", size) for s in range(seeds)]
        out[label] = {"spray_s": spray, "ecmp_hash_s": hashed,
                      "slowdown": [t / spray for t in hashed],
                      "mean_slowdown": statistics.fmean(t / spray for t in hashed)}
    return out


def plot(data: dict[str, dict], size: float, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from emulator.outputs.figures import save_figure

    fig, ax = plt.subplots(figsize=(9, 4.2))
    width = 0.4
    for i, (label, d) in enumerate(data.items()):
        xs = [s + (i - 0.5) * width for s in range(len(d["slowdown"]))]
        ax.bar(xs, d["slowdown"], width=width, label=f"{label}: mean ×{d['mean_slowdown']:.3f}")
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--", label="spray (even split): ×1")
    ax.set_xlabel("ECMP hash seed")
    ax.set_ylabel("all-reduce time / spray")
    ax.set_xticks(range(len(next(iter(data.values()))["slowdown"])))
    ax.set_title(f"ECMP collisions: {size / 2**30:g} GiB all-reduce on 1024 H100 (128 nodes, 16 per leaf)")
    ax.legend(loc="upper right", fontsize=8)
    ax.set_ylim(0, max(max(d["slowdown"]) for d in data.values()) * 1.25)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--size", default="1GiB")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "plots", "ecmp-collisions.png"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    size = parse_bytes(args.size)
    data = measure(args.seeds, size)
    plot(data, size, args.out)
    sys.path.insert(0, HERE)
    import results_file

    results_file.write("ecmp", dict(results_file.stamp(__file__), size_bytes=size, seeds=args.seeds, fabrics=data))
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        for label, d in data.items():
            print(f"{label}: spray {d['spray_s'] * 1e3:.3f} ms; ecmp_hash slowdown per seed "
                  + " ".join(f"{x:.3f}" for x in d["slowdown"]) + f"; mean {d['mean_slowdown']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
