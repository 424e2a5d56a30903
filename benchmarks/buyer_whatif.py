"""The buyer's what-if (docs/guides/blackwell-racks.md): one job, the same GPU count, six machines.

    python benchmarks/buyer_whatif.py [--csv buyer.csv] [--png docs/guides/img/buyer-whatif.png]

Reads the CSV of

    emulator sweep scenarios/buyer-qwen3-30b-144gpu.yaml --zip \\
      --vary cluster.node=dgx-h100,dgx-h200,dgx-b200,dgx-b300,gb200-nvl72,gb300-nvl72 \\
      --vary cluster.nodes=18,18,18,18,36,36 --csv buyer.csv

and prints the guide's table (tokens/s per GPU, the speed-up over the H100, and where the time
went: compute, exposed communication, idle time waiting for peers) and draws it as a bar chart.
"""
from __future__ import annotations

import argparse
import csv


def rows(path: str) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as fh:
        out = [r for r in csv.DictReader(fh) if r["status"] == "ok"]
    for r in out:
        r["per_gpu"] = float(r["tokens_per_s"]) / int(r["gpus"])
    return out


def table(data: list[dict]) -> str:
    base = next(r["per_gpu"] for r in data if r["cluster.node"] == "dgx-h100")
    lines = ["| machine | nodes | tokens/s per GPU | vs H100 | compute s | exposed comm s | waiting s |",
             "|---|---|---|---|---|---|---|"]
    for r in data:
        lines.append(f"| {r['cluster.node']} | {r['cluster.nodes']} | {r['per_gpu']:,.0f} | "
                     f"{r['per_gpu'] / base:.2f}x | {float(r['breakdown_s.compute']):.3f} | "
                     f"{float(r['breakdown_s.exposed_comm']):.3f} | {float(r['breakdown_s.other']):.3f} |")
    return "\n".join(lines)


def plot(data: list[dict], png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = next(r["per_gpu"] for r in data if r["cluster.node"] == "dgx-h100")
    names = [r["cluster.node"] for r in data]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    bars = ax.bar(names, [r["per_gpu"] for r in data], color="#4a7ab5")
    for b, r in zip(bars, data):
        ax.annotate(f"{r['per_gpu'] / base:.2f}x", (b.get_x() + b.get_width() / 2, b.get_height()),
                    ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("tokens/s per GPU")
    ax.set_title("Qwen3-30B-A3B on 144 GPUs (EP 16, DP 144): the same job on six machines", fontsize=9)
    ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120, metadata={"Software": None})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", default="buyer.csv")
    ap.add_argument("--png", default="docs/guides/img/buyer-whatif.png")
    args = ap.parse_args()
    data = rows(args.csv)
    print(table(data))
    plot(data, args.png)


if __name__ == "__main__":
    main()
