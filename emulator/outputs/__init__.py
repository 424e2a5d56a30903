"""The outputs layer: what a finished run shows, from its Result and Spans only.

Owns the summary (summary.py), spans.csv, trace.json for Perfetto, gantt.png, the
link-utilisation plot (linkplot.py), saving figures (figures.py) and atomic writes
(atomic.py). ``write_outputs`` writes the files of DESIGN.md's "Output files", each
atomically.

May import: emulator.simulation (Result) and everything below it; never studies/,
tools/, live/ or the CLI.
"""
from __future__ import annotations

import os

from emulator.outputs.atomic import write_text
from emulator.outputs.gantt import write_gantt
from emulator.outputs.perfetto import write_perfetto
from emulator.outputs.spans_csv import write_spans_csv
from emulator.outputs.summary import summary_json
from emulator.simulation import Result


def write_outputs(result: Result, summary: dict, out_dir: str, gantt: bool = True) -> list[str]:
    """Write every output file of ``result`` into ``out_dir``; return their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, n) for n in ("summary.json", "spans.csv", "trace.json", "gantt.png")]
    write_text(paths[0], summary_json(summary))
    write_spans_csv(paths[1], result.spans)
    write_perfetto(paths[2], result)
    if gantt:
        write_gantt(paths[3], result)
    else:
        paths.pop()
    return paths
