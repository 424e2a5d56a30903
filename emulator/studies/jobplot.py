"""Study plots of multi-job runs (``jobs:``, issue 29), from a results database.

- ``--jobs``: each job's slowdown (shared over alone iteration time, the summary's ``jobs[*].slowdown``)
  against the varied field, one line per job, with the mix's p90 dashed;
- ``--shared-links``: for one row, a heatmap of the shared links' load by job: job j's share of
  link l's capacity over its iteration, bytes_per_iteration[j] / (capacity · iteration time of j),
  the busiest ``--top`` links (the summary's ``shared_links``, busiest first).
"""
from __future__ import annotations

import math
from typing import Any, Sequence

from emulator.errors import EmulatorError
from emulator.outputs.printable import figure_text
from emulator.studies.store import Row


class JobPlotError(EmulatorError):
    """Rows without jobs, or more than one row for a per-row figure."""


def _jobs(row: Row) -> list[dict[str, Any]]:
    return list((row.summary or {}).get("jobs") or [])


def slowdown_figure(rows: Sequence[Row], x: str, value: Any, sort: Any, title: str) -> Any:
    """Per-job slowdown against field ``x`` (``value(row)``: its label, ``sort(row)``: its order)."""
    from matplotlib.figure import Figure

    rows = [r for r in rows if _jobs(r)]
    if not rows:
        raise JobPlotError("--jobs: no row has jobs (a scenario with jobs: makes them)")
    order = sorted(rows, key=sort)
    labels = list(dict.fromkeys(value(r) for r in order))
    pos = {lab: i for i, lab in enumerate(labels)}
    names = list(dict.fromkeys(j["name"] for r in order for j in _jobs(r)))
    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    for name in names:
        pts = [(pos[value(r)], j["slowdown"]) for r in order for j in _jobs(r) if j["name"] == name]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=figure_text(name))
    p90 = [((r.summary or {}).get("mix") or {}).get("slowdown", {}).get("p90") for r in order]
    ax.plot([pos[value(r)] for r in order], [math.nan if v is None else v for v in p90], "k--", label="mix p90")
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels([figure_text(str(lab)) for lab in labels])
    ax.set_xlabel(x)
    ax.set_ylabel("slowdown (shared / alone)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2 if len(names) > 8 else 1)
    fig.tight_layout()
    return fig


def link_loads(row: Row, top: int) -> tuple[list[str], list[str], list[list[float]]]:
    """(links, jobs, load[link][job]) of a row's busiest ``top`` shared links (see the module doc)."""
    summary = row.summary or {}
    times = {j["name"]: j["iteration_time_s"] for j in _jobs(row)}
    links = list(summary.get("shared_links") or [])[:top]
    if not links:
        raise JobPlotError("--shared-links: the row's jobs share no link")
    names = [n for n in times if any(n in r["bytes_per_iteration"] for r in links)]
    grid = [[r["bytes_per_iteration"].get(n, 0.0) / (r["capacity_B_per_s"] * times[n]) if times[n] > 0 else 0.0
             for n in names] for r in links]
    return [r["link"] for r in links], names, grid


def shared_links_figure(row: Row, top: int, title: str) -> Any:
    import numpy as np
    from matplotlib.figure import Figure

    links, names, grid = link_loads(row, top)
    data = np.array(grid)
    fig = Figure(figsize=(0.9 * len(names) + 4, 0.35 * len(links) + 2.5))
    ax = fig.add_subplot()
    im = ax.imshow(data, cmap="magma", aspect="auto", vmin=0.0)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels([figure_text(n) for n in names], rotation=45, ha="right")
    ax.set_yticks(range(len(links)))
    ax.set_yticklabels([figure_text(n) for n in links], fontsize=7)
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label="share of the link's capacity over the job's iteration")
    fig.tight_layout()
    return fig
