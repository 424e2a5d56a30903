"""Sweeps: a grid (or zip) of scenario variants, run in parallel into the results store.

``emulator sweep SCENARIO --vary key.path=v1,v2 [--vary ...] [--zip]`` makes one
point per combination of the values (the cartesian product, first ``--vary``
slowest; with ``--zip`` the i-th values of every list together). A point is the
base scenario with ``--set``-style overrides; every point is loaded (and so
validated) before anything runs, and a bad one is named with its key.

Points are keyed by their resolved scenario (:func:`emulator.store.scenario_key`);
keys already in the database, computed by this same emulator (:mod:`emulator.fingerprint`),
are skipped, so a killed sweep resumes where it stopped and a finished one costs
nothing to re-run. Each finished point is committed on its own by this (the
parent) process; a point that fails with an EmulatorError is stored as an error
and not retried unless ``--retry-errors``.
"""
from __future__ import annotations

import argparse
import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from tqdm import tqdm

from emulator.errors import EmulatorError
from emulator.outputs.progress import points_bar
from emulator.scenario.spec import Scenario
from emulator.studies.executor import DaskExecutor, Executor, LocalExecutor
from emulator.studies.store import ResultStore, export_csv, make_row, scenario_key

MAX_POINTS = 100_000


class SweepError(EmulatorError):
    """A bad ``--vary`` or a point that does not load."""


# ------------------------------------------------------------------ parsing --vary


def split_values(text: str) -> list[str]:
    """'1,2,[4, 4],"a,b"' -> ['1', '2', '[4, 4]', '"a,b"']: commas outside brackets and quotes."""
    out: list[str] = []
    cur: list[str] = []
    depth, quote = 0, ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    out.append("".join(cur).strip())
    return out


def scalar(text: str) -> Any:
    """A value's plain form for the results table: int, float, bool, null or the text."""
    t = text.strip()
    for conv in (int, float):
        try:
            return conv(t)
        except ValueError:
            pass
    low = t.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "~", ""):
        return None
    if len(t) >= 2 and t[0] == t[-1] and t[0] in "\"'":
        return t[1:-1]
    return t


def parse_vary(text: str) -> tuple[str, list[str]]:
    """'key.path=v1,v2' -> ('key.path', ['v1', 'v2'])."""
    from emulator.scenario.assignments import split_assignment

    split = split_assignment(text)
    if split is None:
        raise SweepError(f'--vary {text}: expected key.path=v1,v2,..., e.g. "parallel.tp=1,2,4"')
    key, values = split
    key = key.strip()
    items = split_values(values)
    if not key or any(not v for v in items):
        raise SweepError(f"--vary {text}: expected key.path=v1,v2,... with no empty value")
    return key, items


def expand(varies: Sequence[tuple[str, list[str]]], zipped: bool = False) -> list[dict[str, str]]:
    """The points: {key: value text} per combination (grid) or per position (zip)."""
    keys = [k for k, _ in varies]
    dup = {k for k in keys if keys.count(k) > 1}
    if dup:
        raise SweepError(f"--vary {sorted(dup)[0]} is given twice; put all its values in one --vary")
    if zipped:
        lengths = {len(v) for _, v in varies}
        if len(lengths) > 1:
            detail = ", ".join(f"{k} has {len(v)}" for k, v in varies)
            raise SweepError(f"--zip needs lists of the same length ({detail})")
        combos: list[tuple[str, ...]] = list(zip(*(v for _, v in varies)))
    else:
        combos = list(itertools.product(*(v for _, v in varies)))
    if len(combos) > MAX_POINTS:
        raise SweepError(f"the sweep has {len(combos)} points, more than {MAX_POINTS}; split it")
    return [dict(zip(keys, c)) for c in combos] if varies else [{}]


# ------------------------------------------------------------------ points


@dataclass(frozen=True)
class Point:
    """One configuration of a study."""

    index: int
    overrides: tuple[str, ...]  # the --set strings that make it from the base scenario
    varied: dict = field(hash=False)  # key.path -> value, for tables and plots
    scenario: Scenario = field(hash=False)
    key: str = ""


def load_point(path: str, base: Sequence[str], values: dict[str, str], index: int, total: int,
               varied: dict | None = None) -> Point:
    """Load and validate one point; a bad one raises SweepError naming it."""
    from emulator.scenario.checks import require_workload
    from emulator.scenario.reader import load_scenario

    overrides = tuple(f"{k}={v}" for k, v in values.items())
    try:
        sc = load_scenario(path, [*base, *overrides])
        require_workload(sc)
    except EmulatorError as exc:
        which = ", ".join(overrides) or "the base scenario"
        raise SweepError(f"point {index + 1} of {total} ({which}): {exc}") from None
    shown = varied if varied is not None else {k: scalar(v) for k, v in values.items()}
    return Point(index, overrides, shown, sc, scenario_key(sc))


def build_points(path: str, base: Sequence[str], combos: Sequence[dict[str, str]],
                 skip_invalid: bool = False) -> tuple[list[Point], list[str]]:
    """Every point loaded; with ``skip_invalid`` bad points are listed instead of fatal."""
    points, invalid = [], []
    for i, values in enumerate(combos):
        try:
            points.append(load_point(path, base, values, i, len(combos)))
        except SweepError as exc:
            if not skip_invalid:
                raise
            invalid.append(str(exc))
    return points, invalid


# ------------------------------------------------------------------ running


def evaluate(scenario: Scenario) -> dict:
    """Worker side: {"summary": ...} or {"error": message} for a user-caused failure."""
    from emulator.outputs.summary import summarize
    from emulator.run.simulation import simulate

    try:
        return {"summary": summarize(simulate(scenario, record_links=False))}
    except EmulatorError as exc:
        return {"error": str(exc)}


@dataclass
class RunStats:
    points: int  # points in the study
    distinct: int  # distinct configurations (keys)
    skipped: int  # already in the store, from this emulator
    ran: int = 0
    stale: int = 0  # in the store from another emulator (see emulator.fingerprint): run again
    errors: int = 0
    wall_s: float = 0.0


def run_points(points: Sequence[Point], store: ResultStore, executor: Executor,
               progress: tqdm[Any] | None = None, retry_errors: bool = False) -> RunStats:
    """Run the points not yet in ``store``; commit each as it finishes."""
    t0 = time.perf_counter()
    unique: dict[str, Point] = {}
    for p in points:
        unique.setdefault(p.key, p)
    if retry_errors:
        store.delete_errors(unique)
    done = store.done_keys(unique)
    todo = [p for k, p in unique.items() if k not in done]
    stats = RunStats(len(points), len(unique), len(done), stale=len(store.stale_keys(unique)))
    if progress is not None:
        progress.reset(total=len(todo))
    for i, outcome in executor.run(evaluate, [p.scenario for p in todo]):
        p = todo[i]
        store.record(make_row(p.key, p.scenario, p.varied, outcome.get("summary"), outcome.get("error")))
        stats.ran += 1
        stats.errors += "error" in outcome
        if progress is not None:
            progress.update(1)
    if progress is not None:
        progress.close()
    stats.wall_s = time.perf_counter() - t0
    return stats


def make_executor(jobs: int, dask: str | None) -> Executor:
    return DaskExecutor(dask) if dask else LocalExecutor(jobs)


def close_executor(executor: Executor) -> None:
    close = getattr(executor, "close", None)
    if close is not None:
        close()


# ------------------------------------------------------------------ report


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def table(rows: Sequence[Any], limit: int = 40) -> str:
    """An aligned table of study rows: the varied values, then the headline metrics."""
    from emulator.scenario.units import format_bytes, format_time

    varied: list[str] = []
    for r in rows:
        varied += [k for k in r.varied if k not in varied]
    head = [*varied, "iteration", "tokens/s", "MFU", "mem/GPU", "status"]
    lines = []
    for r in rows[:limit]:
        s = r.summary or {}
        mem = s.get("memory") or {}
        peak = mem.get("peak_bytes_per_gpu")
        cells = [_fmt(r.varied.get(k)) for k in varied]
        if r.status == "ok":
            cells += [format_time(s["iteration_time_s"]), f"{s['tokens_per_s']:,.0f}" if s["tokens_per_s"] else "-",
                      "-" if s.get("mfu") is None else f"{s['mfu']:.1%}",
                      "-" if peak is None else format_bytes(peak) + ("" if mem.get("fits") else " (OOM)"), "ok"]
        else:
            cells += ["-", "-", "-", "-", "error: " + (r.error or "")[:120]]
        lines.append(cells)
    widths = [max(len(h), *(len(c[i]) for c in lines)) if lines else len(h) for i, h in enumerate(head)]
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths))]
    out += ["  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip() for cells in lines]
    if len(rows) > limit:
        out.append(f"... {len(rows) - limit} more rows (see --csv)")
    return "\n".join(out)


def stats_line(stats: RunStats, db: str) -> str:
    dup = f" ({stats.distinct} distinct)" if stats.distinct != stats.points else ""
    stale = f"; {stats.stale} were from another emulator version and ran again" if stats.stale else ""
    return (f"{stats.points} points{dup}: {stats.skipped} already in {db}, ran {stats.ran} "
            f"({stats.errors} errors) in {stats.wall_s:.1f} s{stale}")


# ------------------------------------------------------------------ command line


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", nargs="?", help="scenario YAML file (not needed with --export-csv)")
    p.add_argument("--vary", action="append", default=[], metavar="KEY.PATH=V1,V2,...",
                   help="values of one scenario field (YAML scalars); several --vary make a grid")
    p.add_argument("--zip", action="store_true", help="pair the i-th values of every --vary instead of a grid")
    p.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a scenario field in every point")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (default 1: in this process)")
    p.add_argument("--db", default="results.sqlite", help="results database (default results.sqlite)")
    p.add_argument("--csv", metavar="FILE", help="also write this sweep's rows as CSV")
    p.add_argument("--export-csv", metavar="FILE", help="write every row of --db as CSV and run nothing")
    p.add_argument("--dask", metavar="tcp://HOST:8786", help="run the points on a Dask cluster")
    p.add_argument("--retry-errors", action="store_true", help="run again the points stored as errors")
    p.add_argument("--skip-invalid", action="store_true",
                   help="leave out points that do not load (e.g. tp*pp not dividing the GPUs) instead of stopping")


def sweep_command(args: argparse.Namespace) -> str:
    if args.export_csv:
        with ResultStore(args.db, create=False) as store:
            rows = store.rows()
        export_csv(rows, args.export_csv)
        return f"exported {len(rows)} rows of {args.db} to {args.export_csv}"
    if not args.scenario:
        raise SweepError("sweep needs a SCENARIO (or --db FILE --export-csv OUT.csv)")
    combos = expand([parse_vary(v) for v in args.vary], args.zip)
    points, invalid = build_points(args.scenario, args.set, combos, args.skip_invalid)
    executor = make_executor(args.jobs, args.dask)
    try:
        with ResultStore(args.db) as store:
            stats = run_points(points, store, executor, points_bar(len(points), "sweep"), args.retry_errors)
            rows = store.rows([p.key for p in points])
    finally:
        close_executor(executor)
    if args.csv:
        export_csv(rows, args.csv)
    lines = [table(rows), stats_line(stats, args.db)]
    if invalid:
        lines.append(f"{len(invalid)} invalid points left out, e.g. {invalid[0]}")
    if args.csv:
        lines.append(f"rows written to {args.csv}")
    return "\n".join(lines)
