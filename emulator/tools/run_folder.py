"""A saved run folder (``emulator run --out DIR``) read back: what ``emulator report`` and
``emulator compare`` need of it.

- ``summary.json``: the numbers (required: a folder without it is an unfinished run,
  outputs/fileset.py);
- ``trace.json``: the spans (rank, stream, compute or communication, category, start, when the
  transfer began = start + ``wait_us``, end) and the busiest links' load counters (GB/s, piecewise
  constant from each counter event to the next: integrated into bytes);
- ``gantt.png`` and ``scenario.yaml`` (the scenario as run) when the run wrote them.

Bad input (no folder, no summary, a file that is not what the run writes) is an EmulatorError naming
the file (exit 2).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from emulator.errors import EmulatorError
from emulator.spans import Span

_JOB_THREAD = re.compile(r"^rank \d+ · gpu (\d+) · (.+)$")  # a multi-job run's thread (outputs/perfetto.py)
LINKS_PROCESS = "fabric links (GB/s)"


@dataclass
class RunFolder:
    path: str
    summary: dict[str, Any]
    spans: list[Span] = field(default_factory=list)
    link_bytes: dict[str, float] = field(default_factory=dict)  # "u->v" → bytes carried (recorded links only)
    gantt_png: bytes | None = None
    scenario_yaml: str | None = None
    missing: list[str] = field(default_factory=list)  # the files this folder lacks


def _read(path: str, binary: bool = False) -> Any:
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
        return raw if binary else raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise EmulatorError(f"{path}: cannot read it ({exc})") from None


def read_summary(folder: str) -> dict[str, Any]:
    """The summary.json of a run folder."""
    path = os.path.join(folder, "summary.json")
    if not os.path.isfile(path):
        raise EmulatorError(f"{folder}: no summary.json: not a finished run folder (emulator run --out DIR writes one)")
    try:
        summary = json.loads(_read(path))
    except json.JSONDecodeError as exc:
        raise EmulatorError(f"{path}: not JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(summary, dict) or "iteration_time_s" not in summary or "breakdown_s" not in summary:
        raise EmulatorError(f"{path}: not an emulator summary (no iteration_time_s or breakdown_s)")
    return summary


def trace_contents(trace: dict[str, Any]) -> tuple[list[Span], dict[str, float]]:
    """The spans and the links' bytes of a trace.json object (outputs/perfetto.py's layout)."""
    events = trace.get("traceEvents", [])
    process: dict[int, str] = {}
    thread: dict[tuple[int, int], str] = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            process[e["pid"]] = e["args"]["name"]
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            thread[(e["pid"], e["tid"])] = e["args"]["name"]
    spans: list[Span] = []
    counters: dict[str, list[tuple[float, float]]] = {}
    for e in events:
        ph, pid = e.get("ph"), e.get("pid")
        if ph == "C" and process.get(pid) == LINKS_PROCESS:
            counters.setdefault(e["name"], []).append((e["ts"] * 1e-6, e["args"]["GB/s"] * 1e9))
        elif ph == "X" and e.get("cat") != "fault":
            name = thread.get((pid, e.get("tid")), "compute")
            rank, stream = pid, name
            m = _JOB_THREAD.match(name)
            if m:
                rank, stream = int(m.group(1)), m.group(2)
            args = e.get("args", {})
            start, end = e["ts"] * 1e-6, (e["ts"] + e["dur"]) * 1e-6
            comm = "wait_us" in args
            spans.append(Span(args.get("op_id", -1), rank, stream, "comm" if comm else "compute", e.get("name", ""),
                              start, end, args.get("bytes", 0.0), args.get("flops", 0.0),
                              args.get("microbatch", -1), args.get("stage", -1),
                              "" if comm else e.get("cat", ""),
                              start + args["wait_us"] * 1e-6 if comm else start))
    end_s = max((s.end_s for s in spans), default=0.0)
    return spans, {link: _integral(series, end_s) for link, series in counters.items()}


def _integral(series: list[tuple[float, float]], end_s: float) -> float:
    """∫ load dt of a piecewise-constant series (each value holds until the next, the last until ``end_s``)."""
    series = sorted(series)
    total = 0.0
    for (t, load), (t_next, _) in zip(series, [*series[1:], (max(end_s, series[-1][0]), 0.0)]):
        total += load * (t_next - t)
    return total


def read_run(folder: str) -> RunFolder:
    """Everything of a run folder that a report shows."""
    if not os.path.isdir(folder):
        raise EmulatorError(f"{folder}: no such folder (a scenario file, or a folder of emulator run --out)")
    run = RunFolder(folder, read_summary(folder))
    trace = os.path.join(folder, "trace.json")
    if os.path.isfile(trace):
        try:
            data = json.loads(_read(trace))
            run.spans, run.link_bytes = trace_contents(data)
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise EmulatorError(f"{trace}: not a trace.json of emulator run ({type(exc).__name__}: {exc})") from None
    else:
        run.missing.append("trace.json")
    gantt = os.path.join(folder, "gantt.png")
    if os.path.isfile(gantt):
        run.gantt_png = _read(gantt, binary=True)
    else:
        run.missing.append("gantt.png")
    scenario = os.path.join(folder, "scenario.yaml")
    if os.path.isfile(scenario):
        run.scenario_yaml = _read(scenario)
    else:
        run.missing.append("scenario.yaml")
    return run
