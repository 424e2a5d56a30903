"""``emulator compare A B [C …] [--set K=V …] … [--out FILE.html] [--json]``: runs side by side.

Each of A, B, … is a scenario file (run here) or a run folder (``emulator run --out DIR``: its
summary.json is read). Each ``--set`` option is one *variant*: the assignments after it
(``--set cluster.fabric.kind=rail cluster.fabric.oversubscription=2``) apply together, and
every scenario file given runs once per variant; a bare ``--set`` is the scenario as written.
So "the same job on two fabrics" is one line::

    emulator compare job.yaml --set cluster.fabric.kind=fat_tree --set cluster.fabric.kind=rail

Run folders are shown as they ran (a variant does not apply to them). The first run is the
reference of the differences and ratios (outputs/comparison.py).
"""
from __future__ import annotations

import argparse
import json
import os
from typing import Any, Sequence

from emulator.errors import EmulatorError


def columns(items: Sequence[str], variants: Sequence[Sequence[str]]) -> list[tuple[str, str, list[str]]]:
    """(label, source, overrides) of every run to compare, in order: each item, and each scenario
    file once per variant."""
    out: list[tuple[str, str, list[str]]] = []
    for item in items:
        if os.path.isdir(item) or not variants:
            out.append((item, item, []))
            continue
        for sets in variants:
            label = f"{item} --set {' '.join(sets)}" if sets else f"{item} (as written)"
            out.append((label, item, list(sets)))
    return out


def _check_variants(variants: Sequence[Sequence[str]]) -> None:
    for sets in variants:
        for s in sets:
            if "=" not in s:
                raise EmulatorError(f"--set {s}: expected KEY.PATH=VALUE (list the runs before the first --set)")


def summary_of(source: str, overrides: list[str]) -> dict[str, Any]:
    """The summary of a run folder, or of a scenario file run here with ``overrides``."""
    if os.path.isdir(source):
        from emulator.tools.run_folder import read_summary

        return read_summary(source)
    from emulator.outputs.progress import RunProgress
    from emulator.outputs.summary import summarize
    from emulator.run.simulation import simulate
    from emulator.scenario.checks import require_workload
    from emulator.scenario.reader import load_scenario

    sc = load_scenario(source, overrides)
    require_workload(sc)
    progress = RunProgress()
    try:
        result = simulate(sc, progress=progress)
    finally:
        progress.close()
    return summarize(result)


def compare(items: Sequence[str], variants: Sequence[Sequence[str]], out: str | None = None,
            as_json: bool = False) -> str:
    """The comparison's text (or JSON); with ``out``, the HTML page written there too."""
    from emulator.outputs.comparison import comparison_html, comparison_rows, comparison_text, letter

    _check_variants(variants)
    cols = columns(items, variants)
    if len(cols) < 2:
        raise EmulatorError("compare needs two runs or more: two scenarios or run folders, or one scenario "
                            "with two --set variants")
    labels = [c[0] for c in cols]
    summaries = [summary_of(source, sets) for _label, source, sets in cols]
    if out:
        from emulator.fingerprint import version
        from emulator.outputs.atomic import write_text
        from emulator.outputs.html import breakdown_parts
        from emulator.outputs.report_figures import breakdown_png

        png = breakdown_png([(letter(i), breakdown_parts(s, {})) for i, s in enumerate(summaries)])
        write_text(out, comparison_html(labels, summaries, png, version()))
    if as_json:
        runs = [{"label": label, "source": source, "set": sets, "scenario": s.get("scenario")}
                for (label, source, sets), s in zip(cols, summaries)]
        return json.dumps({"runs": runs, "rows": comparison_rows(summaries)}, indent=2)
    text = comparison_text(labels, summaries)
    return text + (f"\n\ncomparison written to {out}" if out else "")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("items", nargs="+", metavar="SCENARIO_OR_RUN",
                   help="scenario YAML files (run here) or run folders (emulator run --out DIR)")
    p.add_argument("--set", action="append", nargs="*", metavar="KEY.PATH=VALUE", default=[],
                   help="one variant: these overrides together; repeat for more variants; every scenario runs "
                        "once per variant (a bare --set: as written)")
    p.add_argument("--out", metavar="FILE.html", help="also write the comparison as an HTML page")
    p.add_argument("--json", action="store_true", help="print the runs and rows as one JSON object")


def compare_command(args: argparse.Namespace) -> str | tuple[str, int]:
    text = compare(args.items, args.set, args.out, args.json)
    return (text, 0) if args.json else text
