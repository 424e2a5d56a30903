"""The ``jobs`` and ``shared_links`` keys of a multi-job run's summary.

Per job (``jobs``, in scenario order): its nodes, GPUs, start, iteration time on the shared
fabric and alone on the same nodes (both simulated in the same command), the slowdown
(shared / alone), its throughput and MFU at its shared iteration time, and its memory
(peak bytes per GPU and whether it fits; None for a trace job).

``shared_links``: every link that the traffic of two or more jobs crosses, with each job's
bytes per iteration on it (from its alone run: routes do not depend on timing), its class
and capacity, busiest first (ties by name).

The top-level throughput of a multi-job run is the sum over the jobs, each at its own
iteration time; FLOP rates per GPU divide that by the GPUs the jobs use.

``mix`` (issue 29): the slowdown quantiles of the whole mix and of each ``jobs:`` entry over its
copies (``count``): p50, p90 (linear between order statistics, numpy's default: the q-quantile of
x₁ ≤ … ≤ xₙ is x_⌊h⌋ + (h − ⌊h⌋)(x_⌊h⌋+1 − x_⌊h⌋), h = q(n − 1), 0-based) and max; and the
cluster's goodput, Σ tokens/s shared over Σ tokens/s alone (1: no job lost anything to sharing).
"""
from __future__ import annotations

from typing import Any

from emulator.outputs.metrics import Breakdown, Totals
from emulator.result import JobRun, Result


def job_rows(result: Result) -> list[dict[str, Any]]:
    peak = result.scenario.cluster.node.gpu.peak_flops if result.scenario.cluster.node else 0.0
    out = []
    for run in result.jobs:
        T = run.iteration_time_s
        facts = run.program.meta.workload
        gpus = len(run.gpus)
        model_flops = float(facts.model_flops) if facts is not None else 0.0
        per_gpu = model_flops / T / gpus if T > 0 and gpus else 0.0
        out.append({
            "name": run.job.name,
            "entry": run.job.entry or run.job.name,
            "nodes": list(run.job.nodes_assigned),
            "gpus": gpus,
            "start_s": run.job.start,
            "iteration_time_s": T,
            "alone_iteration_time_s": run.alone_iteration_time_s,
            "slowdown": run.slowdown,
            "samples_per_s": float(facts.samples) / T if facts is not None and T > 0 else 0.0,
            "tokens_per_s": float(facts.tokens) / T if facts is not None and T > 0 else 0.0,
            "model_tflops_per_gpu": per_gpu / 1e12,
            "mfu": per_gpu / peak if peak and facts is not None else None,
            "memory": _memory(result, run),
        })
    return out


def _memory(result: Result, run: JobRun) -> dict[str, Any]:
    node = result.scenario.cluster.node
    if run.job.model is None or run.job.workload.trace or node is None:
        return {"peak_bytes_per_gpu": None, "fits": None}
    from emulator.workload.jobs import job_scenario
    from emulator.workload.memory import memory_report

    m = memory_report(job_scenario(result.scenario, run.job))
    return {"peak_bytes_per_gpu": m.peak_bytes_per_gpu, "fits": m.fits}


def shared_links(result: Result) -> list[dict[str, Any]]:
    topo = result.topology
    rows: list[dict[str, Any]] = []
    for i, link in enumerate(topo.links):
        users = [(run.job.name, run.link_bytes[i]) for run in result.jobs
                 if i < len(run.link_bytes) and run.link_bytes[i] > 0]
        if len(users) < 2:
            continue
        rows.append({"link": f"{link[0]}->{link[1]}", "class": topo.cls[i], "capacity_B_per_s": topo.capacity[i],
                     "bytes_per_iteration": dict(users)})
    # busiest first, ties by name; bytes compared to 9 digits, so a sum's last bits (a folded run adds
    # its copies' loads in another order than fold: off) do not reorder equal links
    rows.sort(key=lambda r: (-float(f"{sum(r['bytes_per_iteration'].values()):.9g}"), r["link"]))
    return rows


def aggregate(summary: dict[str, Any], rows: list[dict[str, Any]], runs: list[JobRun], peak: float) -> None:
    """Top-level throughput of a multi-job run: sums over the jobs (see the module doc). Jobs that
    replay traces carry no workload facts; with only those, the span-based figures stay."""
    if all(run.program.meta.workload is None for run in runs):
        summary["gpus"] = sum(r["gpus"] for r in rows)
        return
    gpus = sum(r["gpus"] for r in rows)
    summary["gpus"] = gpus
    summary["samples_per_s"] = sum(r["samples_per_s"] for r in rows)
    summary["tokens_per_s"] = sum(r["tokens_per_s"] for r in rows)
    model = sum(r["model_tflops_per_gpu"] * r["gpus"] for r in rows) / gpus if gpus else 0.0
    hw = 0.0
    for run in runs:
        facts = run.program.meta.workload
        if facts is not None and run.iteration_time_s > 0:
            hw += float(facts.hardware_flops) / run.iteration_time_s / 1e12
    summary["model_tflops_per_gpu"] = model
    summary["hardware_tflops_per_gpu"] = hw / gpus if gpus else 0.0
    summary["mfu"] = model * 1e12 / peak if peak else None
    summary["hfu"] = hw / gpus * 1e12 / peak if peak and gpus else None


def weighted_breakdown(totals: Totals, fold: Any, iterations: int) -> Breakdown:
    """The mean breakdown of a mix whose jobs fold each their own way (``folding.JobsFold``): each
    simulated rank weighs the ranks it stands for (``fold.copies_of``), so the mean is the one over
    every rank that ``simulation.fold: off`` takes."""
    total, n = [0.0, 0.0, 0.0, 0.0], 0
    for rank, parts in totals.items():
        w = fold.copies_of(rank)
        n += w
        for i, part in enumerate(parts):
            total[i] += part * w
    return Breakdown(*(x / (n * iterations) for x in total)) if n else Breakdown(0.0, 0.0, 0.0, 0.0)


def quantile(xs: list[float], q: float) -> float:
    """The q-quantile of ``xs`` (not empty), linear between order statistics (see the module doc)."""
    x = sorted(xs)
    h = q * (len(x) - 1)
    lo = int(h)
    return x[lo] if lo + 1 >= len(x) else x[lo] + (h - lo) * (x[lo + 1] - x[lo])


def _spread(xs: list[float]) -> dict[str, float]:
    return {"p50": quantile(xs, 0.5), "p90": quantile(xs, 0.9), "max": max(xs)}


def mix(rows: list[dict[str, Any]], runs: list[JobRun]) -> dict[str, Any]:
    """The ``mix`` key: slowdown quantiles of the mix and per entry, and the cluster's goodput (None
    where no job carries tokens: traces)."""
    by_entry: dict[str, list[float]] = {}
    for r in rows:
        by_entry.setdefault(r["entry"], []).append(r["slowdown"])
    shared = sum(r["tokens_per_s"] for r in rows)
    alone = 0.0
    for run in runs:
        facts = run.program.meta.workload
        if facts is not None and run.alone_iteration_time_s > 0:
            alone += float(facts.tokens) / run.alone_iteration_time_s
    return {"jobs": len(rows), "slowdown": _spread([r["slowdown"] for r in rows]),
            "slowdown_by_job": {e: dict(_spread(xs), count=len(xs)) for e, xs in by_entry.items()},
            "goodput": shared / alone if alone > 0 else None}
