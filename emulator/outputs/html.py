"""report.html: one self-contained page of a run, to open in any browser and to share.

The page is built from plain data (the summary dict, the exposed communication per lane, PNG
bytes, memory per stage, the scenario's text), never from a live run. Sections: the summary; the
step-time breakdown as a stacked bar (compute, exposed communication per kind, bubble, other);
the Gantt chart; memory per pipeline stage against the GPU's capacity; the busiest links, as a
heatmap over the topology and a table; faults, notes and warnings; the scenario as run and the
emulator's version.

- **Self-contained**: every picture is a PNG in a ``data:`` URI, the style sheet is inline, and
  there is no script: the file can be mailed, attached or opened offline.
- **Escaped**: every text from the user (scenario names, node names, notes, the YAML) goes
  through :func:`esc`: control and invisible characters made visible (printable.py), then
  ``& < > " '`` escaped, so no name can open a tag or an attribute.
- **Checkable**: each number taken from summary.json sits in an element with
  ``data-key="a.b"`` (its key path in the summary) and ``data-value`` (the JSON of the value), so a
  test, or a script, can check the page against the file.
"""
from __future__ import annotations

import base64
import html
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from emulator.outputs.printable import printable
from emulator.scenario.units import format_bytes, format_time

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2em auto;max-width:1180px;
padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em}h2{font-size:1.2em;border-bottom:1px solid #ddd;padding-bottom:.2em;
margin-top:1.8em}
.sub{color:#666;margin-top:0}
table{border-collapse:collapse;margin:.6em 0}
th,td{padding:.25em .8em;border-bottom:1px solid #eee;text-align:left;vertical-align:top}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
img{max-width:100%;height:auto;border:1px solid #eee}
pre{background:#f6f8fa;padding:1em;overflow-x:auto;font-size:.9em}
.bad{color:#B00020;font-weight:600}.good{color:#1B7F3B;font-weight:600}
.cards{display:flex;flex-wrap:wrap;gap:.8em;margin:1em 0}
.card{border:1px solid #ddd;border-radius:6px;padding:.6em 1em;min-width:10em}
.card .v{font-size:1.4em;font-weight:600}.card .k{color:#666;font-size:.85em}
ul.notes li{margin:.2em 0}
.swatch{display:inline-block;width:.8em;height:.8em;margin-right:.4em;vertical-align:middle}
"""


def esc(text: Any) -> str:
    """User text made safe inside HTML: controls made visible, then ``& < > " '`` escaped."""
    return html.escape(printable(str(text)), quote=True)


def img(png: bytes, alt: str) -> str:
    """An <img> holding ``png`` itself (a data URI)."""
    return f'<img src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}" alt="{esc(alt)}">'


def page(title: str, body: str) -> str:
    """A whole HTML5 document."""
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{esc(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n")


def cell(key: str, value: Any, text: str, cls: str = "num") -> str:
    """A table cell showing ``text`` for the summary's ``key`` (its value kept in data-value)."""
    return (f'<td class="{cls}" data-key="{esc(key)}" data-value="{esc(json.dumps(value))}">{esc(text)}</td>')


def table(head: Sequence[str], rows: Sequence[str], num_from: int = 1) -> str:
    """A table: ``head`` cells (the first ``num_from`` left-aligned), ``rows`` already made of <td>s."""
    ths = "".join(f'<th{" class=num" if i >= num_from else ""}>{esc(h)}</th>' for i, h in enumerate(head))
    return "<table>\n<thead><tr>" + ths + "</tr></thead>\n<tbody>\n" + \
        "\n".join(f"<tr>{r}</tr>" for r in rows) + "\n</tbody>\n</table>"


@dataclass(frozen=True)
class Report:
    """What a report page shows; ``images`` maps a section (breakdown, gantt, memory, links) to a
    PNG; ``absent`` says, per section, why it has no picture."""

    source: str  # what was reported: a scenario file or a run folder
    summary: Mapping[str, Any]
    exposed: Mapping[str, float] = field(default_factory=dict)  # lane → seconds per iteration
    images: Mapping[str, bytes] = field(default_factory=dict)
    absent: Mapping[str, str] = field(default_factory=dict)
    memory_stages: Sequence[Mapping[str, Any]] = ()  # {"stage", "peak_bytes", "parts": {part: bytes}}
    scenario_yaml: str | None = None
    version: str = ""  # the emulator that wrote the page


def fmt_pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.1%}"


def _cards(s: Mapping[str, Any]) -> str:
    """The headline figures, large."""
    items: list[tuple[str, str, Callable[[Any], str]]] = [
        ("iteration_time_s", "step time", format_time), ("tokens_per_s", "tokens/s", _count),
             ("mfu", "MFU", fmt_pct), ("gpus", "GPUs", str), ("memory.peak_bytes_per_gpu", "memory/GPU", format_bytes)]
    out = []
    for key, label, fmt in items:
        value = at(s, key)
        if value is None:
            continue
        out.append(f'<div class="card"><div class="v" data-key="{key}" data-value="{esc(json.dumps(value))}">'
                   f'{esc(fmt(value))}</div><div class="k">{esc(label)}</div></div>')
    return '<div class="cards">' + "".join(out) + "</div>"


def at(s: Mapping[str, Any], key: str) -> Any:
    """The value at a dotted key path of the summary (list items by index: ``jobs.0.name``)."""
    value: Any = s
    for part in key.split("."):
        value = value[int(part)] if isinstance(value, list) else value.get(part)
        if value is None:
            return None
    return value


def _count(x: float) -> str:
    return f"{x:,.0f}"


SUMMARY_ROWS: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
                ("GPUs", "gpus", str), ("iteration time", "iteration_time_s", format_time),
                ("tokens/s", "tokens_per_s", _count), ("samples/s", "samples_per_s", lambda x: f"{x:,.2f}"),
                ("model TFLOP/s per GPU", "model_tflops_per_gpu", lambda x: f"{x:.1f}"),
                ("hardware TFLOP/s per GPU", "hardware_tflops_per_gpu", lambda x: f"{x:.1f}"),
                ("MFU", "mfu", fmt_pct), ("HFU", "hfu", fmt_pct),
                ("memory per GPU (peak stage)", "memory.peak_bytes_per_gpu", format_bytes),
                ("GPU capacity", "memory.capacity_bytes", format_bytes),
                ("simulated ranks", "sim.ranks_simulated", str), ("events", "sim.events", _count))


def summary_section(s: Mapping[str, Any]) -> str:
    rows = [f"<td>scenario</td>{cell('scenario', s['scenario'], s['scenario'], 'txt')}"]
    for label, key, fmt in SUMMARY_ROWS:
        value = at(s, key)
        if value is not None:
            rows.append(f"<td>{esc(label)}</td>{cell(key, value, fmt(value))}")
    fits = at(s, "memory.fits")
    if fits is not None:
        verdict = cell("memory.fits", fits, "fits" if fits else "does not fit", "good" if fits else "bad")
        rows.append(f"<td>fits</td>{verdict}")
    src = s.get("compute_source")
    if src:
        text = (f"measured {src['measured']:.0%}, interpolated {src['interpolated']:.0%}, "
                f"roofline {src['roofline']:.0%}")
        rows.append(f"<td>compute costed from</td><td>{esc(text)}</td>")
    return "<h2 id=summary>Summary</h2>\n" + _cards(s) + table(["", "value"], rows)


def breakdown_parts(s: Mapping[str, Any], exposed: Mapping[str, float]) -> list[tuple[str, float]]:
    """The stacked bar's parts: compute, the exposed communication per lane (or as one part when
    the lanes are unknown), bubble, other."""
    bd = s["breakdown_s"]
    parts = [("compute", bd["compute"])]
    lanes = [(f"exposed comm: {k}", v) for k, v in exposed.items() if v > 0]
    parts += lanes if lanes else [("exposed comm", bd["exposed_comm"])]
    return parts + [("bubble", bd["bubble"]), ("other", bd["other"])]


def breakdown_section(r: Report) -> str:
    s = r.summary
    T, bd = s["iteration_time_s"], s["breakdown_s"]
    labels = {"compute": "compute", "exposed_comm": "exposed communication", "bubble": "pipeline bubble",
              "other": "other (optimizer, idle)"}
    rows = []
    for key, label in labels.items():
        share = bd[key] / T if T > 0 else 0.0
        rows.append(f"<td>{esc(label)}</td>{cell('breakdown_s.' + key, bd[key], format_time(bd[key]))}"
                    f'<td class="num">{share:.1%}</td>')
        if key == "exposed_comm":
            for lane, t in r.exposed.items():
                rows.append(f"<td>&nbsp;&nbsp;of it {esc(lane)}</td><td class=num data-lane=\"{esc(lane)}\">"
                            f"{esc(format_time(t))}</td><td class=num>{(t / T if T > 0 else 0.0):.1%}</td>")
    out = "<h2 id=breakdown>Where the step time goes</h2>\n"
    out += _picture(r, "breakdown", "the step time as a stacked bar: compute, exposed communication by kind, "
                                    "bubble, other")
    out += table(["part", "per iteration", "share"], rows)
    out += ("<p class=sub>Exposed communication is transfer time that no compute hides; where kinds overlap, "
            "each gets an equal share of the time they overlap.</p>")
    return out


def _picture(r: Report, name: str, alt: str) -> str:
    if name in r.images:
        return "<p>" + img(r.images[name], alt) + "</p>\n"
    return f"<p class=sub>No picture: {esc(r.absent.get(name, 'not available'))}.</p>\n"


def memory_section(r: Report) -> str:
    out = "<h2 id=memory>Memory per pipeline stage</h2>\n" + _picture(r, "memory", "memory per pipeline stage "
                                                                                  "against the GPU's capacity")
    if r.memory_stages:
        parts = list(dict.fromkeys(p for st in r.memory_stages for p in st["parts"]))
        rows = [f"<td>{st['stage']}</td>" + "".join(f'<td class=num>{esc(format_bytes(st["parts"].get(p, 0.0)))}</td>'
                                                   for p in parts)
                + f'<td class=num>{esc(format_bytes(st["peak_bytes"]))}</td>' for st in r.memory_stages]
        out += table(["stage", *parts, "total"], rows)
    return out


def links_section(r: Report) -> str:
    out = "<h2 id=links>Busiest links</h2>\n" + _picture(r, "links", "the topology with each link coloured by "
                                                                      "its utilisation")
    links = r.summary.get("links", {})
    busiest = links.get("busiest") or []
    if busiest:
        rows = [f"<td>{esc(b['link'])}</td><td>{esc(b['class'])}</td>"
                + cell(f"links.busiest.{i}.utilisation", b["utilisation"], fmt_pct(b["utilisation"]))
                + cell(f"links.busiest.{i}.bytes", b["bytes"], format_bytes(b["bytes"]))
                for i, b in enumerate(busiest)]
        out += table(["link", "class", "utilisation", "bytes"], rows, num_from=2)
    nic = links.get("busiest_nic")
    if nic:
        out += f"<p>Busiest NIC: {esc(json.dumps(nic, sort_keys=True))}</p>\n"
    return out


def notes_section(r: Report) -> str:
    s = r.summary
    items = []
    for f in s.get("faults", []):
        until = "the end" if f.get("until_s") is None else format_time(f["until_s"])
        items.append(f"<li class=bad>fault: {esc(f['kind'])} of {esc(f['target'])} from {esc(format_time(f['at_s']))} "
                     f"to {esc(until)}: {f['flows_rerouted']} flows rerouted, {f['flows_stalled']} stalled</li>")
    mem = s.get("memory", {})
    if mem.get("fits") is False:
        need, have = format_bytes(mem["peak_bytes_per_gpu"]), format_bytes(mem["capacity_bytes"])
        items.append(f"<li class=bad>warning: the job does not fit in GPU memory ({esc(need)} &gt; {esc(have)}); "
                     "the timing assumes it did.</li>")
    for note in s.get("sim", {}).get("notes", []):
        items.append(f"<li>note: {esc(note)}</li>")
    bounds = s.get("sim", {}).get("fold_bounds_s")
    if bounds:
        items.append(f"<li>note: folding kept the iteration time within {esc(format_time(bounds[0]))} .. "
                     f"{esc(format_time(bounds[1]))}</li>")
    for name, why in r.absent.items():
        items.append(f"<li>not shown: {esc(name)}: {esc(why)}</li>")
    body = "\n".join(items) if items else "<li>none</li>"
    return f"<h2 id=notes>Faults, notes and warnings</h2>\n<ul class=notes>\n{body}\n</ul>\n"


def jobs_section(s: Mapping[str, Any]) -> str:
    jobs = s.get("jobs")
    if not jobs:
        return ""
    rows = [f"<td>{esc(j['name'])}</td>"
            + cell(f"jobs.{i}.iteration_time_s", j["iteration_time_s"], format_time(j["iteration_time_s"]))
            + cell(f"jobs.{i}.alone_iteration_time_s", j["alone_iteration_time_s"],
                   format_time(j["alone_iteration_time_s"]))
            + cell(f"jobs.{i}.slowdown", j["slowdown"], f"{j['slowdown']:.3f}")
            for i, j in enumerate(jobs)]
    return "<h2 id=jobs>Jobs</h2>\n" + table(["job", "iteration time", "alone", "slowdown"], rows)


def scenario_section(r: Report) -> str:
    out = "<h2 id=scenario>The scenario as run</h2>\n"
    if r.scenario_yaml is None:
        out += "<p class=sub>No scenario.yaml in the run folder (runs before the report wrote none).</p>\n"
    else:
        out += "<pre>" + html.escape(printable(r.scenario_yaml, keep="\n\t"), quote=True) + "</pre>\n"
    return out + f"<p class=sub>Report written by {esc(r.version)} from {esc(r.source)}.</p>\n"


def report_html(r: Report) -> str:
    """The whole report page."""
    name = str(r.summary.get("scenario", ""))
    body = (f"<h1>{esc(name)}</h1>\n<p class=sub>{esc(r.summary['gpus'])} GPUs · {esc(r.source)}</p>\n"
            + summary_section(r.summary) + "\n" + breakdown_section(r) + "\n<h2 id=gantt>The iteration, rank by "
            "rank</h2>\n" + _picture(r, "gantt", "Gantt chart of the iteration") + memory_section(r)
            + links_section(r) + jobs_section(r.summary) + notes_section(r) + scenario_section(r))
    return page(f"{name}: emulator report", body)
