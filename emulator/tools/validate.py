"""Validation: the emulator's predictions against a user's own measurements (``emulator validate``).

A cases file is a CSV with one measurement a row::

    case,group,scenario,set,metric,measured,source
    dlrm-r1,dlrm 8xV100,../../scenarios/replay-dlrm-8xv100.yaml,,replay.1.emulated_span_s,18.467 ms,...

- ``scenario`` is read relative to the CSV's folder; ``set`` holds ``--set`` overrides,
  separated by ``;`` (``parallel.tp=4;training.micro_batch=2``).
- ``metric`` is a key of ``summary.json`` (``iteration_time_s``, ``tokens_per_s``,
  ``model_tflops_per_gpu``, ...), a dotted path into it (``replay.1.emulated_span_s``), or
  one of :data:`SPAN_METRICS`, read from rank 0's spans: the time of layer 0's forward or
  backward pass (recompute included), as a per-layer profile reports it.
- ``measured`` is a number, with a unit where the metric has one (``7.7 ms``; a bare
  number is SI: seconds, tokens/s, TFLOP/s per GPU as the summary writes it).
- ``group`` (optional) pools rows for the mean absolute percentage error (MAPE);
  ``source`` (optional) says where the measurement comes from.

Each distinct (scenario, set) is simulated once, however many rows read it. The pure
part (parsing, errors, MAPE) is kept apart from the runs so that it can be tested alone.
"""
from __future__ import annotations

import argparse
import csv
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from emulator.errors import EmulatorError
from emulator.scenario.units import parse_time

REQUIRED = ("case", "scenario", "metric", "measured")
OPTIONAL = ("group", "set", "source")
SPAN_METRICS = ("layer_forward_s", "layer_backward_s")


class ValidationError(EmulatorError):
    """A cases file that cannot be read as the format above."""


@dataclass(frozen=True)
class Case:
    """One measured value to predict."""

    line: int
    case: str
    group: str
    scenario: str  # a path, already resolved against the CSV's folder
    overrides: tuple[str, ...]
    metric: str
    measured: float
    source: str


@dataclass(frozen=True)
class Outcome:
    """A case with its prediction; ``error`` is predicted/measured − 1."""

    case: Case
    predicted: float

    @property
    def error(self) -> float:
        return self.predicted / self.case.measured - 1.0


def read_cases(path: str) -> list[Case]:
    """The rows of ``path``; any malformed row is a :class:`ValidationError` naming file, line and column."""
    try:
        # utf-8-sig: a CSV saved by Excel starts with a byte-order mark, which would stick to "case"
        with open(path, newline="", encoding="utf-8-sig") as fh:
            rows = list(csv.reader(fh))
    except OSError as exc:
        raise ValidationError(f"{path}: cannot read the cases file: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ValidationError(f"{path}: not a CSV text file: {exc}") from None
    if not rows:
        raise ValidationError(f"{path}: empty; expected a header line with columns {', '.join(REQUIRED)}")
    header = [h.strip() for h in rows[0]]
    missing = [c for c in REQUIRED if c not in header]
    unknown = [h for h in header if h and h not in REQUIRED + OPTIONAL]  # a blank one (a trailing comma) is empty
    if missing or unknown:
        what = "; ".join(([f"missing column(s) {', '.join(missing)}"] if missing else [])
                         + ([f"unknown column(s) {', '.join(map(repr, unknown))}"] if unknown else []))
        raise ValidationError(f"{path}:1: {what}; "
                              f"expected {', '.join(REQUIRED)} and optionally {', '.join(OPTIONAL)}")
    folder = os.path.dirname(os.path.abspath(path))
    cases = [_case(path, n, dict(zip(header, row)), folder, len(header), row)
             for n, row in enumerate(rows[1:], start=2) if any(c.strip() for c in row)]
    if not cases:
        raise ValidationError(f"{path}: no cases below the header")
    return cases


def _case(path: str, line: int, row: dict[str, str], folder: str, width: int, raw: list[str]) -> Case:
    where = f"{path}:{line}"
    if len(raw) != width:
        raise ValidationError(f"{where}: {len(raw)} fields, the header has {width}")
    values = {k: (row.get(k) or "").strip() for k in REQUIRED + OPTIONAL}
    for col in REQUIRED:
        if not values[col]:
            raise ValidationError(f"{where}: column '{col}' is empty")
    metric = values["metric"]
    measured = _measured(where, metric, values["measured"])
    overrides = tuple(s.strip() for s in values["set"].split(";") if s.strip())
    for o in overrides:
        if "=" not in o:
            raise ValidationError(f"{where}: column 'set': expected KEY.PATH=VALUE, got {o!r}")
    return Case(line=line, case=values["case"], group=values["group"] or "all",
                scenario=os.path.join(folder, values["scenario"]), overrides=overrides,
                metric=metric, measured=measured, source=values["source"])


def _measured(where: str, metric: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        if not is_time(metric):
            raise ValidationError(f"{where}: column 'measured': expected a positive number, got {text!r}") from None
        try:
            value = parse_time(text)
        except EmulatorError:
            raise ValidationError(f"{where}: column 'measured': expected a positive time "
                                  f"(a number of seconds, or e.g. '7.7 ms'), got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise ValidationError(f"{where}: column 'measured': expected a positive number, got {text!r}")
    return value


def is_time(metric: str) -> bool:
    """Metrics in seconds end in ``_s`` (``iteration_time_s``); rates end in ``_per_s``."""
    return metric.endswith("_s") and not metric.endswith("_per_s")


def summary_value(summary: dict[str, Any], path: str) -> float | None:
    """The number at dotted ``path`` of a summary (list items by index), or None if there is none."""
    node: Any = summary
    for part in path.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return float(node) if isinstance(node, (int, float)) and not isinstance(node, bool) else None


def layer_time(spans: Sequence[Any], phase: str) -> float | None:
    """Rank 0's time of layer 0's ``phase`` ("fwd" or "bwd") on the GPU: first start to last end, any stream but
    the host's (``cpu``: its issuing, workload/host.py)."""
    mine = [s for s in spans if s.rank == 0 and s.layer == 0 and f".layer0.{phase}." in s.name and s.stream != "cpu"]
    if not mine:
        return None
    return max(s.end_s for s in mine) - min(s.start_s for s in mine)


def mape(outcomes: Sequence[Outcome]) -> dict[str, float]:
    """Mean absolute percentage error per group, in percent, groups in first-seen order."""
    groups: dict[str, list[float]] = {}
    for o in outcomes:
        groups.setdefault(o.case.group, []).append(abs(o.error) * 100.0)
    return {g: sum(v) / len(v) for g, v in groups.items()}


Runner = Callable[[str, tuple[str, ...]], tuple[dict[str, Any], Sequence[Any]]]


def predict(cases: Sequence[Case], run: Runner) -> list[Outcome]:
    """Each case's predicted value; ``run(scenario, overrides)`` gives (summary, spans) once per pair."""
    cache: dict[tuple[str, tuple[str, ...]], tuple[dict[str, Any], Sequence[Any]]] = {}
    out = []
    for c in cases:
        key = (c.scenario, c.overrides)
        if key not in cache:
            cache[key] = run(*key)
        summary, spans = cache[key]
        out.append(Outcome(c, _metric(c, summary, spans)))
    return out


def _metric(c: Case, summary: dict[str, Any], spans: Sequence[Any]) -> float:
    if c.metric in SPAN_METRICS:
        value = layer_time(spans, "fwd" if c.metric == "layer_forward_s" else "bwd")
        need = "a model workload (layer 0 on rank 0)"
    else:
        value = summary_value(summary, c.metric)
        need = "a number at that key of summary.json"
    if value is None:
        raise ValidationError(f"case {c.case!r} (line {c.line}): metric {c.metric!r}: the run has no such value; "
                              f"expected {need}, or one of {', '.join(SPAN_METRICS)}")
    return value


def simulate_case(scenario: str, overrides: tuple[str, ...]) -> tuple[dict[str, Any], Sequence[Any]]:
    """The default runner: load, simulate, summarise."""
    from emulator.outputs.summary import summarize
    from emulator.run.simulation import simulate
    from emulator.scenario.checks import require_workload
    from emulator.scenario.reader import load_scenario

    sc = load_scenario(scenario, overrides)
    require_workload(sc)
    result = simulate(sc, record_links=False)
    return summarize(result), result.spans


def table(outcomes: Sequence[Outcome]) -> str:
    """Predicted against measured, a row a case, then the MAPE per group."""
    lines = [f"{'case':<28} {'metric':<26} {'measured':>12} {'predicted':>12} {'error':>8}"]
    for o in outcomes:
        lines.append(f"{o.case.case[:28]:<28} {o.case.metric[:26]:<26} {o.case.measured:12.6g} "
                     f"{o.predicted:12.6g} {o.error * 100:+7.2f}%")
    lines.append("")
    lines.append(f"{'group':<40} {'cases':>5} {'MAPE':>8}")
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.case.group] = counts.get(o.case.group, 0) + 1
    groups = mape(outcomes)
    for g, m in groups.items():
        if list(groups) != ["all"]:  # ungrouped cases pool in "all": the total row below says it once
            lines.append(f"{g[:40]:<40} {counts[g]:>5} {m:7.2f}%")
    every = sum(abs(o.error) for o in outcomes) / len(outcomes) * 100.0
    lines.append(f"{'all':<40} {len(outcomes):>5} {every:7.2f}%")
    return "\n".join(lines)


def results_csv(outcomes: Sequence[Outcome]) -> str:
    """The cases with their predictions, as CSV text (one row a case)."""
    rows = ["case,group,metric,measured,predicted,error"]
    for o in outcomes:
        rows.append(",".join([_cell(o.case.case), _cell(o.case.group), _cell(o.case.metric),
                              repr(o.case.measured), repr(o.predicted), repr(o.error)]))
    return "\n".join(rows) + "\n"


def _cell(text: str) -> str:
    return '"' + text.replace('"', '""') + '"' if any(ch in text for ch in ',"\n') else text


def chart(outcomes: Sequence[Outcome], path: str) -> list[str]:
    """A bar chart of each case's error (percent), coloured by group, saved as PNG and SVG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from emulator.outputs.figures import save_figure

    groups = list(mape(outcomes))
    colours = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(outcomes) + 2.0), 4.0))
    for i, o in enumerate(outcomes):
        ax.bar(i, o.error * 100.0, color=colours(groups.index(o.case.group) % 10))
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(outcomes)), [o.case.case for o in outcomes], rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("predicted / measured − 1 (%)")
    per_group = mape(outcomes)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours(i % 10)) for i in range(len(groups))]
    ax.legend(handles, [f"{g}: MAPE {per_group[g]:.2f}%" for g in groups], fontsize=7,
              loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("emulator validate: error per case")
    fig.tight_layout()
    written = save_figure(fig, path)
    plt.close(fig)
    return written


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("cases", help="CSV of measurements: case, scenario, metric, measured [, group, set, source]")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="write validation.csv and validation.png (+ .svg) here")
    parser.add_argument("--max-error", type=float, default=None, metavar="PERCENT",
                        help="exit 1 if any group's MAPE is above PERCENT")


def validate_command(args: argparse.Namespace) -> tuple[str, int]:
    """Read, predict, report; the exit code is 1 when a group's MAPE exceeds ``--max-error``."""
    from emulator.outputs.atomic import write_text

    if args.max_error is not None and not (math.isfinite(args.max_error) and args.max_error >= 0):
        raise ValidationError(f"--max-error: expected a percentage ≥ 0, got {args.max_error}")
    if args.out and os.path.exists(args.out) and not os.path.isdir(args.out):
        raise ValidationError(f"--out {args.out}: exists and is not a folder")
    outcomes = predict(read_cases(args.cases), simulate_case)
    text = table(outcomes)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        write_text(os.path.join(args.out, "validation.csv"), results_csv(outcomes))
        chart(outcomes, os.path.join(args.out, "validation.png"))
        text += f"\noutputs in {args.out}/: validation.csv validation.png validation.svg"
    over = {g: m for g, m in mape(outcomes).items() if args.max_error is not None and m > args.max_error}
    if over:
        text += "\n" + "; ".join(f"group {g!r}: MAPE {m:.2f}% > --max-error {args.max_error:g}%"
                                 for g, m in over.items())
    return text, 1 if over else 0
