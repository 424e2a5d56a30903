"""spans.csv: one row per op, with the columns of DESIGN.md (``spans.CSV_COLUMNS``)."""
from __future__ import annotations

import csv
from typing import Sequence

from emulator.outputs.atomic import write_atomic
from emulator.spans import CSV_COLUMNS, Span, by_rank


def _row(s: Span) -> list:
    return [s.op_id, s.rank, s.stream, s.kind, s.name, repr(s.start_s), repr(s.end_s), repr(float(s.bytes)),
            repr(float(s.flops)), s.microbatch, s.stage]


def write_spans_csv(path: str, spans: Sequence[Span]) -> None:
    def write(fh) -> None:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(CSV_COLUMNS)
        for s in by_rank(spans):
            w.writerow(_row(s))

    write_atomic(path, write)
