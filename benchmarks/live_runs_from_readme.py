"""One-off converter: the live-emulation run logs of the README before issue 31 (commit 916388b) into
benchmarks/results/live_runs.json, which the docs site's Validation page renders.

    python benchmarks/live_runs_from_readme.py [--rev 916388b]

Those runs (benchmarks/live_real_check.py, live_pipeline_check.py, live_gloo_calibration.py and
live_skew_calibration.py, on the 2-core development machine of 2026-12-02..04, at the loads the text
states) cannot be repeated here, so their tables and the notes between them are carried over as they
were written, parsed from the README at that commit, not typed again. New runs of those scripts add
their own results files.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, HERE]

import results_file  # noqa: E402

# (title, the first line's start, the start of the line after the last): the evidence parts of the
# README's "Live emulation" section; what comes between them is the guide (docs/guides/live.md)
PARTS = [
    ("Arrival skew: calibration and checks", "*Measured* (`benchmarks/live_skew_calibration.py`", "**GPUs.**"),
    ("Checks with real ranks", "Every run so far, misses included", "**Fidelity on this machine**"),
    ("Fidelity on this machine: 1 real + 3 emulated ranks against 4 real gloo processes",
     "| hidden (gradient bytes)", "`tests/test_live_fidelity.py`"),
]


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def blocks(lines: list[str]) -> list[dict]:
    """Paragraphs as text blocks (code blocks kept whole), markdown tables as header + rows."""
    out: list[dict] = []
    text: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("|") and i + 1 < len(lines) and set(lines[i + 1].replace("|", "").strip()) <= set("-: "):
            if text:
                out.append({"text": "\n".join(text).strip("\n")})
                text = []
            header = cells(line)
            i += 2
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(cells(lines[i]))
                i += 1
            out.append({"table": {"header": header, "rows": rows}})
            continue
        text.append(line)
        i += 1
    if "".join(text).strip():
        out.append({"text": "\n".join(text).strip("\n")})
    return out


def part(lines: list[str], start: str, end: str) -> list[str]:
    a = next(i for i, line in enumerate(lines) if line.startswith(start))
    b = next(i for i in range(a + 1, len(lines)) if lines[i].startswith(end))
    return lines[a:b]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default="916388b", help="the commit whose README holds the run logs")
    args = ap.parse_args(argv)
    readme = subprocess.run(["git", "-C", ROOT, "show", f"{args.rev}:README.md"], capture_output=True, text=True,
                            check=True).stdout.splitlines()
    doc = {"converted_from": f"README.md at commit {args.rev}", "written_by": "benchmarks/live_runs_from_readme.py",
           "parts": [{"title": t, "blocks": blocks(part(readme, s, e))} for t, s, e in PARTS]}
    print(results_file.write("live_runs", doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
