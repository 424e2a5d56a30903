"""Layout search: the best parallel layout of a model on N GPUs that fits in memory.

The search space (all sizes powers of two):
- tp ≤ ``max_tp`` (default: GPUs per node), pp ≤ ``max_pp``, cp ≤ ``max_cp``
  (default 1), dp = N/(tp·pp·cp); ep | dp·cp and ep | experts, for MoE models only;
- micro-batch in ``micro_batches`` (1, 2, 4, 8);
- schedule 1f1b, and interleaved-1f1b with v = 2 or 4 virtual stages when pp > 1; with
  ``schedules`` (``--schedules``) also the V and DualPipe schedules when pp > 1: zb-v and
  dualpipev (v = 2, the two chunks of a V) and dualpipe (v = 1, two copies of the pp stages);
- ZeRO stage 0..3 (0 only when dp·cp = 1);
- recompute none, selective, full.

Rules: the loader's rule book (scenario/rules.py, ``layout_violations``): heads, FFN and
KV heads over tp, layers over the pp·v chunks (evenly, or else with lighter first and
last chunks: scenario/stages.py), global_batch over micro_batch·dp, the sequence over
cp (·tp with sequence parallelism), experts over ep, and the interleaved schedule's
micro-batches, the V's two chunks, dualpipev's 2·pp micro-batches, dualpipe's even pp and even
2·pp micro-batches, and none of the three with the all-to-all overlap). A layout breaking one
is pruned with the loader's message, so the search keeps exactly the layouts the loader
accepts; a layout whose memory_report does not fit is pruned before it is simulated (the
search never proposes a layout its own memory model rejects). memory_report is each
schedule's own: zb-v holds 2p chunks' activations, dualpipev and dualpipe p + 1 stages',
dualpipe two copies of the parameters (workload/memory.py).

The default schedules stay 1f1b and interleaved-1f1b (``DEFAULT_SCHEDULES``): the V and
DualPipe schedules are asked for with ``schedules`` (``--schedules 1f1b,interleaved-1f1b,zb-v,
dualpipev,dualpipe`` or ``all``). Widening the default would add up to three shapes to each
pp > 1 shape's three, so up to twice the layouts to check, fit and estimate (Llama-3 70B on 64
H100: 4,512 instead of 2,352, 4.5 s of CPU instead of 2.3 s), and it changes what existing
searches propose: their closed-form bubble (studies/rank.py: a sixth or a third of 1F1B's) puts
them ahead of 1F1B wherever they fit, so the top ``simulate_top`` (there 12 of 24) and the
answer move.

Recompute only adds work, so for each (layout, ZeRO stage) only the least recompute
that fits is kept (none, else selective, else full; activations shrink with more
recompute, so once one fits the others are not checked); ZeRO-2 communicates as ZeRO-1
(workload/builder.py), so it is kept only where it lets less recompute fit than ZeRO-1
does; ``exhaustive`` keeps every fitting one. The survivors are ranked by a closed-form iteration time
(studies/rank.py, microseconds each), and only the best ``simulate_top`` of them run
through the same executor and results store as a sweep, ranked by tokens/s. The output
gives Spearman's ρ between the estimate and the emulator over the simulated layouts,
and the best-to-worst spread among them. ``max_points`` is a guard on the layouts
simulated, not on those considered.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

from emulator.errors import EmulatorError
from emulator.outputs.printable import printable
from emulator.outputs.progress import points_bar
from emulator.scenario.rules import layout_violations
from emulator.scenario.spec import Scenario
from emulator.scenario.stages import balanced_ends
from emulator.studies.store import ResultStore, Row, export_csv
from emulator.studies.sweep import (
    Point,
    RunStats,
    close_executor,
    load_point,
    make_executor,
    run_points,
)

RECOMPUTE = ("none", "selective", "full")
# each layout splits the layers itself: the base's end chunks, and its pipeline_model_parallel_layout (which
# places every layer for one pp × virtual_stages), do not carry over
SPLIT_RESET = ("parallel.first_chunk_layers=null", "parallel.last_chunk_layers=null",
               "parallel.pipeline_model_parallel_layout=null")
# ZeRO-1 and ZeRO-2 emit the same reduce-scatter and all-gather (workload/builder.py, finish); ZeRO-2
# only holds less gradient memory, so it is worth simulating only where it lets less recompute fit
SAME_AS_ZERO1 = "ZeRO-2 where ZeRO-1 fits with the same recompute (the same communication)"
DEFAULT_MAX_POINTS = 400  # a guard on the layouts simulated
DEFAULT_SIMULATE_TOP = 24  # the best of the closed-form ranking that the emulator runs
DEFAULT_SCHEDULES = ("1f1b", "interleaved-1f1b")
SEARCH_SCHEDULES = ("1f1b", "interleaved-1f1b", "zb-v", "dualpipev", "dualpipe")  # what ``schedules`` may name
# (schedule, virtual stages) tried when pp > 1; at pp = 1 only 1f1b (there is no pipeline to schedule)
PIPELINE_VARIANTS = {"1f1b": (1,), "interleaved-1f1b": (2, 4), "zb-v": (2,), "dualpipev": (2,), "dualpipe": (1,)}


class SearchError(EmulatorError):
    """A search that cannot run (no model, GPUs that do not fit the node, too many points)."""


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    dp: int
    cp: int = 1
    ep: int = 1
    micro_batch: int = 1
    schedule: str = "1f1b"
    virtual_stages: int = 1
    zero: int = 0
    recompute: str = "none"
    ends: int | None = None  # layers of the first and of the last chunk; None: an even split

    def values(self) -> dict[str, Any]:
        """{key.path: value}: the scenario fields this layout sets (the end chunks' layers when uneven;
        ``search`` resets the base scenario's to an even split)."""
        uneven = {} if self.ends is None else {"parallel.first_chunk_layers": self.ends,
                                               "parallel.last_chunk_layers": self.ends}
        return {"parallel.tp": self.tp, "parallel.pp": self.pp, "parallel.dp": self.dp, "parallel.cp": self.cp,
                "parallel.ep": self.ep, "training.micro_batch": self.micro_batch, "parallel.schedule": self.schedule,
                "parallel.virtual_stages": self.virtual_stages, "parallel.zero": self.zero,
                "training.recompute": self.recompute, **uneven}

    def short(self) -> str:
        sched = self.schedule if self.virtual_stages == 1 else f"{self.schedule} v={self.virtual_stages}"
        extra = "".join(f" {k}={v}" for k, v in (("cp", self.cp), ("ep", self.ep)) if v > 1)
        ends = "" if self.ends is None else f" ends={self.ends}"
        return (f"tp={self.tp} pp={self.pp} dp={self.dp}{extra} mb={self.micro_batch} {sched}{ends} "
                f"zero={self.zero} recompute={self.recompute}")

    def apply(self, sc: Scenario) -> Scenario:
        """The scenario with this layout (no loader checks: for the memory model only)."""
        ring = {k.removeprefix("parallel."): v for k, v in hierarchical_reset(sc, self.cp).items()}
        par = dataclasses.replace(sc.parallel, tp=self.tp, pp=self.pp, dp=self.dp, cp=self.cp, ep=self.ep,
                                  schedule=self.schedule, virtual_stages=self.virtual_stages, zero=self.zero,
                                  first_chunk_layers=self.ends, last_chunk_layers=self.ends,
                                  pipeline_model_parallel_layout=None, **ring)
        tr = dataclasses.replace(sc.training, micro_batch=self.micro_batch, recompute=self.recompute)
        return dataclasses.replace(sc, parallel=par, training=tr)


def hierarchical_reset(sc: Scenario, cp: int) -> dict[str, Any]:
    """{key.path: value} a layout of ``cp`` sets on base ``sc``: hierarchical CP (cp_comm_type a2a+p2p) fixes its
    sizes to the base's cp, so a layout of another cp runs the K/V ring (p2p) instead; {} otherwise."""
    if sc.parallel.cp_comm_type == "a2a+p2p" and cp != sc.parallel.cp:
        return {"parallel.cp_comm_type": "p2p", "parallel.hierarchical_context_parallel_sizes": None}
    return {}


@dataclass(frozen=True)
class Limits:
    max_tp: int | None = None  # default: GPUs per node
    max_pp: int | None = None
    max_cp: int = 1
    micro_batches: tuple[int, ...] = (1, 2, 4, 8)
    zero: tuple[int, ...] = (0, 1, 2, 3)
    exhaustive: bool = False
    schedules: tuple[str, ...] = DEFAULT_SCHEDULES  # of SEARCH_SCHEDULES


def schedule_variants(schedules: Sequence[str], pp: int) -> list[tuple[str, int]]:
    """(schedule, virtual stages) to try at ``pp``, in SEARCH_SCHEDULES order: every listed schedule's
    variants when pp > 1, and at pp = 1 1f1b alone (when listed)."""
    if pp == 1:
        return [("1f1b", 1)] if "1f1b" in schedules else []
    return [(name, v) for name in SEARCH_SCHEDULES if name in schedules for v in PIPELINE_VARIANTS[name]]


def powers_of_two(limit: int) -> list[int]:
    out, x = [], 1
    while x <= limit:
        out.append(x)
        x *= 2
    return out


def cluster_overrides(sc: Scenario, gpus: int | None) -> list[str]:
    """--set strings that make the cluster ``gpus`` GPUs (whole nodes, or part of one)."""
    if gpus is None:
        return []
    node = sc.cluster.node
    if node is None or sc.cluster.fabric.kind == "custom":
        raise SearchError("--gpus needs a catalog or inline node (not a custom graph)")
    g = node.gpus_per_node
    if gpus >= g and gpus % g == 0:
        return [f"cluster.nodes={gpus // g}"]
    if gpus < g and g % gpus == 0:
        return ["cluster.nodes=1", f"cluster.node.gpus_per_node={gpus}"]
    raise SearchError(f"--gpus {gpus}: expected a multiple of the {g} GPUs per node, or a divisor of it")


def rule_violation(sc: Scenario, lay: Layout) -> str | None:
    """The first layout rule ``lay`` breaks on ``sc``'s model, in the loader's words (the rule book,
    scenario/rules.py), or None."""
    assert sc.model is not None
    laid = lay.apply(sc)
    broken = layout_violations(sc.model, laid.training, laid.parallel)
    return broken[0].message if broken else None


def shapes(sc: Scenario, gpus: int, lim: Limits) -> list[Layout]:
    """Every (tp, pp, cp, ep, dp, micro-batch, schedule) of the space, before the rules; where the layers
    do not split evenly over the pp·v chunks, with lighter end chunks (stages.balanced_ends)."""
    node = sc.cluster.node
    max_tp = lim.max_tp or (node.gpus_per_node if node else gpus)
    layers = sc.model.layers if sc.model else 0
    ends = functools.partial(balanced_ends, layers)  # chunks → None (even) or the lighter ends
    out = []
    for tp in powers_of_two(min(max_tp, gpus)):
        for pp in powers_of_two(min(lim.max_pp or gpus, gpus // tp)):
            for cp in powers_of_two(min(lim.max_cp, gpus // (tp * pp))):
                if gpus % (tp * pp * cp):
                    continue
                dp = gpus // (tp * pp * cp)
                eps = powers_of_two(dp * cp) if (sc.model and sc.model.experts) else [1]
                scheds = schedule_variants(lim.schedules, pp)
                for ep in eps:
                    for mb in lim.micro_batches:
                        for sched, v in scheds:
                            out.append(Layout(tp, pp, dp, cp, ep, mb, sched, v, ends=ends(pp * v)))
    return out


@dataclass
class Plan:
    layouts: list[Layout]  # every layout that passes the rules and fits, in enumeration order
    considered: int  # shapes × ZeRO stages × recompute options
    pruned: Counter  # reason -> layouts
    estimates: dict = dataclasses.field(default_factory=dict)  # Layout -> closed-form iteration s (rank.py)
    chosen: list[Layout] = dataclasses.field(default_factory=list)  # the best by estimate: to simulate
    gpus: int = 0  # the GPUs the layouts are for


def plan(sc: Scenario, gpus: int, lim: Limits) -> Plan:
    """The layouts to simulate, and how many were pruned for which reason."""
    from emulator.workload.memory import memory_report

    pruned: Counter = Counter()
    todo: list[Layout] = []
    considered = 0
    for shape in shapes(sc, gpus, lim):
        zeros = [z for z in lim.zero if shape.dp * shape.cp > 1 or z == 0] or [0]
        n = len(zeros) * len(RECOMPUTE)
        considered += n
        if sc.training.optimizer in ("muon", "dist_muon"):  # Muon takes ZeRO 0 or 1 (muon), 1 (dist_muon)
            takes = (1,) if sc.training.optimizer == "dist_muon" else (0, 1)
            pruned["Muon's optimizer takes ZeRO 0 or 1 (dist_muon 1)"] += len(RECOMPUTE) * sum(z not in takes
                                                                                            for z in zeros)
            zeros = [z for z in zeros if z in takes] or [takes[-1]]
            shape = dataclasses.replace(shape, zero=zeros[0])
            n = len(zeros) * len(RECOMPUTE)
        why = rule_violation(sc, shape)
        if why:
            pruned[why] += n
            continue
        least: dict[int, str] = {}  # ZeRO stage -> the least recompute that fits
        for z in zeros:
            fitting = 0
            for rc in RECOMPUTE:
                lay = dataclasses.replace(shape, zero=z, recompute=rc)
                if fitting and not lim.exhaustive:  # more recompute stores less: it fits too
                    pruned["more recompute than needed to fit"] += 1
                elif not memory_report(lay.apply(sc)).fits:
                    pruned["out of memory"] += 1
                elif z == 2 and least.get(1) == rc and not lim.exhaustive:
                    fitting += 1
                    pruned[SAME_AS_ZERO1] += 1
                else:
                    fitting += 1
                    least.setdefault(z, rc)
                    todo.append(lay)
    return Plan(todo, considered, pruned, gpus=gpus)


def choose(sc: Scenario, p: Plan, top: int | None) -> None:
    """Estimate every fitting layout (rank.py) and keep the ``top`` best for simulation
    (all of them with None), fastest first; ties keep enumeration order."""
    from emulator.studies.rank import estimate_iteration

    p.estimates = {lay: estimate_iteration(lay.apply(sc)).iteration_s for lay in p.layouts}
    order = sorted(range(len(p.layouts)), key=lambda i: (p.estimates[p.layouts[i]], i))
    p.chosen = [p.layouts[i] for i in (order if top is None else order[:top])]


# ------------------------------------------------------------------ ranking


def fitting_rows(rows: Sequence[Row]) -> list[Row]:
    """Finished rows that fit in memory, best tokens/s first (ties: the row key)."""
    ok = [r for r in rows if r.status == "ok" and r.metric("memory.fits") is not False]
    return sorted(ok, key=lambda r: (-(r.metric("tokens_per_s") or 0.0), r.metric("iteration_time_s"), r.key))


def _shape(row: Row) -> tuple:
    return tuple(row.varied[k] for k in ("parallel.tp", "parallel.pp", "parallel.cp", "parallel.ep"))


def why_best(best: Row, second: Row, label: str = "#2") -> str:
    """One line: the time component that ``second`` loses most on against ``best``."""
    from emulator.scenario.units import format_time

    bt, st = best.metric("tokens_per_s") or 0.0, second.metric("tokens_per_s") or 0.0
    parts = ("compute", "exposed_comm", "bubble", "other")
    names = {"compute": "compute", "exposed_comm": "exposed communication", "bubble": "pipeline bubble",
             "other": "other (optimizer, idle)"}
    diff = {p: (second.metric(f"breakdown_s.{p}") or 0.0) - (best.metric(f"breakdown_s.{p}") or 0.0) for p in parts}
    worst = max(parts, key=lambda p: diff[p])
    lead = (bt / st - 1) if st else 0.0
    b, s = best.metric(f"breakdown_s.{worst}") or 0.0, second.metric(f"breakdown_s.{worst}") or 0.0
    return (f"why: the best is {lead:.1%} faster than {label} ({layout_text(second)}), which spends "
            f"{format_time(diff[worst])} more per iteration in {names[worst]} ({format_time(s)} vs {format_time(b)})")


def layout_text(row: Row) -> str:
    v = row.varied
    lay = Layout(v["parallel.tp"], v["parallel.pp"], v["parallel.dp"], v["parallel.cp"], v["parallel.ep"],
                 v["training.micro_batch"], v["parallel.schedule"], v["parallel.virtual_stages"],
                 v["parallel.zero"], v["training.recompute"], v.get("parallel.first_chunk_layers"))
    return lay.short()


def ranked_table(rows: Sequence[Row], top: int) -> str:
    from emulator.scenario.units import format_bytes, format_time

    head = ["#", "tokens/s", "MFU", "mem/GPU", "iteration", "layout"]
    lines = []
    for i, r in enumerate(rows[:top], 1):
        mfu = r.metric("mfu")
        lines.append([str(i), f"{r.metric('tokens_per_s'):,.0f}", "-" if mfu is None else f"{mfu:.1%}",
                      format_bytes(r.metric("memory.peak_bytes_per_gpu")),
                      format_time(r.metric("iteration_time_s")), layout_text(r)])
    widths = [max(len(h), *(len(c[i]) for c in lines)) if lines else len(h) for i, h in enumerate(head)]
    right = {0, 1, 2, 3, 4}
    fmt = lambda cells: "  ".join(c.rjust(w) if i in right else c.ljust(w)  # noqa: E731
                                  for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    return "\n".join([fmt(head)] + [fmt(c) for c in lines])


def prune_rules(pruned: Counter) -> Counter:
    """The pruned counts by rule: the loader's messages with their numbers as N (one rule's
    messages differ only in the layout's sizes: "model.layers (80) must be divisible by
    pp*virtual_stages = 16*2 = 32" and "... = 64*1 = 64" are one line, not two)."""
    out: Counter = Counter()
    for why, n in pruned.items():
        out[re.sub(r"(?<![\w-])\d+(\.\d+)?", "N", why)] += n  # not the digits of 1f1b or ZeRO-2
    return out


def prune_examples(pruned: Counter) -> list[tuple[str, int, int]]:
    """Per rule (``prune_rules``), most layouts first: its most frequent message as written, with
    the layout's numbers (the rule's template "N*N = N" says nothing), the layouts it pruned, and
    how many other messages of the rule there were."""
    rules = prune_rules(pruned)
    example: dict[str, tuple[str, int]] = {}
    variants: Counter = Counter()
    for why, n in sorted(pruned.items(), key=lambda x: (-x[1], x[0])):
        rule = re.sub(r"(?<![\w-])\d+(\.\d+)?", "N", why)
        example.setdefault(rule, (why, n))
        variants[rule] += 1
    return [(example[rule][0], n, variants[rule] - 1) for rule, n in sorted(rules.items(), key=lambda x: (-x[1], x[0]))]


def prune_text(p: Plan) -> str:
    total = sum(p.pruned.values())
    reasons = "; ".join(f"{why}{f' (and {k} more with other sizes)' if k else ''}: {n:,}"
                        for why, n, k in prune_examples(p.pruned))
    rest = (f"{len(p.layouts)} fit, the best {len(p.chosen)} by the closed-form estimate to simulate"
            if len(p.chosen) < len(p.layouts) else f"{len(p.layouts)} to simulate")
    return f"{p.considered} layouts considered, {total} pruned ({reasons or 'none'}), {rest}"


def estimate_quality(res: "SearchResult") -> str | None:
    """Spearman's ρ between the closed-form estimate and the emulator's iteration time over the
    layouts simulated without error, as one line; None below 3 of them."""
    from emulator.studies.rank import spearman

    pairs = [(res.estimates[r.key], r.metric("iteration_time_s")) for r in res.rows
             if r.status == "ok" and r.metric("iteration_time_s") is not None and r.key in res.estimates]
    rho = spearman([a for a, _ in pairs], [b for _, b in pairs])
    if rho is None:
        return None
    return (f"estimate vs emulator: Spearman rank correlation {rho:.3f} over the {len(pairs)} simulated layouts "
            "(iteration time; studies/rank.py)")


def spread_text(rows: Sequence[Row]) -> str | None:
    """The best-to-worst spread of tokens/s and iteration time among the simulated fitting layouts."""
    from emulator.scenario.units import format_time

    if len(rows) < 2:
        return None
    best, worst = rows[0], rows[-1]
    bt, wt = best.metric("tokens_per_s") or 0.0, worst.metric("tokens_per_s") or 0.0
    ratio = f"{bt / wt:.2f}x" if wt else "-"
    return (f"spread over the {len(rows)} simulated layouts: best {bt:,.0f} tokens/s "
            f"({format_time(best.metric('iteration_time_s'))} per iteration), worst {wt:,.0f} tokens/s "
            f"({format_time(worst.metric('iteration_time_s'))}, {layout_text(worst)}): {ratio}")


# ------------------------------------------------------------------ the study


@dataclass
class SearchResult:
    plan: Plan
    points: list[Point]
    rows: list[Row]  # every simulated layout, in plan.chosen order (best estimate first)
    ranked: list[Row]  # fitting, best first
    stats: RunStats
    estimates: dict = dataclasses.field(default_factory=dict)  # point key -> closed-form iteration s
    scenario: str = ""  # the scenario's name


def search(path: str, base: Sequence[str], gpus: int | None, lim: Limits, store: ResultStore, executor: Any,
           progress_factory: Any = None, max_points: int = DEFAULT_MAX_POINTS,
           simulate_top: int | None = DEFAULT_SIMULATE_TOP) -> SearchResult:
    """Plan, prune, rank by the closed-form estimate, simulate the best ``simulate_top`` (None: every
    fitting layout; skipping what the store has) and rank those by tokens/s."""
    from emulator.scenario.reader import load_scenario

    sc0 = load_scenario(path, list(base))
    if sc0.model is None or sc0.workload.trace:
        raise SearchError(f"{path}: search needs a model workload (model.preset or sizes), not a trace")
    base = [*base, *cluster_overrides(sc0, gpus)]
    sc = _resized(path, base, sc0) if gpus is not None else sc0
    p = plan(sc, sc.gpus, lim)
    choose(sc, p, simulate_top)
    if len(p.chosen) > max_points:
        raise SearchError(f"{prune_text(p)}: more than --max-points {max_points}; simulate fewer with "
                          "--simulate-top, narrow the space with --max-tp, --max-pp, --micro-batches or --zero, "
                          "or raise --max-points")
    points = []
    for i, lay in enumerate(p.chosen):
        values = {k: str(v) for k, v in lay.values().items()}
        # each layout sets its own split: the base scenario's end chunks do not carry over
        ring = [f"{k}={'null' if v is None else v}" for k, v in hierarchical_reset(sc, lay.cp).items()]
        points.append(load_point(path, [*base, *SPLIT_RESET, *ring], values, i, len(p.chosen), varied=lay.values()))
    progress = progress_factory(len(points), "search") if progress_factory else None
    stats = run_points(points, store, executor, progress)
    rows = store.rows([pt.key for pt in points])
    estimates = {pt.key: p.estimates[lay] for pt, lay in zip(points, p.chosen)}
    return SearchResult(p, points, rows, fitting_rows(rows), stats, estimates, sc0.name)


def _resized(path: str, base: Sequence[str], sc0: Scenario) -> Scenario:
    """``sc0`` on the cluster that ``base`` (with --gpus's overrides) describes. Every layout sets its own
    tp, pp, dp, cp and ep, so the base scenario's layout is not checked against the new GPU count: the
    cluster is loaded without the model (whose layout checks need the old count), then the model rejoins."""
    from emulator.scenario.reader import load_scenario

    bare = load_scenario(path, [*base, "model="])
    return dataclasses.replace(sc0, cluster=bare.cluster)


def report(res: SearchResult, sc_name: str, gpus: int, top: int) -> str:
    lines = [f"search: {sc_name} on {gpus} GPUs: {prune_text(res.plan)}"]
    errors = [r for r in res.rows if r.status == "error"]
    if not res.ranked:
        lines.append("no layout fits in memory and runs" + (f" ({errors[0].error})" if errors else ""))
        return "\n".join(lines)
    lines.append(ranked_table(res.ranked, top))
    if len(res.ranked) > 1:
        lines.append(why_best(res.ranked[0], res.ranked[1]))
    other = next((r for r in res.ranked[1:] if _shape(r) != _shape(res.ranked[0])), None)
    if other is not None and other is not res.ranked[1]:
        lines.append(why_best(res.ranked[0], other, f"#{res.ranked.index(other) + 1}, the best other tp/pp/cp/ep"))
    lines += [x for x in (spread_text(res.ranked), estimate_quality(res)) if x]
    if errors:
        lines.append(f"{len(errors)} layouts failed to simulate, e.g. {errors[0].error}")
    return "\n".join(lines)


def _ints(text: str, flag: str, lo: int, hi: int | None = None) -> tuple[int, ...]:
    """A comma-separated list of integers from ``lo`` to ``hi`` (None: no limit), for ``flag``."""
    span = f"from {lo} to {hi}" if hi is not None else f"of at least {lo}"
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise SearchError(f"{flag}: expected a comma-separated list of integers {span}, got {text!r}") from None
    if not vals:
        raise SearchError(f"{flag}: expected at least one value")
    bad = [v for v in vals if v < lo or (hi is not None and v > hi)]
    if bad:
        raise SearchError(f"{flag}: expected integers {span}, got {bad[0]}")
    return vals


def _schedules(text: str) -> tuple[str, ...]:
    """--schedules: a comma-separated list of SEARCH_SCHEDULES, or ``all``."""
    if text.strip().lower() == "all":
        return SEARCH_SCHEDULES
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in names if x not in SEARCH_SCHEDULES]
    if not names or bad:
        raise SearchError(f"--schedules: expected a comma-separated list of {', '.join(SEARCH_SCHEDULES)}, or 'all'; "
                          f"got {bad[0] if bad else text!r}")
    return tuple(x for x in SEARCH_SCHEDULES if x in names)


def _top(text: str) -> int | None:
    """--simulate-top: a positive integer, or ``all`` (None)."""
    if text.strip().lower() == "all":
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise SearchError(f"--simulate-top: expected a positive integer or 'all', got {text!r}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", help="scenario YAML file with a model and training.global_batch")
    p.add_argument("--gpus", type=int, help="GPUs to lay the job out on (default: the scenario's cluster)")
    p.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE")
    p.add_argument("--jobs", type=int, default=1, help="worker processes")
    p.add_argument("--top", type=int, default=10, help="rows of the ranked table (default 10)")
    p.add_argument("--max-tp", type=int, help="largest TP (default: GPUs per node)")
    p.add_argument("--max-pp", type=int, help="largest PP (default: no limit)")
    p.add_argument("--max-cp", type=int, default=1, help="largest CP (default 1: no context parallelism)")
    p.add_argument("--micro-batches", default="1,2,4,8", help="micro-batch sizes to try (default 1,2,4,8)")
    p.add_argument("--zero", default="0,1,2,3", help="ZeRO stages to try (default 0,1,2,3)")
    p.add_argument("--schedules", default=",".join(DEFAULT_SCHEDULES), metavar="NAMES",
                   help=f"pipeline schedules to try when pp > 1, of {', '.join(SEARCH_SCHEDULES)}, or 'all' "
                        f"(default {','.join(DEFAULT_SCHEDULES)}; pp 1 runs 1f1b when it is listed)")
    p.add_argument("--exhaustive", action="store_true", help="also simulate more recompute than needed to fit")
    p.add_argument("--simulate-top", default=str(DEFAULT_SIMULATE_TOP), metavar="K",
                   help=f"simulate the K layouts the closed-form estimate ranks best, or 'all' "
                        f"(default {DEFAULT_SIMULATE_TOP})")
    p.add_argument("--max-points", type=int, default=DEFAULT_MAX_POINTS,
                   help=f"refuse to simulate more layouts than this (default {DEFAULT_MAX_POINTS})")
    p.add_argument("--db", help="results database (default: out/SCENARIO-search.sqlite)")
    p.add_argument("--csv", help="CSV of every simulated layout (default: next to --db)")
    p.add_argument("--dask", metavar="tcp://HOST:8786", help="simulate on a Dask cluster")


def search_command(args: argparse.Namespace) -> str:
    stem = os.path.splitext(os.path.basename(args.scenario))[0]
    db = args.db or os.path.join("out", f"{stem}-search.sqlite")
    if not args.db:
        try:
            os.makedirs("out", exist_ok=True)
        except OSError:
            pass  # the store names the unwritable folder in its own error
    csv_path = args.csv or os.path.splitext(db)[0] + ".csv"
    for name in ("max_tp", "max_pp", "max_cp", "gpus", "top", "max_points"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise SearchError(f"--{name.replace('_', '-')}: expected a positive integer, got {value}")
    top = _top(args.simulate_top)
    lim = Limits(args.max_tp, args.max_pp, args.max_cp, _ints(args.micro_batches, "--micro-batches", 1),
                 _ints(args.zero, "--zero", 0, 3), args.exhaustive, _schedules(args.schedules))
    executor = make_executor(args.jobs, args.dask)
    try:
        with ResultStore(db) as store:
            res = search(args.scenario, args.set, args.gpus, lim, store, executor, points_bar,
                         args.max_points, top)
    finally:
        close_executor(executor)
    export_csv(res.rows, csv_path)
    name = printable(res.scenario or stem)
    gpus = res.plan.gpus
    if not res.ranked:  # nothing feasible: no answer to print, and a script must not read one
        errors = [r for r in res.rows if r.status == "error"]
        why = (f"no layout fits in memory and runs (e.g. {errors[0].error})" if errors else
               "no layout fits in memory and runs" if res.rows else "every layout was pruned")
        raise SearchError(f"search: {name} on {gpus} GPUs: {why}: {prune_text(res.plan)}")
    done = f"{res.stats.ran} simulated now, {res.stats.skipped} from {db}; all results in {db} and {csv_path}"
    return "\n".join([report(res, name, gpus, args.top), done])
