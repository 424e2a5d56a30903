"""gantt.png: one row per (rank, stream), compute and communication coloured by kind.

Readable at 8 ranks and at 512: pipeline (and context-parallel) send and recv
streams share one row per rank; beyond ``MAX_ROWS`` rows, ranks are sampled
evenly, always keeping one rank of every pipeline stage, and the title says how
many are shown. On busy rows, touching spans of one colour are merged before drawing.
Timed link faults are a red line at ``at`` and a shaded band until ``until`` (or the end).
"""
from __future__ import annotations

import io

from emulator.outputs.atomic import write_atomic
from emulator.simulation import Result
from emulator.spans import Span

MAX_ROWS = 48  # beyond, fewer ranks are shown (at least MIN_RANKS)
MIN_RANKS = 4
COLORS = {"fwd": "#4C78A8", "bwd": "#F58518", "recompute": "#B279A2", "optimizer": "#54A24B",
          "compute": "#72B7B2", "collective": "#E45756", "send": "#9D755D", "recv": "#BAB0AC"}


def lane(stream: str) -> str:
    """The display row of a stream: the pipeline and context-parallel send/recv streams
    of a rank share one row each ("pp", "cp")."""
    head = stream.split("_", 1)[0]
    return head if head in ("pp", "cp") and "_" in stream else stream


def sample_ranks(ranks: list[int], stage_of: dict[int, int], limit: int = 16) -> list[int]:
    """At most ``limit`` ranks: one per stage first, then evenly spaced others."""
    if len(ranks) <= limit:
        return ranks
    chosen: dict[int, int] = {}
    for r in ranks:
        chosen.setdefault(stage_of.get(r, -1), r)
    picked = set(list(chosen.values())[:limit])
    step = len(ranks) / max(1, limit - len(picked))
    i = 0.0
    while len(picked) < limit and int(i) < len(ranks):
        picked.add(ranks[int(i)])
        i += step
    return sorted(picked)


def _color(s: Span) -> str:
    if s.kind == "compute":
        return COLORS.get(s.category, COLORS["compute"])
    return COLORS[s.kind]


MERGE_ABOVE = 400  # spans per row; beyond, touching bars of one colour are merged


def _merged(spans: list[Span]) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list[tuple[float, float]]] = {}
    merge = len(spans) > MERGE_ABOVE
    for s in sorted(spans, key=lambda s: s.start_s):
        c = _color(s)
        bars = out.setdefault(c, [])
        start = s.xfer_s if s.kind != "compute" else s.start_s
        if merge and bars and start - (bars[-1][0] + bars[-1][1]) <= 1e-12:
            a, w = bars[-1]
            bars[-1] = (a, max(w, s.end_s - a))
        elif s.end_s > start:
            bars.append((start, s.end_s - start))
    return out


def write_gantt(path: str, result: Result) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    by_row: dict[tuple[int, str], list[Span]] = {}
    stage_of: dict[int, int] = {}
    for s in result.spans:
        by_row.setdefault((s.rank, lane(s.stream)), []).append(s)
        if s.stage >= 0:
            stage_of.setdefault(s.rank, s.stage)
    ranks = sorted({r for r, _ in by_row})
    lanes = max(1, len(by_row) // max(1, len(ranks)))
    shown = sample_ranks(ranks, stage_of, max(MIN_RANKS, MAX_ROWS // lanes))
    rows = sorted(k for k in by_row if k[0] in set(shown))
    rows.sort(key=lambda k: (k[0], k[1] != "compute", k[1]))
    fig, ax = plt.subplots(figsize=(14, max(2.5, 0.28 * len(rows) + 1.2)), dpi=110)
    scale, unit = (1e3, "ms") if result.iteration_time_s < 10 else (1.0, "s")
    for y, key in enumerate(rows):
        for color, bars in _merged(by_row[key]).items():
            ax.broken_barh([(a * scale, w * scale) for a, w in bars], (y - 0.4, 0.8), facecolors=color,
                           edgecolor="white", linewidth=0.4)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"r{r} {st}" + (f" (s{stage_of[r]})" if r in stage_of else "") for r, st in rows],
                       fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(f"time ({unit})")
    total = result.program.ranks
    note = f"{len(shown)} of {total} ranks shown" if len(shown) < total else f"{total} ranks"
    ax.set_title(f"{result.scenario.name}: iteration {result.iteration_time_s * scale:.3f} {unit} ({note})",
                 fontsize=10)
    used = {c for key in rows for c in _merged(by_row[key])}
    ax.legend(handles=[Patch(color=c, label=k) for k, c in COLORS.items() if c in used], loc="upper right",
              fontsize=7, ncol=4)
    ax.grid(axis="x", alpha=0.3)
    end = max((s.end_s for s in result.spans), default=0.0)
    for f in result.faults:
        stop = min(f.until_s if f.until_s is not None else end, max(end, f.at_s))  # not past the run
        ax.axvspan(f.at_s * scale, stop * scale, color="#E45756", alpha=0.10, linewidth=0)
        ax.axvline(f.at_s * scale, color="#E45756", linewidth=1.2)
        ax.text(f.at_s * scale, -0.6, f" {f.label}", color="#E45756", fontsize=7, va="bottom")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    write_atomic(path, lambda fh: fh.write(buf.getvalue()), binary=True)
