"""gantt.png: the iteration as a pipeline chart, one row group per shown rank.

**Which ranks.** With pipeline stages, one rank stands for each stage: the one whose
compute ends last (the rank the iteration waits for; the lowest id on ties). Its
tensor- and data-parallel peers run the same schedule (with symmetry folding they
are copies of it). Without stages (trace workloads), every rank has its own group.
Beyond ``MAX_ROWS`` rows, groups are sampled evenly, first and last kept. The
caption under the title says which ranks are shown and why.

**Rows.** A group is the rank's compute row, then one thin row per communication
lane (``tp``, ``cp``, ``ep``, ``pp``, ``dp``, ``zero``; a rank's pipeline and
context-parallel send/recv streams share one lane).

**Blocks.** Consecutive compute spans of one micro-batch and phase (fwd, bwd)
become one block when the gap between them is under one pixel (the per-layer
kernels and the tensor-parallel waits in between), so a forward pass is one block,
labelled with its micro-batch number where it is wide enough. Recompute belongs to
its backward block and is drawn as a strip along the block's bottom edge.
Communication is drawn from when the transfer began (after the rendezvous), at
the picture's resolution: each pixel column is shaded by the share of it that a
transfer is busy (a lone short send stays visible, a run of short all-reduces
does not become a solid bar).

**Bubble.** On each ``compute`` row, the idle time from 0 to the end of the last
compute span other than the optimizer's among the shown ranks (the pipeline flush)
is hatched: the bubble, plus any exposed waits.
For GPipe with p stages, m micro-batches, f and b the forward and backward time of
one micro-batch on one stage and free communication, every stage idles
(p − 1)(f + b) of (m + p − 1)(f + b).

**Faults.** Timed link faults (``at``/``until``) are a red line at ``at`` and a shaded
band until ``until`` (or the end of the run).

``chart`` computes all of this (pure, tested on hand-made spans); ``draw`` makes the
matplotlib Figure (no pyplot state); ``write_gantt`` writes the PNG atomically.
"""
from __future__ import annotations

import functools
import io
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, NamedTuple

import numpy as np

from emulator.outputs.atomic import write_atomic
from emulator.outputs.printable import figure_text
from emulator.result import Result
from emulator.spans import Span

MAX_ROWS = 48  # beyond, fewer groups are shown (at least MIN_GROUPS)
MIN_GROUPS = 4
WIDTH_IN, DPI = 14.0, 110
LEFT_IN, RIGHT_IN, TOP_IN, BOTTOM_IN = 1.25, 1.65, 0.62, 0.5  # margins: row labels, legend, titles, x label
AXES_PX = round((WIDTH_IN - LEFT_IN - RIGHT_IN) * DPI)  # the axes' width: the merge and label resolution
EDGE_PX = 4  # blocks at least this wide get a white edge
LABEL_PX = 7  # a micro-batch label needs this many pixels per digit, plus 4
LANE_ORDER = ("compute", "tp", "cp", "ep", "pp", "dp", "zero", "d2h", "h2d", "cpu")
# offload: activation offloading's copies to and from host memory (lanes d2h, h2d); host: the host's own time
# (lane cpu: its issuing of kernels, workload/host.py, or a trace's host ops)
COLORS = {"fwd": "#4C78A8", "bwd": "#F58518", "recompute": "#B279A2", "optimizer": "#54A24B",
          "compute": "#72B7B2", "offload": "#EECA3B", "host": "#79706E", "collective": "#E45756", "send": "#9D755D",
          "recv": "#BAB0AC"}
IDLE_COLOR = "#D9D9D9"
IDLE_LABEL = "idle compute (bubble)"
MIN_ALPHA = 0.3  # the shade of a pixel column that a transfer touches at all


class Block(NamedTuple):
    """One drawn bar: ``key`` is its COLORS entry; ``microbatch`` −1 when mixed or none."""

    start: float
    width: float
    key: str
    microbatch: int


@dataclass(frozen=True)
class Row:
    rank: int
    lane: str
    label: str
    blocks: list[Block]
    compute: bool  # compute bars (else transfers, drawn by busy share)
    idle: list[tuple[float, float]] = field(default_factory=list)  # (start, width), the "compute" lane only
    recompute: list[Block] = field(default_factory=list)  # drawn as a strip inside the backward blocks


@dataclass(frozen=True)
class Chart:
    rows: list[Row]
    shown: list[int]  # ranks, in group order
    caption: str
    end_s: float  # the x extent: the last span's end


@dataclass
class RankInfo:
    """What ``survey`` learns of one rank."""

    stage: int = -1  # the lowest pipeline stage of its spans (interleaving gives a rank several)
    last_compute: float = 0.0
    streams: set[str] = field(default_factory=set)


def lane(stream: str) -> str:
    """The display row of a stream: the pipeline and context-parallel send/recv streams
    of a rank share one row each ("pp", "cp")."""
    head = stream.split("_", 1)[0]
    return head if head in ("pp", "cp") and "_" in stream else stream


def color_key(s: Span) -> str:
    return _color_key(s.kind, s.category)


@functools.lru_cache(maxsize=256)
def _color_key(kind: str, category: str) -> str:
    if kind == "compute":
        return category if category in COLORS else "compute"
    return kind if kind in COLORS else "collective"


def _lane_rank(name: str) -> tuple[int, list[tuple[int, str]]]:
    """Known lanes in LANE_ORDER, then the others in natural order (cuda:7 before cuda:22)."""
    natural = [(int(p), "") if p.isdigit() else (-1, p) for p in re.split(r"(\d+)", name)]
    return (LANE_ORDER.index(name) if name in LANE_ORDER else len(LANE_ORDER), natural)


def survey(spans: Iterable[Span]) -> dict[int, RankInfo]:
    """One pass over every span: each rank's stage, compute end and lanes."""
    out: dict[int, RankInfo] = {}
    for s in spans:
        r = out.get(s.rank)
        if r is None:
            r = out[s.rank] = RankInfo()
        r.streams.add(s.stream)
        if s.stage >= 0 and (r.stage < 0 or s.stage < r.stage):
            r.stage = s.stage
        if s.kind == "compute" and s.end_s > r.last_compute:
            r.last_compute = s.end_s
    return out


def evenly(items: list[int], k: int) -> list[int]:
    """``k`` of ``items`` evenly spaced, the first and the last included."""
    if len(items) <= k:
        return items
    if k <= 1:
        return items[:1]
    return [items[round(i * (len(items) - 1) / (k - 1))] for i in range(k)]


def choose(ranks: dict[int, RankInfo], total: int) -> tuple[list[int], str]:
    """The ranks to show, in order, and the caption that says which and why."""
    per_group = 1 + max((len({lane(st) for st in r.streams} - {"compute"}) for r in ranks.values()), default=0)
    limit = max(MIN_GROUPS, MAX_ROWS // per_group)
    by_stage: dict[int, list[int]] = {}
    for rank, info in ranks.items():
        if info.stage >= 0:
            by_stage.setdefault(info.stage, []).append(rank)
    folded = len(ranks) < total
    if by_stage:
        stages = evenly(sorted(by_stage), limit)
        # the slowest rank of each stage: the latest compute end, the lowest id on ties
        shown = [min(by_stage[st], key=lambda r: (-ranks[r].last_compute, r)) for st in stages]
        which = ("" if len(by_stage) == 1 else "one per pipeline stage, " if len(stages) == len(by_stage)
                 else f"one per pipeline stage for {len(stages)} of {len(by_stage)} stages (evenly spaced), ")
        why = f"{which}the rank whose compute ends last (lowest id on ties)"
        if total > len(shown):
            why += ("; the others are folded copies of the simulated ranks" if folded
                    else "; the others run their stage's schedule")
    else:
        shown = evenly(sorted(ranks), limit)
        why = "every rank" if len(shown) == len(ranks) else "evenly spaced"
        if folded:
            why += f"; {len(ranks)} simulated, the others are folded copies"
    return shown, f"{len(shown)} of {total} ranks shown: {why}"


def merge(spans: list[Span], tol: float, by_microbatch: bool, fold: Mapping[str, str] | None = None) -> list[Block]:
    """Touching spans (gap ≤ ``tol``) of one colour, and of one micro-batch if ``by_microbatch``,
    as one block each; ``fold`` draws some colours as others (recompute inside its backward block)."""
    out: list[Block] = []
    last: dict[str, int] = {}  # colour → index in out of its latest block
    for s in sorted(spans, key=lambda s: (s.start_s, s.op_id)):
        key = color_key(s)
        key = fold.get(key, key) if fold else key
        start = s.start_s if s.kind == "compute" else max(s.start_s, s.xfer_s)
        if s.end_s <= start:
            continue
        mb = s.microbatch if by_microbatch else -1
        i = last.get(key)
        if i is not None:
            b = out[i]
            if start - (b.start + b.width) <= tol and b.microbatch == mb:
                out[i] = Block(b.start, max(b.width, s.end_s - b.start), key, mb)
                continue
        last[key] = len(out)
        out.append(Block(start, s.end_s - start, key, mb))
    return out


def idle(blocks: list[Block], end: float, tol: float) -> list[tuple[float, float]]:
    """The gaps longer than ``tol`` between 0 and ``end`` that no block covers, as (start, width)."""
    out: list[tuple[float, float]] = []
    t = 0.0
    for b in sorted(blocks):
        if b.start - t > tol and t < end:
            out.append((t, min(b.start, end) - t))
        t = max(t, b.start + b.width)
    if end - t > tol:
        out.append((t, end - t))
    return out


def density(blocks: list[Block], end: float, bins: int) -> list[tuple[float, float, float]]:
    """``blocks`` (disjoint, sorted) seen through ``bins`` equal columns of [0, ``end``]: runs of
    columns with the same busy share, as (start, width, share); idle columns left out."""
    if not blocks or end <= 0:
        return []
    starts = np.array([b.start for b in blocks])
    widths = np.array([b.width for b in blocks])
    before = np.concatenate(([0.0], np.cumsum(widths)[:-1]))  # busy time before each block
    edges = np.linspace(0.0, end, bins + 1)
    i = np.searchsorted(starts, edges, side="right") - 1
    j = np.maximum(i, 0)
    busy = np.where(i >= 0, before[j] + np.clip(edges - starts[j], 0.0, widths[j]), 0.0)  # busy time up to each edge
    share = np.clip(np.diff(busy) / (end / bins), 0.0, 1.0)
    share = np.where(share > 0, np.maximum(np.round(share, 2), 0.01), 0.0)  # a touched column stays visible
    out: list[tuple[float, float, float]] = []
    step = end / bins
    k = 0
    while k < bins:
        m = k
        while m + 1 < bins and share[m + 1] == share[k]:
            m += 1
        if share[k] > 0:
            out.append((k * step, (m - k + 1) * step, float(share[k])))
        k = m + 1
    return out


def chart(spans: Iterable[Span], ranks: dict[int, RankInfo], total: int) -> Chart:
    """The rows, blocks and bubble of the chart (times in s); ``ranks`` is ``survey(spans)``."""
    shown, caption = choose(ranks, total)
    keep = set(shown)
    by_stream: dict[tuple[int, str], list[Span]] = {}
    for s in spans:
        if s.rank in keep:
            by_stream.setdefault((s.rank, s.stream), []).append(s)
    by_row: dict[tuple[int, str], list[Span]] = {}
    for (rank, stream), some in sorted(by_stream.items()):
        by_row.setdefault((rank, lane(stream)), []).extend(some)
    end_s = max((s.end_s for row in by_row.values() for s in row), default=0.0)
    tol = end_s / AXES_PX
    flush = max((s.end_s for (_, ln), row in by_row.items() if ln == "compute" for s in row
                 if s.category != "optimizer"), default=0.0)
    rows: list[Row] = []
    for rank in shown:
        st = ranks[rank].stage
        for ln in sorted((ln for r, ln in by_row if r == rank), key=_lane_rank):
            spans_here = by_row[(rank, ln)]
            compute = any(s.kind == "compute" for s in spans_here)
            blocks = merge(spans_here, tol if compute else 0.0, by_microbatch=compute,
                           fold={"recompute": "bwd"} if compute else None)
            redo = merge([s for s in spans_here if s.category == "recompute"], 0.0, by_microbatch=False)
            label = f"s{st} · r{rank} {ln}" if st >= 0 and ln == "compute" else f"r{rank} {ln}"
            rows.append(Row(rank, ln, label, blocks, compute, idle(blocks, flush, tol) if ln == "compute" else [],
                            redo))
    return Chart(rows, shown, caption, end_s)


def _label_fits(width_px: float, mb: int) -> bool:
    return width_px >= LABEL_PX * len(str(mb)) + 4


def draw(c: Chart, title: str, iteration_s: float, faults: Iterable[Any] = ()) -> Any:
    """The matplotlib Figure of a chart: bars, hatched bubble, micro-batch labels, the legend
    right of the axes."""
    from matplotlib.colors import to_rgba
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    scale, unit = (1e3, "ms") if iteration_s < 10 else (1.0, "s")
    n = len(c.rows)
    height = max(2.8, 0.3 * n + 1.7)
    fig = Figure(figsize=(WIDTH_IN, height), dpi=DPI)
    # fixed margins in inches (a layout engine costs a second draw): row labels, legend, titles, x label
    fig.subplots_adjust(left=LEFT_IN / WIDTH_IN, right=1 - RIGHT_IN / WIDTH_IN, top=1 - TOP_IN / height,
                        bottom=BOTTOM_IN / height)
    ax = fig.add_subplot()
    px_per_s = AXES_PX / c.end_s if c.end_s > 0 else 0.0
    used: set[str] = set()
    labelled = False
    for y, row in enumerate(c.rows):
        compute = row.compute
        h = 0.8 if compute else 0.5
        if row.idle:
            ax.broken_barh([(a * scale, w * scale) for a, w in row.idle], (y - h / 2, h), facecolors=IDLE_COLOR,
                           edgecolor="#8C8C8C", hatch="///", linewidth=0, gid="bubble")
            used.add(IDLE_LABEL)
        by_key: dict[str, list[Block]] = {}
        for b in row.blocks:
            by_key.setdefault(b.key, []).append(b)
        for key, blocks in by_key.items():
            used.add(key)
            if not compute:  # a transfer: each pixel column shaded by its busy share
                runs = density(blocks, c.end_s, AXES_PX)
                shades = [to_rgba(COLORS[key], MIN_ALPHA + (1 - MIN_ALPHA) * f) for _, _, f in runs]
                ax.broken_barh([(a * scale, w * scale) for a, w, _ in runs], (y - h / 2, h), facecolors=shades,
                               linewidth=0, gid=key)
                continue
            for wide in (False, True):  # white edges part neighbouring blocks, but would hide narrow ones
                bars = [(b.start * scale, b.width * scale) for b in blocks if (b.width * px_per_s >= EDGE_PX) == wide]
                if bars:
                    ax.broken_barh(bars, (y - h / 2, h), facecolors=COLORS[key], edgecolor="white",
                                   linewidth=0.5 if wide else 0, gid=key)
        if row.recompute:  # a strip along the bottom of the backward blocks, shaded by busy share
            runs = density(row.recompute, c.end_s, AXES_PX)
            shades = [to_rgba(COLORS["recompute"], MIN_ALPHA + (1 - MIN_ALPHA) * f) for _, _, f in runs]
            ax.broken_barh([(a * scale, w * scale) for a, w, _ in runs], (y + h / 2 - 0.25 * h, 0.25 * h),
                           facecolors=shades, linewidth=0, gid="recompute")
            used.add("recompute")
        if compute:
            for b in row.blocks:
                if b.microbatch >= 0 and _label_fits(b.width * px_per_s, b.microbatch):
                    ax.text((b.start + b.width / 2) * scale, y, str(b.microbatch), ha="center", va="center",
                            fontsize=6, color="white", gid="microbatch")
                    labelled = True
    for f in faults:  # timed link faults: a line when it begins, a band while it lasts
        stop = min(f.until_s if f.until_s is not None else c.end_s, max(c.end_s, f.at_s))  # not past the run
        ax.axvspan(f.at_s * scale, stop * scale, color="#E45756", alpha=0.10, linewidth=0, gid="fault")
        ax.axvline(f.at_s * scale, color="#E45756", linewidth=1.2, gid="fault")
        ax.text(f.at_s * scale, -0.6, f" {figure_text(f.label)}", color="#E45756", fontsize=7, va="bottom")
    for y in range(1, n):  # a line between groups
        if c.rows[y].rank != c.rows[y - 1].rank:
            ax.axhline(y - 0.5, color="#7F7F7F", linewidth=0.6)
    ax.set_yticks(range(n))
    ax.set_yticklabels([r.label for r in c.rows], fontsize=7)
    ax.set_ylim(max(n, 1) - 0.5, -0.5)
    ax.set_xlim(0, max(c.end_s, iteration_s) * scale * 1.005 or 1.0)
    notes = [f"time ({unit})"]
    if labelled:
        notes.append("numbers: micro-batches")
    if any(not r.compute for r in c.rows):
        notes.append("communication: the paler, the less of that moment a transfer is busy")
    ax.set_xlabel(";  ".join(notes))
    fig.suptitle(f"{title}: iteration {iteration_s * scale:.3f} {unit}", fontsize=10, y=1 - 0.08 / height,
                 va="top")
    ax.set_title(figure_text(c.caption), fontsize=7.5, loc="left")
    handles = [Patch(facecolor=COLORS[k], label=k) for k in COLORS if k in used]
    if IDLE_LABEL in used:
        handles.append(Patch(facecolor=IDLE_COLOR, edgecolor="#8C8C8C", hatch="///", linewidth=0,
                             label=IDLE_LABEL))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), borderaxespad=0, fontsize=7,
              frameon=False)
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    return fig


def gantt_figure(result: Result) -> Any:
    spans = result.spans
    c = chart(spans, survey(spans), result.program.ranks)
    return draw(c, figure_text(result.scenario.name), result.iteration_time_s, result.faults)


def write_gantt(path: str, result: Result) -> None:
    fig = gantt_figure(result)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    write_atomic(path, lambda fh: fh.write(buf.getvalue()), binary=True)
