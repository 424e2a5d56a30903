"""Study plots from a results database: a line, a heatmap or a Pareto front.

- one field (``--x``): a metric against it, one line per combination of any other
  varied fields;
- two fields (``--x`` and ``--by``): a heatmap of the metric;
- ``--pareto``: tokens/s against GPUs (or cost per hour, ``--cost-per-gpu-hour``),
  with the front: the points that no cheaper point beats;
- ``--links SCENARIO``: runs it and draws its link utilisation (emulator/outputs/linkplot.py);
- ``--jobs``, ``--shared-links``: multi-job rows, each job's slowdown against the varied field, and
  one row's shared links' load by job (emulator/studies/jobplot.py).

A field's value is the one the study varied ("100 Gb/s"), else the resolved
scenario's (so a row made by another study can still be placed); values sort by
their resolved SI number when there is one. Every figure is written as PNG and
SVG, atomically.
"""
from __future__ import annotations

import argparse
import math
import os
from typing import Any, Sequence

from emulator.errors import EmulatorError
from emulator.outputs.figures import save_figure
from emulator.outputs.linkplot import plot_links
from emulator.outputs.printable import figure_text
from emulator.studies.store import ResultStore, Row


class PlotError(EmulatorError):
    """Nothing to plot, or an ambiguous request."""


_ABSENT = object()  # a key path that leads nowhere (unlike a field whose value is null)


def _find(tree: Any, key: str) -> Any:
    for part in key.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return _ABSENT
        tree = tree[part]
    return tree


def _lookup(tree: Any, key: str) -> Any:
    v = _find(tree, key)
    return None if v is _ABSENT else v


def require_field(rows: Sequence[Row], key: str, flag: str) -> None:
    """A PlotError unless some row has scenario field ``key`` (varied, or in its resolved scenario)."""
    if any(key in r.varied or _find(r.resolved, key) is not _ABSENT for r in rows):
        return
    varied = sorted({k for r in rows for k in r.varied})
    hint = f"; the varied fields are {', '.join(varied)}" if varied else ""
    raise PlotError(f"{flag} {key}: no row has this scenario field (expected a key path such as "
                    f"parallel.tp or cluster.fabric.oversubscription){hint}")


def field_value(row: Row, key: str) -> Any:
    """The value of a scenario field for this row: as varied, else as resolved."""
    if key in row.varied:
        return row.varied[key]
    v = _lookup(row.resolved, key)
    return v.get("name", str(v)) if isinstance(v, dict) else v


def sort_key(row: Row, key: str) -> tuple:
    """Numbers first by value (resolved SI when the varied text has units), then text."""
    r = _lookup(row.resolved, key)
    v = field_value(row, key)
    num = r if isinstance(r, (int, float)) and not isinstance(r, bool) else v
    if isinstance(num, (int, float)) and not isinstance(num, bool):
        return (0, float(num), "")
    return (1, 0.0, str(v))


def varied_keys(rows: Sequence[Row]) -> list[str]:
    """Fields varied across ``rows`` (more than one value), in first-seen order."""
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r.varied if k not in keys]
    return [k for k in keys if len({repr(field_value(r, k)) for r in rows}) > 1]


def metric_value(row: Row, metric: str) -> float | None:
    v = row.metric(metric)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def select(rows: Sequence[Row], where: Sequence[str]) -> list[Row]:
    """Rows that finished, filtered by ``--where key=value`` (compared as text)."""
    out = [r for r in rows if r.status == "ok"]
    for cond in where:
        if "=" not in cond:
            raise PlotError(f'--where {cond}: expected key.path=value')
        k, v = (x.strip() for x in cond.split("=", 1))
        out = [r for r in out if str(field_value(r, k)) == v]
    if not out:
        raise PlotError("no finished rows to plot" + (" (check --where)" if where else ""))
    return out


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points (cost, value) on the front: sorted by cost, each strictly
    better in value than every cheaper-or-equal point."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best = [], float("-inf")
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def _label(v: Any) -> str:
    """A value as a tick, legend or annotation text (user text escaped: no raw control characters, no mathtext)."""
    return f"{v:g}" if isinstance(v, float) else figure_text(str(v))


def line_figure(rows: Sequence[Row], x: str, metric: str, title: str) -> Any:
    from matplotlib.figure import Figure

    others = [k for k in varied_keys(rows) if k != x]
    groups: dict[tuple, list[Row]] = {}
    for r in rows:
        groups.setdefault(tuple(_label(field_value(r, k)) for k in others), []).append(r)
    xs_all = sorted({_label(field_value(r, x)): sort_key(r, x) for r in rows}.items(), key=lambda kv: kv[1])
    numeric = all(k[0] == 0 for _, k in xs_all)
    pos = {lab: (k[1] if numeric else i) for i, (lab, k) in enumerate(xs_all)}
    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    for g, members in sorted(groups.items()):
        members = sorted(members, key=lambda r: sort_key(r, x))
        label = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in zip(others, g)) or None
        ys = [metric_value(r, metric) for r in members]
        ax.plot([pos[_label(field_value(r, x))] for r in members], [math.nan if y is None else y for y in ys],
                marker="o", label=label)
    if not numeric:
        ax.set_xticks([pos[lab] for lab, _ in xs_all])
        ax.set_xticklabels([lab for lab, _ in xs_all])
    ax.set_xlabel(x)
    ax.set_ylabel(metric)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if others:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def heatmap_figure(rows: Sequence[Row], x: str, y: str, metric: str, title: str) -> Any:
    import numpy as np
    from matplotlib.figure import Figure

    xs = [lab for lab, _ in sorted({_label(field_value(r, x)): sort_key(r, x) for r in rows}.items(),
                                   key=lambda kv: kv[1])]
    ys = [lab for lab, _ in sorted({_label(field_value(r, y)): sort_key(r, y) for r in rows}.items(),
                                   key=lambda kv: kv[1])]
    grid = np.full((len(ys), len(xs)), np.nan)
    for r in rows:
        i, j = ys.index(_label(field_value(r, y))), xs.index(_label(field_value(r, x)))
        if not np.isnan(grid[i, j]):
            extra = [k for k in varied_keys(rows) if k not in (x, y)]
            raise PlotError(f"several rows for {x}={xs[j]}, {y}={ys[i]}: fix the other varied fields "
                            f"with --where ({', '.join(extra) or 'they differ in unvaried fields'})")
        v = metric_value(r, metric)
        grid[i, j] = np.nan if v is None else v
    fig = Figure(figsize=(1.2 * len(xs) + 3, 0.6 * len(ys) + 2.5))
    ax = fig.add_subplot()
    im = ax.imshow(grid, cmap="viridis", aspect="auto", origin="lower")
    ax.set_xticks(range(len(xs)))
    ax.set_xticklabels(xs)
    ax.set_yticks(range(len(ys)))
    ax.set_yticklabels(ys)
    finite = grid[np.isfinite(grid)]
    mid = (finite.min() + finite.max()) / 2 if finite.size else 0.0
    for i in range(len(ys)):
        for j in range(len(xs)):
            if np.isfinite(grid[i, j]):
                ax.text(j, i, f"{grid[i, j]:.3g}", ha="center", va="center", fontsize=8,
                        color="white" if grid[i, j] < mid else "black")
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label=metric)
    fig.tight_layout()
    return fig


def pareto_figure(rows: Sequence[Row], metric: str, cost_per_gpu_hour: float | None, title: str) -> Any:
    from matplotlib.figure import Figure

    pts = [(float(r.metric("gpus")) * (cost_per_gpu_hour or 1.0), metric_value(r, metric) or 0.0) for r in rows]
    front = pareto_front(pts)
    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=14, color="0.6", label="all configurations")
    fx = [pts[i] for i in front]
    ax.plot([p[0] for p in fx], [p[1] for p in fx], "o-", color="C3", label="Pareto front")
    keys = varied_keys(rows)
    for i in front:
        text = ", ".join(f"{k.split('.')[-1]}={_label(field_value(rows[i], k))}" for k in keys)
        ax.annotate(text, pts[i], fontsize=7, xytext=(4, -10), textcoords="offset points")
    ax.set_xlabel("cost ($ per hour)" if cost_per_gpu_hour else "GPUs")
    ax.set_ylabel(metric)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def default_metric(rows: Sequence[Row]) -> str:
    return "tokens_per_s" if any(metric_value(r, "tokens_per_s") for r in rows) else "iteration_time_s"


def plot_study(db: str, out: str, x: str | None = None, by: str | None = None, metric: str | None = None,
               where: Sequence[str] = (), pareto: bool = False, cost_per_gpu_hour: float | None = None,
               jobs: str = "", top: int = 16) -> list[str]:
    """Draw a study from ``db`` into ``out`` (.png and .svg); returns the paths written (``jobs``:
    "slowdown" or "links", the figures of emulator/studies/jobplot.py)."""
    with ResultStore(db, create=False) as store:
        rows = select(store.rows(), where)
    if jobs:
        return _job_figure(rows, out, x, jobs, top, figure_text(os.path.basename(db)))
    metric = metric or default_metric(rows)
    if not any(metric_value(r, metric) is not None for r in rows):
        raise PlotError(f"--y {metric}: no row has this metric (e.g. tokens_per_s, iteration_time_s, mfu, "
                        "breakdown_s.exposed_comm, memory.peak_bytes_per_gpu)")
    name = figure_text(os.path.basename(db))
    if pareto:
        return save_figure(pareto_figure(rows, metric, cost_per_gpu_hour, f"{metric}: Pareto front ({name})"), out)
    for flag, key in (("--x", x), ("--by", by)):
        if key:
            require_field(rows, key, flag)
    fields = [f for f in (x, by) if f] or varied_keys(rows)
    if not fields:
        raise PlotError("the rows vary no field: nothing to put on the x axis (give --x)")
    if len(fields) == 1:
        return save_figure(line_figure(rows, fields[0], metric, f"{metric} ({name})"), out)
    if len(fields) == 2:
        return save_figure(heatmap_figure(rows, fields[0], fields[1], metric, f"{metric} ({name})"), out)
    raise PlotError(f"the rows vary {len(fields)} fields ({', '.join(fields)}): choose --x (a line) "
                    "or --x and --by (a heatmap), and fix others with --where")


def _job_figure(rows: Sequence[Row], out: str, x: str | None, kind: str, top: int, name: str) -> list[str]:
    from emulator.studies.jobplot import shared_links_figure, slowdown_figure

    if kind == "links":
        if len(rows) != 1:
            raise PlotError(f"--shared-links draws one row; {len(rows)} rows match (pick one with --where "
                            f"{', '.join(varied_keys(rows)) or 'key=value'})")
        return save_figure(shared_links_figure(rows[0], top, f"shared links' load by job ({name})"), out)
    fields = [x] if x else varied_keys(rows)
    if len(fields) != 1:
        raise PlotError(f"--jobs puts one field on the x axis; the rows vary {len(fields)} ({', '.join(fields)}): "
                        "give --x and fix the others with --where")
    if x:
        require_field(rows, x, "--x")
    key = fields[0]
    return save_figure(slowdown_figure(rows, key, lambda r: _label(field_value(r, key)), lambda r: sort_key(r, key),
                                       f"slowdown per job ({name})"), out)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", help="results database of a sweep or search")
    p.add_argument("--x", help="field on the x axis (default: the varied field)")
    p.add_argument("--by", help="second field: makes a heatmap")
    p.add_argument("--y", help="metric (default tokens_per_s; any summary path, e.g. breakdown_s.bubble)")
    p.add_argument("--where", action="append", default=[], metavar="KEY.PATH=VALUE", help="keep only these rows")
    p.add_argument("--pareto", action="store_true", help="throughput against GPUs (or cost) with its front")
    p.add_argument("--cost-per-gpu-hour", type=float, help="with --pareto: cost on the x axis")
    p.add_argument("--links", metavar="SCENARIO", help="run this scenario and plot its link utilisation")
    p.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE", help="with --links")
    p.add_argument("--top", type=int, default=16, help="with --links, --shared-links: how many links (default 16)")
    p.add_argument("--jobs", action="store_true", help="each job's slowdown against the varied field (jobs:)")
    p.add_argument("--shared-links", action="store_true", help="one row's shared links' load by job (jobs:)")
    p.add_argument("--out", default="plot.png", help="output PNG (an SVG is written next to it)")


def plot_command(args: argparse.Namespace) -> str:
    if args.links:
        if os.path.isdir(args.links):
            raise PlotError(f"--links {args.links}: a run's output folder holds no link series; "
                            "give the scenario file (it is run with link recording)")
        from emulator.run.simulation import simulate
        from emulator.scenario.checks import require_workload
        from emulator.scenario.reader import load_scenario

        sc = load_scenario(args.links, args.set)
        require_workload(sc)
        paths = plot_links(simulate(sc, record_links=True), args.out, top=args.top)
        return "wrote " + " and ".join(paths)
    if not args.db:
        raise PlotError("plot needs --db RESULTS.sqlite (or --links SCENARIO)")
    if args.cost_per_gpu_hour is not None and args.cost_per_gpu_hour <= 0:
        raise PlotError("--cost-per-gpu-hour: expected a positive number")
    jobs = "links" if getattr(args, "shared_links", False) else "slowdown" if getattr(args, "jobs", False) else ""
    paths = plot_study(args.db, args.out, args.x, args.by, args.y, args.where, args.pareto, args.cost_per_gpu_hour,
                       jobs, args.top)
    return "wrote " + " and ".join(paths)
