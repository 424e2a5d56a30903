"""The run summary: the ``--json`` object (keys fixed by DESIGN.md) and the human table.

Every value comes from the Result's spans and the Program's workload facts;
the JSON is serialised with sorted keys, so the same scenario gives the same
bytes (all but ``sim.wall_s``, the host's wall-clock time).
"""
from __future__ import annotations

import json
from typing import Any

from emulator.outputs.metrics import mean_breakdown, rank_totals
from emulator.outputs.printable import printable
from emulator.outputs.ranks import rank_rows
from emulator.result import Result
from emulator.scenario.spec import Scenario


def _memory(result: Result) -> dict[str, Any]:
    sc = result.scenario
    capacity = sc.cluster.node.gpu.memory_bytes if sc.cluster.node else None
    if sc.model is None or sc.workload.trace:
        return {"peak_bytes_per_gpu": None, "capacity_bytes": capacity, "fits": None}
    from emulator.workload.memory import memory_report

    m = memory_report(sc)
    out: dict[str, Any] = {"peak_bytes_per_gpu": m.peak_bytes_per_gpu, "capacity_bytes": m.capacity_bytes,
                           "fits": m.fits}
    out["breakdown_bytes"] = dict(sorted(m.breakdown.items()))
    if m.host_bytes:  # pinned host memory: CPU-offloaded layers, the paged stash's host buffer
        out["host_bytes_per_gpu"] = m.host_bytes
    from emulator.workload.memory import stash_summary

    stash = stash_summary(sc, m)
    if stash is not None:
        out["paged_stash"] = stash
    return out


def compute_source(result: Result) -> dict[str, float] | None:
    """Shares of the compute time the workload builder costed from measured, interpolated and
    roofline kernels (devices/kernels.py), over the simulated ranks' ops; None for a trace. A
    stamped program's copies are its template's ops again: the template alone gives the shares."""
    totals = [0.0, 0.0, 0.0]
    for op in result.program.distinct_ops():
        if op.costed:
            for i, t in enumerate(op.costed):
                totals[i] += t
    whole = sum(totals)
    if whole <= 0:
        return None
    return {"measured": totals[0] / whole, "interpolated": totals[1] / whole, "roofline": totals[2] / whole}


def _sim(result: Result) -> dict[str, Any]:
    """How the run was made; ``fold_bounds_s`` only for a fold in effect kept within bounds
    (``simulation.fold_tolerance``)."""
    sim: dict[str, Any] = {"events": result.events, "wall_s": result.wall_s, "ranks_simulated": result.ranks_simulated,
                           "notes": list(result.notes)}
    if result.fold_bounds_s is not None:
        sim["fold_bounds_s"] = list(result.fold_bounds_s)
    return sim


def _hybrid_layers(result: Result, iterations: int) -> dict[str, float]:
    """A hybrid model's compute seconds per iteration and GPU by layer kind (mamba, attention, mlp, moe; an MTP
    module's as mtp), from the spans' layer indices."""
    from emulator.outputs.metrics import layer_time
    from emulator.workload import hybrid
    from emulator.workload import models as M

    HYBRID_KINDS = {hybrid.MAMBA: "mamba", hybrid.GDN: "gdn", hybrid.ATTENTION: "attention", hybrid.MLP: "mlp",
                    hybrid.MOE: "moe"}

    m = M.resolve(result.scenario.model) if result.scenario.model else None
    if m is None:
        return {}
    kinds = {i: HYBRID_KINDS[M.layer_parts(m, i)] for i in range(m.layers)}
    kinds.update({m.layers + 1 + d: "mtp" for d in range(m.mtp_num_layers)})
    return layer_time(result.spans, kinds, iterations)


def summarize(result: Result) -> dict[str, Any]:
    """The summary object of a run."""
    sc = result.scenario
    facts = result.program.meta.workload  # None for an imported trace
    T = result.iteration_time_s
    gpus = result.program.ranks
    pp = int(facts.pp if facts is not None else sc.parallel.pp if sc.model and not sc.workload.trace else 1)
    if result.jobs:  # several jobs: pipelined if any of them is
        pp = max(run.job.parallel.pp for run in result.jobs)
    if sc.workload.trace:  # a trace says it is pipelined by its stages
        pp = max(pp, len({s.stage for s in result.spans if s.stage >= 0}))
    iterations = max(1, sc.simulation.iterations)
    totals = rank_totals(result.spans, T, pipelined=pp > 1, iterations=iterations)
    bd = mean_breakdown(totals, T, iterations)
    if result.jobs and hasattr(result.program.fold, "copies_of"):  # jobs folded each its own way: weigh them
        from emulator.outputs.jobs import weighted_breakdown

        bd = weighted_breakdown(totals, result.program.fold, iterations)
    model_flops = float(facts.model_flops) if facts is not None else 0.0
    hw_flops = float(facts.hardware_flops) if facts is not None else model_flops
    if not model_flops:  # a trace: the FLOPs its ops declare, times the copies each rank stands for
        copies = result.program.fold.copies if result.program.fold else 1
        model_flops = hw_flops = sum(s.flops for s in result.spans) * copies / max(1, sc.simulation.iterations)
    peak = sc.cluster.node.gpu.peak_flops if sc.cluster.node else 0.0
    per_gpu = model_flops / T / gpus if T > 0 else 0.0
    hw_per_gpu = hw_flops / T / gpus if T > 0 else 0.0
    tokens = float(facts.tokens) if facts is not None else 0.0
    samples = float(facts.samples) if facts is not None else 0.0
    out = {
        "scenario": sc.name,
        "gpus": gpus,
        "iteration_time_s": T,
        "samples_per_s": samples / T if T > 0 else 0.0,
        "tokens_per_s": tokens / T if T > 0 else 0.0,
        "model_tflops_per_gpu": per_gpu / 1e12,
        "hardware_tflops_per_gpu": hw_per_gpu / 1e12,
        "mfu": per_gpu / peak if peak else None,
        "mfu_convention": _convention(sc, facts is not None or bool(result.jobs)),
        "hfu": hw_per_gpu / peak if peak else None,
        "breakdown_s": bd.as_dict(),
        "ranks": rank_rows(totals, iterations, result.program.fold),
        "memory": _memory(result),
        "compute_source": compute_source(result),
        "sim": _sim(result),
    }
    if facts is not None and facts.ep > 1:  # MoE: how long the token dispatch takes, and how much is exposed
        from emulator.outputs.metrics import stream_time

        busy, exposed = stream_time(result.spans, "ep", iterations)
        out["moe"] = {"dispatch_s": busy, "exposed_dispatch_s": exposed}
    if facts is not None and sc.model is not None and sc.model.hybrid_layer_pattern:  # a hybrid model: by layer kind
        out["hybrid_layers_s"] = _hybrid_layers(result, iterations)
    if facts is not None and (sc.training.fine_grained_activation_offloading or sc.training.cpu_offloading):
        from emulator.outputs.metrics import stream_time

        out_s, back_s, exposed_s = (*(stream_time(result.spans, st, iterations)[0] for st in ("d2h", "h2d")),
                                    stream_time(result.spans, ("d2h", "h2d"), iterations)[1])
        out["offload"] = {"d2h_s": out_s, "h2d_s": back_s, "exposed_s": exposed_s}
    if (facts is not None or result.jobs) and sc.cluster.node is not None and sc.cluster.node.host_launch > 0:
        from emulator.outputs.metrics import host_time

        issuing, waited = host_time(result.spans, iterations)
        if issuing > 0:  # the host's issuing was modelled (some layer is issued slower than it runs: host.py)
            impls = [run.job.training.cuda_graph_impl for run in result.jobs] or [sc.training.cuda_graph_impl]
            out["host"] = {"launch_s": sc.cluster.node.host_launch, "cuda_graph_impl": ",".join(dict.fromkeys(impls)),
                           "issue_s": issuing, "gpu_waits_s": waited}
    if result.link_bytes and T > 0:
        from emulator.outputs.nic import busiest_links, busiest_nic

        period = T * max(1, sc.simulation.iterations)
        out["links"] = {"busiest": busiest_links(result.topology, result.link_bytes, period),
                        "busiest_nic": busiest_nic(result.topology, result.link_bytes, period)}
    if result.jobs:
        from emulator.outputs.jobs import aggregate, job_rows, mix, shared_links

        rows = job_rows(result)
        out["jobs"] = rows
        out["shared_links"] = shared_links(result)
        aggregate(out, rows, result.jobs, peak)
        out["mix"] = mix(rows, result.jobs)
    if result.faults:  # timed link faults: when, and what they did to the flows on those links
        out["faults"] = [{"kind": f.kind, "target": f.target, "at_s": f.at_s, "until_s": f.until_s,
                          "flows_rerouted": f.rerouted, "flows_stalled": f.stalled} for f in result.faults]
    if sc.workload.profile and sc.model is not None:  # a profile from another GPU: how it was translated
        from emulator.workload.profiled import host_bound, kernel_shares, translation_report

        report = translation_report(sc)
        if report is not None:
            out["translation"] = report
        shares = kernel_shares(sc)
        if shares is not None:
            out["profile_kernels"] = shares
        bound = host_bound(sc)
        if bound is not None:
            out["host_bound"] = bound
    if result.overrides:  # faults in force from the start: what each reached
        out["overrides"] = [{"kind": o.kind, "target": o.target, "factor": o.factor,
                             "extra_latency_s": o.extra_latency_s, "gpus": o.gpus, "links": o.links}
                            for o in result.overrides]
    if result.program.meta.measured and sc.simulation.iterations <= 1:  # a replayed real trace: measured vs emulated
        from emulator.importers.replay_report import compare

        out["replay"] = compare(result.program, result)
    return out


# How the model FLOPs behind MFU are counted (workload/flops.py), named beside the figure: Megatron-LM's
# formula (Narayanan et al. SC21) counts attention's full s x s square whatever the mask, so a causal model,
# whose fused kernels do half of it, can show an MFU above what its kernels ran (over 100 % at very long
# sequences); a replayed trace's FLOPs are those its ops declare.
MFU_CONVENTION = "megatron-full-attention"
TRACE_MFU_CONVENTION = "trace-declared"
# DeepSeek-V4's hybrid attention: Megatron-Bridge's count (067f987df training/utils/flop_utils.py): the window and
# the compressed keys each query attends, the indexer's scores over the compressed square (workload/flops.py)
DSV4_MFU_CONVENTION = "megatron-bridge-dsv4"
CONVENTION_TEXT = {MFU_CONVENTION: "Megatron-LM model FLOPs: attention's full s^2, causal or not",
                   TRACE_MFU_CONVENTION: "the FLOPs the trace's ops declare",
                   DSV4_MFU_CONVENTION: "Megatron-Bridge's DeepSeek-V4 FLOPs: window, compressed keys, indexer"}


def _convention(sc: Scenario, generated: bool) -> str:
    """How the run's model FLOPs were counted: a trace's declared ones, Megatron-Bridge's for DeepSeek-V4's
    attention, else Megatron-LM's."""
    if not generated:
        return TRACE_MFU_CONVENTION
    dsv4 = sc.model is not None and sc.model.experimental_attention_variant == "dsv4_hybrid"
    return DSV4_MFU_CONVENTION if dsv4 else MFU_CONVENTION


def fault_lines(summary: dict) -> list[str]:
    """The faults and stragglers of a run, one line each, and what each did: timed link faults with
    their window and the flows they rerouted or stalled; faults in force from the start with the GPUs
    or links they reached."""
    lines = []
    for o in summary.get("overrides", []):
        what = f"fault: {printable(o['kind'])} {printable(o['target'])}"
        if o["kind"] == "gpu_slowdown":
            lines.append(f"{what}: compute {o['factor']:g}x as long on {o['gpus']} GPU{'s' * (o['gpus'] != 1)}, "
                         "the whole run")
        elif o["kind"] == "link_degrade":
            extra = f", +{_fmt_time(o['extra_latency_s'])} latency" if o["extra_latency_s"] else ""
            lines.append(f"{what}: {o['links']} link{'s' * (o['links'] != 1)} at {o['factor']:.0%} of their "
                         f"bandwidth{extra}, the whole run")
        else:
            lines.append(f"{what}: {o['links']} link{'s' * (o['links'] != 1)} down the whole run; "
                         "routing avoids them")
    for f in summary.get("faults", []):
        until = f"until {_fmt_time(f['until_s'])}" if f["until_s"] is not None else "never recovers"
        lines.append(f"fault: {printable(f['kind'])} {printable(f['target'])} at {_fmt_time(f['at_s'])}, {until}: "
                     f"{f['flows_rerouted']} flows rerouted, {f['flows_stalled']} stalled")
    return lines


def summary_json(summary: dict) -> str:
    return json.dumps(summary, indent=2, sort_keys=True) + "\n"


def _fmt_time(s: float) -> str:
    from emulator.scenario.units import format_time

    return format_time(s)


def translation_rows(tr: dict) -> list[tuple[str, str]]:
    """The translation report's lines: from which GPU to which, then per law its share of the
    profiled step, its time as measured and on the target (at the profiled sizes), and the law."""
    capped = f"; {tr['capped_kernels']} kernels held at the target's peak" if tr["capped_kernels"] else ""
    rows = [("translated", f"profile from {tr['from']} ({printable(tr['device'])}) to {tr['to']}, per law "
                           f"(share of the profiled {_fmt_time(tr['profiled_step_s'])} step{capped}):")]
    for name, c in tr["classes"].items():
        if c["measured_s"] > 0 or name == "host":
            rows.append((f"  {name.replace('_', '-')}", f"{c['share']:6.1%}  {_fmt_time(c['measured_s']):>10} -> "
                                                        f"{_fmt_time(c['translated_s']):>10}  {c['law']}"))
    return rows


def host_bound_line(hb: dict) -> str:
    """The host-bound step in one line, with the host floor and what the profiler's cost assumed."""
    launch = f"{hb['profiler_launch_s'] * 1e6:.2f} us a launch" if hb["profiler_launch_s"] else \
        "CUPTI's cost per launch not taken out (unmeasured)"
    return (f"the host's launches take {_fmt_time(hb['host_floor_s'])} of the {_fmt_time(hb['step_s'])} step "
            f"(GPU busy {_fmt_time(hb['gpu_busy_s'])}); a faster GPU will not shorten it  [host gaps as profiled, "
            f"less the profiler's {hb['profiler_op_s'] * 1e6:.2f} us a recorded op; {launch}]")


def human_table(summary: dict) -> str:
    """A short aligned table for people."""
    from emulator.scenario.units import format_bytes

    T = summary["iteration_time_s"]
    bd = summary["breakdown_s"]
    mem = summary["memory"]
    rows = [("scenario", printable(summary["scenario"])), ("GPUs", str(summary["gpus"])),
            ("iteration time", _fmt_time(T))]
    if summary["tokens_per_s"]:
        rows.append(("tokens/s", f"{summary['tokens_per_s']:,.0f}"))
    if summary["samples_per_s"]:
        rows.append(("samples/s", f"{summary['samples_per_s']:,.2f}"))
    if summary["mfu"]:
        rows.append(("model TFLOP/s/GPU", f"{summary['model_tflops_per_gpu']:.1f}  (MFU {summary['mfu']:.1%}, "
                                          f"HFU {summary['hfu']:.1%}; "
                                          f"{CONVENTION_TEXT.get(summary.get('mfu_convention', ''), 'FLOPs')})"))
    for key, label in (("compute", "compute"), ("exposed_comm", "exposed comm"), ("bubble", "pipeline bubble"),
                       ("other", "other")):
        share = bd[key] / T if T > 0 else 0.0
        rows.append((f"  {label}", f"{_fmt_time(bd[key]):>10}  {share:6.1%}"))
    layers = summary.get("hybrid_layers_s")
    if layers:
        rows.append(("layers (kernels)", ", ".join(f"{k} {_fmt_time(v)}" for k, v in layers.items())))
    moe = summary.get("moe")
    if moe:
        rows.append(("MoE dispatch", f"{_fmt_time(moe['dispatch_s'])} in flight, "
                                     f"{_fmt_time(moe['exposed_dispatch_s'])} exposed (of the exposed comm)"))
    off = summary.get("offload")
    if off:
        rows.append(("offload copies", f"{_fmt_time(off['d2h_s'])} out, {_fmt_time(off['h2d_s'])} back, "
                                       f"{_fmt_time(off['exposed_s'])} exposed (of the exposed comm)"))
    host = summary.get("host")
    if host:
        graphs = "" if host["cuda_graph_impl"] == "none" else f", CUDA graphs {host['cuda_graph_impl']}"
        rows.append(("host launches", f"{_fmt_time(host['issue_s'])} issuing, the GPU waited "
                                      f"{_fmt_time(host['gpu_waits_s'])} for it  [{host['launch_s'] * 1e6:.1f} us a "
                                      f"launch{graphs}]"))
    src = summary.get("compute_source")
    if src:
        rows.append(("compute costed", f"measured {src['measured']:.0%}, interpolated {src['interpolated']:.0%}, "
                                       f"roofline {src['roofline']:.0%}"))
    pk = summary.get("profile_kernels")
    if pk:
        rows.append(("profile kernels", f"compiled {pk['compiled_share']:.1%} of GPU time (declaring FLOPs or bytes "
                                        f"{pk['compiled_declared_share']:.1%}); no shapes {pk['unscaled_share']:.1%} "
                                        "(no aten op or Inductor record: scaled by tokens)"))
    hb = summary.get("host_bound")
    if hb:
        rows.append(("host-bound", host_bound_line(hb)))
    tr = summary.get("translation")
    if tr:
        rows += translation_rows(tr)
    if mem["peak_bytes_per_gpu"] is not None:
        verdict = "fits" if mem["fits"] else "DOES NOT FIT"
        rows.append(("memory/GPU", f"{format_bytes(mem['peak_bytes_per_gpu'])} of "
                                   f"{format_bytes(mem['capacity_bytes'])}  {verdict}"))
    if mem.get("host_bytes_per_gpu"):
        rows.append(("host memory/GPU", f"{format_bytes(mem['host_bytes_per_gpu'])} pinned (activation offload and "
                                        "stash buffers)"))
    stash = mem.get("paged_stash")
    if stash:
        rows.append(("paged stash", stash_line(stash)))
    for job in summary.get("jobs", []):
        rows.append((f"job {job['name']}", f"{_fmt_time(job['iteration_time_s'])}  alone "
                                           f"{_fmt_time(job['alone_iteration_time_s'])}  slowdown "
                                           f"{job['slowdown']:.3f}  (nodes {job['nodes']})"))
    if summary.get("shared_links"):
        top = summary["shared_links"][0]
        rows.append(("jobs met on", f"{len(summary['shared_links'])} links, e.g. {top['link']} ({top['class']})"))
    hot = summary.get("links", {}).get("busiest")
    if hot:
        rows.append(("busiest link", f"{hot[0]['link']} ({hot[0]['class']}): {hot[0]['utilisation']:.0%} busy"))
    sim = summary["sim"]
    rows.append(("simulated", f"{sim['ranks_simulated']} ranks, {sim['events']:,} events in {sim['wall_s']:.2f} s"))
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    if summary.get("replay"):
        lines.append("replay, per rank    measured span  emulated span  error   measured wait  emulated wait")
        for r in summary["replay"]:
            mw = _fmt_time(r["measured_wait_s"]) if r["measured_wait_s"] is not None else "-"
            lines.append(f"  rank {r['rank']:<13} {_fmt_time(r['measured_span_s']):>13}  "
                         f"{_fmt_time(r['emulated_span_s']):>13}  {r['span_error']:+6.1%}  {mw:>13}  "
                         f"{_fmt_time(r['emulated_wait_s']):>13}")
    lines.extend(fault_lines(summary))
    for note in sim.get("notes", []):
        lines.append(f"note: {note}")
    if stash and stash["overflow"]:
        lines.append("WARNING: the busiest expert-parallel rank's stash overflows both buffers; Megatron-Core then "
                     "runs the step again without it (the timing does not count the rerun).")
    if mem.get("fits") is False:
        lines.append("WARNING: the job does not fit in GPU memory "
                     f"({format_bytes(mem['peak_bytes_per_gpu'])} > {format_bytes(mem['capacity_bytes'])}); "
                     "the timing assumes it did.")
    return "\n".join(lines)


def stash_line(stash: dict[str, Any]) -> str:
    """The human table's paged-stash row: the buffers, and what the busiest rank spills to the host."""
    from emulator.scenario.units import format_bytes

    line = f"{format_bytes(stash['gpu_bytes'])} of GPU pages"
    if stash["host_bytes"]:
        line += f", {format_bytes(stash['host_bytes'])} pinned on the host"
    line += f"; busiest rank {stash['busiest_load']:.3f}x the mean"
    if stash["spill_to_host"]:
        line += f", {stash['spill_to_host']:.3f}x of it to the host"
    return line + ("  OVERFLOWS" if stash["overflow"] else "")
