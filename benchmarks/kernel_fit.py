"""The kernel model against the H200's per-shape measurements: lookup and leave-one-out.

    python benchmarks/kernel_fit.py [--h200 ../shared/calibration/h200] [--out benchmarks/results/kernel_fit.json]

Prints one line per measurement (measured, lookup and leave-one-out predictions and their errors)
and the median absolute errors per group (emulator/tools/kernel_fit.py says how each is predicted),
and writes them as JSON. Runs in a few seconds on a CPU; tests/test_kernel_model.py asserts the same.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from emulator.outputs.atomic import write_text  # noqa: E402
from emulator.scenario import catalog  # noqa: E402
from emulator.tools.kernel_fit import check  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--h200", default=os.path.join(ROOT, "..", "shared", "calibration", "h200"))
    ap.add_argument("--out", default=os.path.join(HERE, "results", "kernel_fit.json"))
    args = ap.parse_args(argv)
    result = check(args.h200, catalog.gpu("H200-SXM"))
    print(f"{'case':<34} {'measured us':>12} {'lookup':>9} {'leave-one-out':>14}  source")
    for r in result["rows"]:
        note = "  (dispatch-bound: not in the table)" if r["dispatch_bound"] else ""
        print(f"{r['case']:<34} {r['measured_s'] * 1e6:>12.1f} {r['lookup_error']:>+9.1%} {r['loo_error']:>+14.1%}"
              f"  {r['loo_source']}{note}")
    print(f"\n{'group':<20} {'n':>4} {'lookup median |err|':>20} {'leave-one-out':>14}")
    for name, s in result["summary"].items():
        print(f"{name:<20} {s['n']:>4} {s['lookup_median_abs_error']:>20.2%} {s['loo_median_abs_error']:>14.2%}")
    write_text(args.out, json.dumps(result, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
