"""``emulator report SCENARIO_OR_RUN [--out FILE.html]``: one self-contained HTML page of a run.

A scenario file is run first (as ``emulator run --out`` would, into a temporary folder that is
removed afterwards); a run folder (``emulator run --out DIR``) is read as it is. Either way the
page is made from the folder's files (tools/run_folder.py), so the report of a scenario and the
report of its saved run show the same numbers: summary.json's.

What comes from where:
- the summary, the breakdown's four parts and the busiest links' table: summary.json;
- the exposed communication per kind: the spans of trace.json (outputs/exposure.py), as shares
  of the summary's ``exposed_comm``;
- the Gantt chart: gantt.png;
- memory per pipeline stage and the topology under the link heatmap: the scenario as run
  (scenario.yaml), read again (workload memory; the network builder); the links' loads are the
  counter tracks of trace.json (the busiest ``TOP_LINKS`` links by volume).

It prints the path it wrote. The page is written atomically (outputs/atomic.py).
"""
from __future__ import annotations

import argparse
import os
import tempfile
from typing import Any, Sequence

from emulator.errors import EmulatorError
from emulator.outputs.exposure import exposure_by_lane
from emulator.outputs.html import Report, breakdown_parts, report_html
from emulator.tools.run_folder import RunFolder, read_run

SCENARIO_FILE = "# scenario file: "


def is_run_folder(source: str) -> bool:
    return os.path.isdir(source)


def default_out(source: str) -> str:
    """``DIR/report.html`` for a run folder, ``NAME-report.html`` here for a scenario file."""
    if is_run_folder(source):
        return os.path.join(source, "report.html")
    return os.path.splitext(os.path.basename(source))[0] + "-report.html"


def save_run(path: str, overrides: list[str], folder: str, gantt: bool = True) -> dict[str, Any]:
    """Run the scenario at ``path`` and write its files into ``folder`` as ``emulator run --out``
    does (with scenario.yaml, the scenario as run); return the summary."""
    from emulator.outputs.progress import RunProgress
    from emulator.outputs.run_files import write_outputs
    from emulator.outputs.summary import summarize
    from emulator.run.simulation import simulate
    from emulator.scenario.checks import require_workload
    from emulator.scenario.reader import load_scenario

    sc = load_scenario(path, overrides)
    require_workload(sc)
    progress = RunProgress()
    try:
        result = simulate(sc, progress=progress, record_links=True)
    finally:
        progress.close()
    summary = summarize(result)
    as_run = as_run_header(path) + scenario_text(path, overrides)
    write_outputs(result, summary, folder, gantt=gantt, scenario_yaml=as_run)
    return summary


def as_run_header(path: str) -> str:
    """The first lines of a run's scenario.yaml: the emulator that ran it, and the file it came from."""
    from emulator.fingerprint import version

    return f"# run by {version()}\n{SCENARIO_FILE}{os.path.abspath(path)}\n"


def scenario_text(path: str, overrides: Sequence[str] = ()) -> str:
    """The scenario as run, as YAML text: the file as written when nothing overrides it; else its
    tree with the ``--set`` overrides applied (anchors expanded, comments dropped), under a comment
    that names the file and the overrides. Reads what ``load_scenario`` read: call it after."""
    import yaml

    from emulator.outputs.printable import printable
    from emulator.scenario.assignments import apply_assignments
    from emulator.scenario.yamltree import MAX_FILE_BYTES, decode, parse_tree

    with open(path, "rb") as f:
        text = decode(f.read(MAX_FILE_BYTES + 1), path)
    if not overrides:
        return text
    tree = apply_assignments(parse_tree(text, path), overrides)
    head = "".join(f"#   --set {printable(str(o))}\n" for o in overrides)
    body = yaml.safe_dump(_plain(tree), sort_keys=False, allow_unicode=True, width=100) if tree else ""
    return f"# {printable(path)}, as run with\n{head}{body}"


def _plain(v: Any) -> Any:
    """A YamlValue tree as plain Python (dicts, lists and the scalars YAML reads)."""
    from emulator.scenario.yamltree import python_value

    if v.mapping is not None:
        return {k: _plain(x) for k, x in v.mapping.items()}
    if v.items is not None:
        return [_plain(x) for x in v.items]
    return python_value(v)


def _scenario(run: RunFolder) -> tuple[Any, str]:
    """The run's scenario, read again from scenario.yaml (relative paths anchored at the file it
    came from, where that still exists); (None, why) where it cannot be."""
    from emulator.scenario.reader import load_scenario_text

    text = run.scenario_yaml
    if text is None:
        return None, "the run folder has no scenario.yaml"
    anchor = os.path.join(run.path, "scenario.yaml")
    for line in text.splitlines()[:3]:
        if line.startswith(SCENARIO_FILE) and os.path.isfile(line[len(SCENARIO_FILE):]):
            anchor = line[len(SCENARIO_FILE):]
    try:
        return load_scenario_text(text, anchor), ""
    except EmulatorError as exc:
        return None, f"scenario.yaml could not be read again ({exc})"


def _memory(sc: Any) -> tuple[list[dict[str, Any]], str]:
    if sc is None:
        return [], ""
    if sc.model is None or sc.workload.trace or sc.cluster.node is None:
        return [], "a trace, or several jobs: memory per stage is modelled for one job of a model"
    from emulator.workload.memory import stage_memory

    return [{"stage": m.stage, "peak_bytes": m.peak_bytes_per_gpu, "parts": dict(m.breakdown),
             "capacity": m.capacity_bytes} for m in stage_memory(sc)], ""


def _links(sc: Any, run: RunFolder, summary: dict[str, Any]) -> tuple[bytes | None, str]:
    """The topology heatmap, from the scenario's network and the loads trace.json recorded."""
    if sc is None:
        return None, "no scenario to draw the topology of"
    if not run.link_bytes:
        return None, "no link carried traffic in this run (trace.json has no link loads)"
    from emulator.network.topology import build_topology
    from emulator.outputs.report_figures import topology_png

    topo = build_topology(sc.cluster)
    period = summary["iteration_time_s"] * max(1, sc.simulation.iterations)
    util = {}
    for i, (u, v) in enumerate(topo.links):
        carried = run.link_bytes.get(f"{u}->{v}")
        if carried is not None and period > 0 and topo.capacity[i] > 0:
            util[f"{u}->{v}"] = carried / (period * topo.capacity[i])
    nodes = {name: str(data.get("kind", "switch")) for name, data in topo.node_items()}
    title = f"{summary['scenario']}: link utilisation over the iteration (the {len(util)} busiest links recorded)"
    return topology_png(nodes, topo.links, util, title), ""


def exposed_shares(run: RunFolder) -> dict[str, float]:
    """The summary's exposed communication split by lane in the shares the spans give."""
    lanes = exposure_by_lane(run.spans)
    total = sum(lanes.values())
    exposed = run.summary["breakdown_s"]["exposed_comm"]
    return {k: exposed * v / total for k, v in lanes.items()} if total > 0 else {}


def build_report(run: RunFolder, source: str) -> Report:
    """The report page's contents for a run folder."""
    from emulator.fingerprint import version
    from emulator.outputs.report_figures import breakdown_png, memory_png

    s = run.summary
    images: dict[str, bytes] = {}
    absent: dict[str, str] = {}
    exposed = exposed_shares(run)
    images["breakdown"] = breakdown_png([(str(s["scenario"]), breakdown_parts(s, exposed))])
    if run.gantt_png:
        images["gantt"] = run.gantt_png
    else:
        absent["gantt"] = "the run folder has no gantt.png (run without --no-gantt)"
    sc, why = _scenario(run)
    stages, why_mem = _memory(sc)
    if stages:
        images["memory"] = memory_png([st["parts"] for st in stages], stages[0]["capacity"],
                                      f"{s['scenario']}: one GPU of each pipeline stage")
    else:
        absent["memory"] = why_mem or why
    png, why_links = _links(sc, run, s)
    if png is not None:
        images["links"] = png
    else:
        absent["links"] = why_links
    return Report(source=source, summary=s, exposed=exposed, images=images, absent=absent, memory_stages=stages,
                  scenario_yaml=run.scenario_yaml, version=version())


def report(source: str, out: str, overrides: list[str] | None = None) -> str:
    """Write the report of ``source`` (a scenario file or a run folder) to ``out``; return ``out``."""
    from emulator.outputs.atomic import write_text

    if not os.path.exists(source):
        raise EmulatorError(f"{source}: no such file or folder (a scenario file, or a folder of emulator run --out)")
    if is_run_folder(source):
        if overrides:
            raise EmulatorError(f"--set {overrides[0]}: a run folder is reported as it ran; --set needs a scenario")
        page = report_html(build_report(read_run(source), source))
    else:
        with tempfile.TemporaryDirectory(prefix="emulator-report-") as folder:
            save_run(source, list(overrides or []), folder)
            page = report_html(build_report(read_run(folder), source))
    write_text(out, page)
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", metavar="SCENARIO_OR_RUN",
                   help="a scenario YAML file (run first) or a run folder (emulator run --out DIR)")
    p.add_argument("--out", metavar="FILE.html",
                   help="where to write the page (default: DIR/report.html for a run folder, "
                        "NAME-report.html here for a scenario)")
    p.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help="override a scenario field")


def report_command(args: argparse.Namespace) -> str:
    return report(args.source, args.out or default_out(args.source), args.set or [])
