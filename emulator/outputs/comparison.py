"""Runs side by side: the comparison table of ``emulator compare``, as text, JSON rows and HTML.

Each run is a label and its summary (summary.json's object). The first run is the reference:
for every other run X and every metric m, the table gives m(X), m(X) − m(A) and m(X) / m(A)
(no ratio where m(A) is 0 or unknown). Metrics: step time, tokens/s, samples/s, model TFLOP/s
per GPU, MFU, memory per GPU, and the breakdown's four parts (compute, exposed communication,
pipeline bubble, other), each per iteration.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from emulator.outputs.html import at, esc, fmt_pct, img, page, table
from emulator.outputs.printable import printable
from emulator.scenario.units import format_bytes, format_time

Fmt = Callable[[float], str]


def _signed(fmt: Fmt) -> Fmt:
    return lambda x: ("−" if x < 0 else "+") + fmt(abs(x))


def _pct_points(x: float) -> str:
    return f"{x * 100:.1f} pt"


METRICS: tuple[tuple[str, str, Fmt, Fmt], ...] = (  # key path, label, value format, difference format
    ("iteration_time_s", "step time", format_time, _signed(format_time)),
    ("tokens_per_s", "tokens/s", lambda x: f"{x:,.0f}", _signed(lambda x: f"{x:,.0f}")),
    ("samples_per_s", "samples/s", lambda x: f"{x:,.2f}", _signed(lambda x: f"{x:,.2f}")),
    ("model_tflops_per_gpu", "model TFLOP/s/GPU", lambda x: f"{x:.1f}", _signed(lambda x: f"{x:.1f}")),
    ("mfu", "MFU", fmt_pct, _signed(_pct_points)),
    ("memory.peak_bytes_per_gpu", "memory/GPU", format_bytes, _signed(format_bytes)),
    ("breakdown_s.compute", "compute", format_time, _signed(format_time)),
    ("breakdown_s.exposed_comm", "exposed comm", format_time, _signed(format_time)),
    ("breakdown_s.bubble", "pipeline bubble", format_time, _signed(format_time)),
    ("breakdown_s.other", "other", format_time, _signed(format_time)),
)


def letter(i: int) -> str:
    """A, B, …, Z, then R27, R28, …"""
    return chr(ord("A") + i) if i < 26 else f"R{i + 1}"


def comparison_rows(summaries: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per metric: its values, and each later run's difference and ratio to the first."""
    rows = []
    for key, label, _fmt, _dfmt in METRICS:
        values = [at(s, key) for s in summaries]
        if all(v is None for v in values):
            continue
        ref = values[0]
        diffs = [None if v is None or ref is None else v - ref for v in values[1:]]
        ratios = [None if v is None or not ref else v / ref for v in values[1:]]
        rows.append({"key": key, "metric": label, "values": values, "differences": diffs, "ratios": ratios})
    return rows


def _cells(row: Mapping[str, Any]) -> list[str]:
    """The row's text cells: A, then for each later run its value, difference and ratio."""
    fmt, dfmt = next((f, d) for k, _l, f, d in METRICS if k == row["key"])
    vals = row["values"]
    out = ["—" if vals[0] is None else fmt(vals[0])]
    for v, d, r in zip(vals[1:], row["differences"], row["ratios"]):
        out += ["—" if v is None else fmt(v), "—" if d is None else dfmt(d), "—" if r is None else f"{r:.3f}×"]
    return out


def _head(n: int) -> list[str]:
    head = ["A"]
    for i in range(1, n):
        x = letter(i)
        head += [x, f"{x} − A", f"{x} / A"]
    return head


def comparison_text(labels: Sequence[str], summaries: Sequence[Mapping[str, Any]]) -> str:
    """The table for a terminal: a legend (letter = run), then one aligned row per metric."""
    lines = [f"{letter(i)}  {printable(label)}" for i, label in enumerate(labels)]
    rows = comparison_rows(summaries)
    grid = [["", *_head(len(summaries))]] + [[r["metric"], *_cells(r)] for r in rows]
    widths = [max(len(line[c]) for line in grid) for c in range(len(grid[0]))]
    lines.append("")
    for line in grid:
        lines.append(f"{line[0]:<{widths[0]}}" + "".join(f"  {c:>{w}}" for c, w in zip(line[1:], widths[1:])))
    return "\n".join(lines)


def comparison_html(labels: Sequence[str], summaries: Sequence[Mapping[str, Any]], breakdown_png: bytes | None,
                    version: str) -> str:
    """The same comparison as one self-contained page, with the breakdowns as stacked bars."""
    legend = "".join(f"<li><b>{letter(i)}</b> {esc(label)}: {esc(s.get('scenario', ''))}, "
                     f"{esc(s.get('gpus', ''))} GPUs</li>" for i, (label, s) in enumerate(zip(labels, summaries)))
    body_rows = []
    for r in comparison_rows(summaries):
        cells = _cells(r)
        tds = []
        for j, c in enumerate(cells):  # cells: A, then (value, difference, ratio) per later run
            if j == 0 or j % 3 == 1:  # a run's own value: its key and run index, for checks
                run = 0 if j == 0 else (j - 1) // 3 + 1
                tds.append(f'<td class=num data-key="{esc(r["key"])}" data-run="{run}">{esc(c)}</td>')
            else:
                tds.append(f"<td class=num>{esc(c)}</td>")
        body_rows.append(f"<td>{esc(r['metric'])}</td>" + "".join(tds))
    body = (f"<h1>Runs side by side</h1>\n<ul>{legend}</ul>\n"
            + table(["", *_head(len(summaries))], body_rows)
            + "<p class=sub>Differences and ratios are each run's against A.</p>\n")
    if breakdown_png is not None:
        picture = img(breakdown_png, "the breakdowns as stacked bars")
        body += f"<h2>Where the step time goes</h2>\n<p>{picture}</p>\n"
    body += f"<p class=sub>Written by {esc(version)}.</p>\n"
    return page("emulator compare", body)
