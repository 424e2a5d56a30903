"""Replay report: a trace's measured timeline against its emulated replay, per rank.

``compare(program, result)`` reads ``program.meta.measured`` (written by the
Kineto importer) and the spans of ``result`` (the engine's run of that program):

- span: first to last GPU op of the rank (host ``cpu`` lane excluded);
- end: the last GPU op's end, from the common time origin (the earliest step
  start when the ranks share a clock; the rank's own step start otherwise);
- wait: time spent in collectives before the transfer began. Measured: the sum of
  the collectives' ``wait_s`` (known only with a shared clock, else ``None``);
  emulated: the sum of ``xfer_s - start_s`` over the rank's communication spans.
"""
from __future__ import annotations

from typing import Any

from emulator.errors import EmulatorError
from emulator.program import COMM_KINDS, OFF_SM_STREAMS, Program

_COMM_LABELS = tuple(k.label for k in COMM_KINDS)  # span kinds are labels


def _gpu_spans(result: Any, rank: int) -> list:
    return [s for s in result.spans if s.rank == rank and s.stream not in OFF_SM_STREAMS]


def compare(program: Program, result: Any) -> list[dict]:
    """Per rank: measured vs emulated span, end and collective wait (seconds), and span error."""
    measured = program.meta.measured
    if not measured:
        raise EmulatorError("replay report: the program carries no measured timeline (not a Kineto import)")
    rows = []
    for m in measured["ranks"]:
        spans = _gpu_spans(result, m["rank"])
        if not spans:
            continue
        start = min(s.start_s for s in spans)
        end = max(s.end_s for s in spans)
        comm = [s for s in spans if s.kind in _COMM_LABELS]
        waits = [c["wait_s"] for c in m["collectives"]]
        known = [w for w in waits if w is not None]
        meas_wait = sum(known) if waits and len(known) == len(waits) else None
        emu_span = end - start
        rows.append({
            "rank": m["rank"],
            "measured_span_s": m["span_s"], "emulated_span_s": emu_span,
            "measured_end_s": m["end_s"], "emulated_end_s": end,
            "measured_wait_s": meas_wait, "emulated_wait_s": sum(s.xfer_s - s.start_s for s in comm),
            "span_error": (emu_span - m["span_s"]) / m["span_s"] if m["span_s"] else 0.0,
        })
    return rows
