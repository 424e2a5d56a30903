"""Your own model, checked on the H200 profile this repository carries (no GPU needed).

    python benchmarks/profile_check.py

Runs ``emulator run --json`` on the profiled configuration of traces/h200-hf-gpt-1.3b/ (predicted
from its own profile), on its replay (``workload.trace``), and at ``dp: 8`` on one DGX H200, and
compares each with the step time measured on the H200 without the profiler
(traces/h200-hf-gpt-1.3b/README.md: medians of two runs, 260.5 and 262.2 ms; the lower is used).
Writes benchmarks/results/profile_check.json (rendered into docs/guides/own-model.md).
Real GPU checks at other sizes, batches and families: benchmarks/gpu_profile_check.py.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TRACE = os.path.join(ROOT, "traces", "h200-hf-gpt-1.3b", "trace.json.gz")
MEASURED_S = (0.2605, 0.2622)  # traces/h200-hf-gpt-1.3b/README.md, "Measured step time, without the profiler"
PROFILED = "{micro_batch: 4, seq_len: 2048, layers: 24, hidden: 2048, heads: 16, vocab: 50257}"
ONE_GPU = "{preset: dgx-h200, gpus_per_node: 1}"

CASES = (
    ("profiled configuration, 1 H200", ONE_GPU, f"workload:\n  profile: {TRACE}\n  profiled: {PROFILED}\n"),
    ("replay of the trace, 1 H200", ONE_GPU, f"workload: {{trace: {TRACE}, format: kineto}}\n"),
    ("dp 8 (DDP), one DGX H200", "dgx-h200",
     f"workload:\n  profile: {TRACE}\n  profiled: {PROFILED}\nparallel: {{dp: 8}}\n"),
)


def run(name: str, node: str, body: str, folder: str) -> dict:
    path = os.path.join(folder, "s.yaml")
    with open(path, "w") as fh:
        fh.write(f"name: {name!r}\ncluster: {{nodes: 1, node: {node}}}\n{body}")
    out = subprocess.run([sys.executable, "-m", "emulator", "run", path, "--json"], capture_output=True,
                         text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout)


def main() -> None:
    sys.path.insert(0, ROOT)
    from emulator.outputs.atomic import write_text

    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name, node, body in CASES:
            s = run(name, node, body, folder)
            busiest = s["links"]["busiest"]
            measured = MEASURED_S[0] if node == ONE_GPU else None  # dp 8 was not run on a GPU
            rows.append({"case": name, "measured_s": measured, "predicted_s": s["iteration_time_s"],
                         "error": s["iteration_time_s"] / measured - 1 if measured else None,
                         "measured_share": (s.get("compute_source") or {}).get("measured"),
                         "link_bytes": busiest[0]["bytes"] if busiest else 0.0})
    doc: dict = {"rows": rows, "measured_runs_s": list(MEASURED_S)}
    try:
        from benchmarks.results_file import stamp  # the docs site's provenance stamp, where it exists
        doc.update(stamp(__file__))
    except ImportError:
        pass
    write_text(os.path.join(HERE, "results", "profile_check.json"), json.dumps(doc, indent=2, sort_keys=True) + "\n")
    for r in rows:
        vs = f"measured {r['measured_s'] * 1e3:.1f} ms  {r['error']:+.1%}" if r["measured_s"] else "not measured"
        print(f"{r['case']:34s} predicted {r['predicted_s'] * 1e3:7.1f} ms  {vs}  link bytes {r['link_bytes']:.3g}")


if __name__ == "__main__":
    main()
