"""The files of one run's folder (``emulator run --out DIR``), written as one set.
"""
from __future__ import annotations

from emulator.outputs.atomic import write_text
from emulator.outputs.fileset import write_set
from emulator.outputs.gantt import write_gantt
from emulator.outputs.perfetto import write_perfetto
from emulator.outputs.ranks import ranks_csv
from emulator.outputs.spans_csv import write_spans_csv
from emulator.outputs.summary import summary_json
from emulator.result import Result

# the marker first: see fileset.py
OUTPUT_FILES = ("summary.json", "spans.csv", "trace.json", "ranks.csv", "gantt.png", "scenario.yaml")


def write_outputs(result: Result, summary: dict, out_dir: str, gantt: bool = True,
                  scenario_yaml: str | None = None) -> list[str]:
    """Write every output file of ``result`` into ``out_dir`` as one set; return their paths.

    Without ``gantt``, an old gantt.png in ``out_dir`` is removed: it belongs to another run;
    ``scenario_yaml`` is the scenario as run (scenario.yaml, which ``emulator report`` reads back).
    """
    writers = {"summary.json": lambda p: write_text(p, summary_json(summary)),
               "spans.csv": lambda p: write_spans_csv(p, result.spans),
               "trace.json": lambda p: write_perfetto(p, result),
               "ranks.csv": lambda p: write_text(p, ranks_csv(summary["ranks"], result.program.ranks,
                                                              result.program.fold))}
    if gantt:
        writers["gantt.png"] = lambda p: write_gantt(p, result)
    if scenario_yaml is not None:
        writers["scenario.yaml"] = lambda p: write_text(p, scenario_yaml)
    return write_set(out_dir, writers, OUTPUT_FILES)
