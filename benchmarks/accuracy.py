"""Accuracy against measurements: the cases files through ``emulator validate``'s own code, into
benchmarks/results/accuracy.json (rendered on the docs site's Validation page and in the README).

    python benchmarks/accuracy.py [--suite layers-and-replays|published]

Suites (each a cases CSV in the format of ``emulator validate``; the measured figures and their
sources are in the CSV, the predictions come from this run):
- ``layers-and-replays``: examples/validate/cases.csv, the GPT-22B layer timings of
  ../shared/calibration/layers.csv (what the compute model was fitted to) and the shared Kineto
  replays (DLRM on 8 V100, ResNet-50 on A100), about a minute;
- ``published``: benchmarks/published/cases.csv, published end-to-end runs (not fitted), a few seconds.
A run of some suites keeps the other suites' last results in the file.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, HERE]

import results_file  # noqa: E402

SUITES = {
    "layers-and-replays": "examples/validate/cases.csv",
    "published": "benchmarks/published/cases.csv",
}


def run_suite(cases_file: str) -> dict:
    """Every case of one cases file, predicted; with the mean absolute percentage error per group."""
    from emulator.tools.validate import mape, predict, read_cases, simulate_case

    t0 = time.perf_counter()
    outcomes = predict(read_cases(os.path.join(ROOT, cases_file)), simulate_case)
    groups: dict[str, list] = {}
    for o in outcomes:
        groups.setdefault(o.case.group, []).append(o)
    per_group = mape(outcomes)
    return {"cases_file": cases_file, "wall_s": time.perf_counter() - t0,
            "groups": [{"group": g, "mape": per_group[g],
                        "cases": [{"case": o.case.case, "metric": o.case.metric, "set": list(o.case.overrides),
                                   "scenario": os.path.relpath(o.case.scenario, ROOT), "measured": o.case.measured,
                                   "predicted": o.predicted, "error": o.error, "source": o.case.source}
                                  for o in rows]}
                       for g, rows in groups.items()]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", action="append", choices=list(SUITES), help="run only these (default: all)")
    args = ap.parse_args(argv)
    doc = results_file.read("accuracy") or {"suites": {}}
    for name in args.suite or list(SUITES):
        doc["suites"][name] = dict(run_suite(SUITES[name]), **results_file.stamp(__file__))
        sys.stderr.write(f"done {name}\n")
    print(results_file.write("accuracy", doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
