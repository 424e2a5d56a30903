"""nccl-tests figures against `emulator collective`: ../shared/calibration/nccl.csv's rows, each run on the
matching preset, into benchmarks/results/nccl.json (rendered on the docs site's Validation page).

    python benchmarks/nccl_accuracy.py            # a few seconds

The catalog's NVLink and NIC efficiencies and its per-step latencies were fitted to these same rows
(emulator/data/catalog.yaml cites them), so this is a check that the flow model reproduces its own
calibration at the sizes measured, not an independent validation. The rows of one NIC's send/recv
bandwidth are not collectives and are not run here.
"""
from __future__ import annotations

import csv
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, HERE]

import results_file  # noqa: E402

CSV = os.path.join(ROOT, "..", "shared", "calibration", "nccl.csv")
NODE = "scenarios/dgx-a100-node.yaml"  # one DGX A100; other presets by --set
# (system, gpus, quantity) of a nccl.csv row → (--set overrides, GPUs of the collective, size, what to compare)
ROWS: dict[tuple[str, str, str], tuple[tuple[str, ...], int | None, str, str]] = {
    ("DGX A100 (8 GPU NVSwitch)", "8", "busbw_large_messages"): ((), None, "8GiB", "busbw_GB_per_s"),
    ("DGX A100 multi-node (8x HDR 200 Gb/s per node)", "multi-node", "busbw_large_messages"):
        (("cluster.nodes=2",), None, "8GiB", "busbw_GB_per_s"),
    ("H100 SXM (8 GPU NVSwitch)", "8", "busbw_large_messages_ring"):
        (("cluster.node=dgx-h100",), None, "8GiB", "busbw_GB_per_s"),
    ("H100 SXM (8 GPU NVSwitch)", "8", "busbw_large_messages_nvls"):
        (("cluster.node=dgx-h100", "collectives.algorithm=nvls"), None, "8GiB", "busbw_GB_per_s"),
    ("DGX A100", "2", "latency_small_messages"): ((), 2, "8B", "time_us"),
    ("DGX A100", "8", "latency_small_messages"): ((), None, "8B", "time_us"),
}


def emulate(sets: tuple[str, ...], gpus: int | None, size: str, what: str) -> float:
    from emulator.scenario.reader import load_scenario
    from emulator.tools.collective_bench import collective_table, size_range

    row = collective_table(load_scenario(os.path.join(ROOT, NODE), list(sets)), "all_reduce", size_range(size),
                           gpus)[0]
    return row["time_s"] * 1e6 if what == "time_us" else row[what]


def main() -> int:
    rows = []
    with open(CSV, encoding="utf-8") as fh:
        for line, r in enumerate(csv.DictReader(fh), start=2):
            key = (r["system"], r["gpus"], r["quantity"])
            if key not in ROWS:
                continue
            sets, gpus, size, what = ROWS[key]
            predicted = emulate(sets, gpus, size, what)
            measured = float(r["value"])
            rows.append({"row": f"nccl.csv line {line}", "system": r["system"], "operation": r["operation"],
                         "gpus": r["gpus"], "quantity": r["quantity"], "unit": r["unit"], "source": r["source"],
                         "size": size, "command": " ".join(["emulator collective", NODE, "--sizes", size]
                                                           + [f"--set {s}" for s in sets]
                                                           + ([f"--gpus {gpus}"] if gpus else [])),
                         "measured": measured, "predicted": predicted, "error": predicted / measured - 1})
    doc = dict(results_file.stamp(__file__), rows=rows)
    print(results_file.write("nccl", doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
