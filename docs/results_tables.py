"""Tables of measured figures, rendered from the results files that benchmark scripts write
(benchmarks/results/*.json). No figure in the docs or the README is typed by hand.

A page asks for a table with a marker line ``<!-- results: NAME -->``; docs/hooks.py replaces it at
build time with ``TABLES[NAME]()``. The README's summary table sits between the markers
``<!-- results: summary -->`` and ``<!-- /results -->`` and is rewritten by
``python docs/results_tables.py --readme`` (tests/test_docs.py checks that it is up to date).
"""
from __future__ import annotations

import json
import os
import re
import sys
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
VALIDATION = "docs/validation.md"  # the page the summary links to


def load(name: str) -> dict[str, Any]:
    with open(os.path.join(RESULTS, f"{name}.json"), encoding="utf-8") as fh:
        return json.load(fh)


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def _stamp(doc: dict[str, Any]) -> str:
    load_avg = doc.get("load_average")
    return (f"*Written by `{doc.get('written_by', '?')}` on {doc.get('measured_at', '?')}, commit "
            f"`{doc.get('commit', '?')}`" + (f", load average {load_avg:.1f}" if load_avg is not None else "") + ".*")


def _table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c).replace("|", "/") for c in r) + " |" for r in rows]
    return "\n".join(out)


def _value(metric: str, x: float) -> str:
    if metric.endswith("_s") and not metric.endswith("_per_s"):
        return f"{x * 1e3:.3f} ms"
    return f"{x:.1f}"


def accuracy(suite: str) -> str:
    """One suite of benchmarks/accuracy.py: every case, measured against predicted, and each group's MAPE."""
    doc = load("accuracy")["suites"][suite]
    parts = []
    for g in doc["groups"]:
        rows = [[c["case"], f"`{c['metric']}`", _value(c["metric"], c["measured"]),
                 _value(c["metric"], c["predicted"]), _pct(c["error"]), c["source"]] for c in g["cases"]]
        parts += [f"**{g['group']}**: mean absolute error {g['mape']:.2f}% over {len(rows)} cases.", "",
                  _table(["case", "metric", "measured", "predicted", "error", "source"], rows), ""]
    parts.append(f"Cases file: `{doc['cases_file']}`. " + _stamp(doc))
    return "\n".join(parts)


def nccl() -> str:
    doc = load("nccl")
    rows = [[r["system"], r["operation"], r["gpus"], r["quantity"].replace("_", " "),
             f"{r['measured']:g} {r['unit']}", f"{r['predicted']:.2f} {r['unit']}", _pct(r["error"]),
             f"`{r['command']}`", f"{r['row']}: {r['source']}"] for r in doc["rows"]]
    return "\n".join([_table(["system", "operation", "GPUs", "quantity", "nccl-tests", "emulator", "error",
                              "command", "source"], rows), "", _stamp(doc)])


def overlap() -> str:
    doc = load("overlap")
    rows = [[r["trace"], r["groups"], r["kernels"], f"{r['under_comm']} / {r['alone']}",
             f"{r['factor']:.3f}" if r["factor"] is not None else "— (left out)",
             f"{r['q1']:.3f}–{r['q3']:.3f}" if r["factor"] is not None else "—"] for r in doc["rows"]]
    return "\n".join([_table(["trace", "groups", "kernels in groups", "compute kernels under comm / alone",
                              "factor", "IQR"], rows), "", _stamp(doc)])


def ecmp() -> str:
    doc = load("ecmp")
    rows = []
    for label, d in doc["fabrics"].items():
        slow = d["slowdown"]
        rows.append([label, f"{d['spray_s'] * 1e3:.1f} ms", f"{sum(x > 1 + 1e-9 for x in slow)} of {len(slow)}",
                     f"×{min(slow):.3f}", f"×{d['mean_slowdown']:.3f}", f"×{max(slow):.3f}"])
    return "\n".join([_table(["fabric", "all-reduce, spray", "seeds that collide", "least", "mean", "most"], rows),
                      "", f"{doc['size_bytes'] / 2**30:g} GiB all-reduce over 1024 H100, {doc['seeds']} seeds. "
                      + _stamp(doc)])


SPEED_ORDER = ["node-8gpu", "gpt3-1024", "gpt-145b-1536", "llama3-405b-16k", "moe-1024", "fabric-4096", "dp8192",
               "gpt-1t-512", "gpt-530b-2520", "gpt-530b-2520-bounded", "gpt3-1024-unfolded"]


def speed() -> str:
    doc = load("speed")["cases"]
    names = [n for n in SPEED_ORDER if n in doc] + sorted(n for n in doc if n not in SPEED_ORDER)
    rows = []
    for n in names:
        r = doc[n]
        rows.append([f"`{n}`", f"{r['gpus']:,}", f"{r['ranks_simulated']:,}", f"{r['events']:,}",
                     f"{r['wall_s']:.2f} s", f"{r['wall_over_floor']:.2f}", f"{r['cpu_over_floor']:.2f}",
                     f"{r['peak_rss_mb']:.0f} MB", f"{r['iteration_time_s']:.4f} s", f"{r['simpy_floor_s']:.3f} s",
                     f"{r['measured_at']}, `{r['commit']}`, load {r['load_average']:.1f}"])
    return "\n".join([_table(["case", "GPUs", "ranks simulated", "events", "wall", "wall / floor", "CPU / floor",
                              "peak RSS", "predicted iteration", "SimPy floor", "measured"], rows), "",
                      "*Written by `benchmarks/run.py --save`; the floor is one SimPy process waiting on 1,000,000 "
                      "timeouts, the least of three runs just before the case.*"])


def estimate_spread() -> tuple[float, float, int]:
    """(least, greatest, cases) of benchmarks/estimate_check.py's estimated wall time over the run's CPU time."""
    ratios = [r["cpu_ratio"] for r in load("estimate")["cases"].values()]
    return min(ratios), max(ratios), len(ratios)


def estimate() -> str:
    """benchmarks/estimate_check.py: `emulator run --estimate` against the run, every scenario."""
    doc = load("estimate")["cases"]
    rows = []
    for n in sorted(doc):
        r = doc[n]
        rows.append([f"`{n}`", f"{r['estimated_wall_s']:.2f} s", f"{r['wall_s']:.2f} s", f"{r['cpu_s']:.2f} s",
                     f"{r['cpu_ratio']:.2f}", f"{r['wall_ratio']:.2f}", f"{r['estimated_events']:,}",
                     f"{r['events']:,}", f"{r['cpu_over_floor']:.1f}", f"{r['measured_at']}, `{r['commit']}`"])
    lo, hi, n = estimate_spread()
    return "\n".join([_table(["case", "estimated wall", "wall", "CPU", "estimate / CPU", "estimate / wall",
                              "estimated events", "events", "CPU / floor", "measured"], rows), "",
                      f"*Written by `benchmarks/estimate_check.py --save`: over {n} cases the estimate is "
                      f"{lo:.2f} to {hi:.2f} times the run's CPU time (wall time on a shared machine is longer). "
                      "The floor is one SimPy process waiting on 1,000,000 timeouts, measured in the same run.*"])


def live_runs() -> str:
    doc = load("live_runs")
    out = [f"*Carried over by `{doc['written_by']}` from {doc['converted_from']}: these runs cannot be "
           "repeated here, so they are parsed from the text that reported them, not typed again.*", ""]
    for part in doc["parts"]:
        out += [f"### {part['title']}", ""]
        for b in part["blocks"]:
            if "table" in b:
                out += [_table(b["table"]["header"], b["table"]["rows"]), ""]
            else:
                out += [b["text"], ""]
    return "\n".join(out)


def _live_within(doc: dict[str, Any], title_start: str, column: str) -> tuple[int, int]:
    """(rows within 10%, rows) of the first table of a live part whose header has ``column``."""
    for part in doc["parts"]:
        if not part["title"].startswith(title_start):
            continue
        for b in part["blocks"]:
            if "table" in b and column in b["table"]["header"]:
                i = b["table"]["header"].index(column)
                errors = [float(re.sub(r"[^0-9.+-]", "", r[i].replace("−", "-"))) for r in b["table"]["rows"]]
                return sum(abs(e) <= 10 for e in errors), len(errors)
    return 0, 0


def summary(link: str = VALIDATION) -> str:
    """The README's "how accurate, how fast" table: one line per kind of evidence, linking to it."""
    acc = load("accuracy")["suites"]
    groups = {g["group"]: g for s in acc.values() for g in s["groups"]}
    layers = next(g for name, g in groups.items() if name.startswith("GPT-22B"))
    replays = [g for name, g in groups.items() if "replay" in name]
    pub = acc["published"]["groups"][0]["cases"]
    nc = load("nccl")["rows"]
    sp = load("speed")["cases"]
    live = load("live_runs")
    within, total = _live_within(live, "Checks with real ranks", "error")
    rows = [
        ["GPT-22B layer times, 8 A100 (the compute model's fit)",
         f"{layers['mape']:.2f}% mean error over {len(layers['cases'])} forward/backward times",
         f"[accuracy]({link}#layers-and-replays)"],
        ["Kineto trace replays (DLRM 8 V100, ResNet-50 A100)",
         ", ".join(f"{g['mape']:.2f}%" for g in replays) + " mean error per rank's step",
         f"[accuracy]({link}#layers-and-replays)"],
        ["Published end-to-end runs (not fitted)",
         ", ".join(f"{c['case']} {_pct(c['error'])}" for c in pub), f"[accuracy]({link}#published-runs)"],
        ["nccl-tests bus bandwidth and latency (the calibration rows)",
         f"within {100 * max(abs(r['error']) for r in nc):.1f}% on {len(nc)} rows", f"[nccl-tests]({link}#nccl-tests)"],
        ["Live: 2 real + 2 emulated ranks against 4 real processes",
         f"{within} of {total} size-runs within 10%, all runs kept", f"[live runs]({link}#live-runs)"],
    ]
    for case, label in (("gpt3-1024", "GPT-3 175B on 1,024 A100"), ("llama3-405b-16k", "Llama-3 405B on 16,384 H100"),
                        ("gpt-530b-2520", "GPT 530B on 2,520 A100, every replica simulated")):
        if case in sp:
            r = sp[case]
            rows.append([f"Speed: {label}", f"one iteration emulated in {r['wall_s']:.1f} s "
                                            f"({r['wall_over_floor']:.1f}× the machine's SimPy floor), "
                                            f"peak memory {r['peak_rss_mb']:.0f} MB",
                         f"[speed]({link}#speed)"])
    return _table(["what", "result", "evidence"], rows)


_KERNEL_SETS = (("gemm_bf16", "bf16 GEMMs (`gemm.csv`, above 60 µs)"),
                ("gemm_unaligned", "of which unaligned (N = 50257)"), ("attention_fwd", "attention forward"),
                ("attention_fwd_bwd", "attention forward + backward"),
                ("headline", "bf16 GEMMs and attention together"), ("gemm_fp8", "fp8 GEMMs (`fp8_gemm.csv`)"))


def kernel_fit() -> str:
    """benchmarks/kernel_fit.py: the H200 kernel measurements, looked up and left out one at a time."""
    doc = load("kernel_fit")["summary"]
    rows = [[label, doc[key]["n"], f"{100 * doc[key]['lookup_median_abs_error']:.2f}%",
             f"{100 * doc[key]['loo_median_abs_error']:.2f}%"] for key, label in _KERNEL_SETS if key in doc]
    return _table(["set", "n", "lookup (median abs. error)", "leave-one-out"], rows)


def profile() -> str:
    """benchmarks/profile_check.py: the H200 profile's own configuration, its replay and dp 8."""
    doc = load("profile_check")
    rows = [[r["case"], f"{r['predicted_s'] * 1e3:.1f} ms",
             f"{r['measured_s'] * 1e3:.1f} ms" if r["measured_s"] else "not measured",
             _pct(r["error"]) if r["error"] is not None else "—",
             f"{r['link_bytes'] / 1e9:.2f} GB" if r["link_bytes"] else "—"] for r in doc["rows"]]
    runs = ", ".join(f"{x * 1e3:.1f}" for x in doc["measured_runs_s"])
    return "\n".join([_table(["case", "predicted", "measured", "error", "busiest link's bytes"], rows), "",
                      f"Measured on the H200 without the profiler, two runs' medians: {runs} ms (the lower is "
                      "compared). " + _stamp(doc)])


def gpu_profile() -> str:
    """benchmarks/gpu_profile_check.py on a real GPU, where it has been run."""
    if not os.path.exists(os.path.join(RESULTS, "gpu_profile_check.json")):
        return _table(["configuration", "status"], [["every configuration of `benchmarks/gpu_profile_check.py`",
                                                     "not run yet: it needs a GPU, and none was lent to the "
                                                     "session that wrote it"]])
    doc = load("gpu_profile_check")
    rows = [[r["name"], "profiled" if r["base"] else "reshaped", f"{r['measured_s'] * 1e3:.1f} ms",
             f"{r['predicted_s'] * 1e3:.1f} ms", _pct(r["error"]), f"{r['measured_peak_bytes'] / 2**30:.1f} GiB",
             f"{r['predicted_peak_bytes'] / 2**30:.1f} GiB", _pct(r["memory_error"])] for r in doc["rows"]]
    return "\n".join([_table(["configuration", "", "step measured", "predicted", "error", "peak memory measured",
                              "predicted", "error"], rows), "", _stamp(doc)])


TABLES: dict[str, Callable[[], str]] = {
    "kernel-fit": kernel_fit,
    "profile": profile,
    "gpu-profile": gpu_profile,
    "accuracy-layers": lambda: accuracy("layers-and-replays"),
    "accuracy-published": lambda: accuracy("published"),
    "nccl": nccl,
    "overlap": overlap,
    "ecmp": ecmp,
    "speed": speed,
    "estimate": estimate,
    "live-runs": live_runs,
    "summary": lambda: summary("validation.md"),
}
MARKER = re.compile(r"^<!-- results: ([\w-]+) -->$", re.M)


def render(markdown: str) -> str:
    """Each ``<!-- results: NAME -->`` line replaced by its table."""
    return MARKER.sub(lambda m: TABLES[m.group(1)](), markdown)


README_BLOCK = re.compile(r"(<!-- results: summary -->\n)(.*?)(<!-- /results -->)", re.S)


def readme_table() -> str:
    """The README's summary block as it should read (links into the docs folder, which GitHub shows)."""
    return summary(VALIDATION) + "\n"


def update_readme(path: str = os.path.join(ROOT, "README.md")) -> bool:
    """Rewrite the README's summary block from the results files; True if it changed."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    new = README_BLOCK.sub(lambda m: m.group(1) + readme_table() + m.group(3), text)
    if new != text:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(new)
    return new != text


if __name__ == "__main__":
    if sys.argv[1:] == ["--readme"]:
        print("README.md updated" if update_readme() else "README.md already up to date")
    else:
        print(__doc__)
