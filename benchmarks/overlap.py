"""The compute slowdown under communication (``comm_overlap_slowdown``) measured on the real traces
vendored in traces/, into benchmarks/results/overlap.json (rendered in the Traces and calibration guide).

    python benchmarks/overlap.py            # a few seconds

Each row is ``emulator.importers.kineto_overlap.measure_files`` on one set of Kineto traces in
traces/ (made from the team's ../shared/traces/kineto/, see their READMEs): the ResNet-50 DDP rank
(A100, 3 steps, its GPU side: resnet-ddp-a100-all-steps), the DLRM step's 8 ranks pooled (V100) and
each DLRM rank alone.
"""
from __future__ import annotations

import glob
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, HERE]

import results_file  # noqa: E402

TRACES = os.path.join(ROOT, "traces")


def sets() -> list[tuple[str, list[str]]]:
    dlrm = sorted(glob.glob(os.path.join(TRACES, "dlrm-8rank-v100", "*.json.gz")))
    return ([("ResNet-50 DDP, rank 0, A100, 3 steps (resnet-ddp-a100)",
              [os.path.join(TRACES, "resnet-ddp-a100-all-steps", "rank0-gpu.json.gz")]),
             ("DLRM, 8 ranks pooled, V100, 1 step (dlrm-8rank-v100)", dlrm)]
            + [(f"DLRM, rank {i} alone (dlrm-8rank-v100)", [p]) for i, p in enumerate(dlrm)])


def main() -> int:
    from emulator.importers.kineto_overlap import measure_files

    rows = []
    for label, paths in sets():
        fit = measure_files(paths)
        rows.append({"trace": label, "files": [os.path.relpath(p, ROOT) for p in paths], "groups": len(fit.groups),
                     "kernels": fit.kernels, "compute_kernels": fit.compute, "under_comm": fit.under,
                     "alone": fit.alone, "factor": fit.factor if fit.enough else None, "q1": fit.q1, "q3": fit.q3,
                     "why_not": fit.why_not()})
    print(results_file.write("overlap", dict(results_file.stamp(__file__), rows=rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
