"""The report's pictures, as PNG bytes: the step-time breakdown as stacked bars, memory per pipeline
stage against the GPU's capacity, and the busiest links as a heatmap over the topology.

Each function takes plain numbers and names (no Result, no run), draws a matplotlib Figure
(no pyplot state) and returns the PNG. Text from the user (scenario names, node names) goes
through :func:`emulator.outputs.printable.figure_text`.

**Topology layout.** Nodes stand in tiers by their hop distance from the nearest GPU over the
links (GPUs 0, NVSwitches and NICs 1, leaves 2, spines 3, …; a node no GPU reaches sits one tier
above the rest), each tier in natural name order, spread evenly across the width. A cable (the
two directed links between two nodes) is drawn once, coloured by the busier direction's
utilisation; links with no recorded load are light grey. Above ``MAX_NODES`` nodes, only the
switches and the nodes at the ends of coloured links are drawn (the caption says how many).
"""
from __future__ import annotations

import io
import re
from collections import deque
from typing import Mapping, Sequence

from emulator.outputs.printable import figure_text

DPI = 110
COMPONENT_COLORS = {"compute": "#4C78A8", "bubble": "#BAB0AC", "other": "#54A24B"}
LANE_COLORS = ("#E45756", "#F58518", "#B279A2", "#9D755D", "#FF9DA6", "#EECA3B", "#D67195")  # exposed comm by lane
MEMORY_COLORS = {"params": "#4C78A8", "grads": "#72B7B2", "optimizer": "#54A24B", "activations": "#F58518",
                 "workspace": "#BAB0AC"}
MAX_NODES = 160
IDLE_LINK = "#DDDDDD"


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def part_color(name: str, lane_index: int = 0) -> str:
    """The colour of a breakdown part: compute, bubble, other, or the ``lane_index``-th exposed lane."""
    return COMPONENT_COLORS.get(name) or LANE_COLORS[lane_index % len(LANE_COLORS)]


def breakdown_png(runs: Sequence[tuple[str, Sequence[tuple[str, float]]]]) -> bytes:
    """One horizontal stacked bar per run (label, [(part, seconds), ...]), in milliseconds; parts
    named ``exposed comm: X`` are the exposed communication of lane X."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 1.6 + 0.5 * len(runs)))
    ax = fig.add_subplot()
    lanes: list[str] = []
    seen: set[str] = set()
    for i, (_label, parts) in enumerate(runs):
        left = 0.0
        for name, seconds in parts:
            if name not in COMPONENT_COLORS and name not in lanes:
                lanes.append(name)
            color = part_color(name, lanes.index(name) if name in lanes else 0)
            ax.barh(i, seconds * 1e3, left=left, color=color, edgecolor="white", linewidth=0.5,
                    label=name if name not in seen else None)
            seen.add(name)
            left += seconds * 1e3
    ax.set_yticks(range(len(runs)))
    ax.set_yticklabels([figure_text(label) for label, _ in runs])
    ax.invert_yaxis()
    ax.set_xlabel("time per iteration (ms)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    return _png(fig)


def memory_png(stages: Sequence[Mapping[str, float]], capacity: float | None, title: str) -> bytes:
    """One stacked bar per pipeline stage (part → bytes, in GiB) and a dashed line at ``capacity``."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(max(5.0, 1.0 + 0.5 * len(stages)), 4))
    ax = fig.add_subplot()
    parts = [p for p in MEMORY_COLORS if any(p in s for s in stages)]
    parts += sorted({p for s in stages for p in s} - set(parts))
    bottom = [0.0] * len(stages)
    for j, part in enumerate(parts):
        heights = [s.get(part, 0.0) / 2**30 for s in stages]
        ax.bar(range(len(stages)), heights, bottom=bottom, color=MEMORY_COLORS.get(part, LANE_COLORS[j % 7]),
               label=part, edgecolor="white", linewidth=0.5)
        bottom = [b + h for b, h in zip(bottom, heights)]
    if capacity:
        ax.axhline(capacity / 2**30, color="#D62728", linestyle="--", linewidth=1.2,
                   label=f"capacity {capacity / 2**30:.0f} GiB")
    ax.set_xticks(range(len(stages)))
    ax.set_xticklabels([str(i) for i in range(len(stages))])
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("memory per GPU (GiB)")
    ax.set_title(figure_text(title), fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return _png(fig)


def _natural(name: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def tiers(nodes: Mapping[str, str], edges: Sequence[tuple[str, str]]) -> dict[str, int]:
    """Each node's tier: its hop distance from the nearest GPU (``nodes``: name → kind), over the
    links in either direction; a node no GPU reaches gets one more than the highest tier."""
    near: dict[str, list[str]] = {n: [] for n in nodes}
    for u, v in edges:
        near.setdefault(u, []).append(v)
        near.setdefault(v, []).append(u)
    tier = {n: 0 for n, kind in nodes.items() if kind == "gpu"}
    queue = deque(sorted(tier, key=_natural))
    while queue:
        n = queue.popleft()
        for m in near.get(n, ()):
            if m not in tier:
                tier[m] = tier[n] + 1
                queue.append(m)
    top = max(tier.values(), default=0) + 1
    return {n: tier.get(n, top) for n in near}


def topology_png(nodes: Mapping[str, str], edges: Sequence[tuple[str, str]], utilisation: Mapping[str, float],
                 title: str) -> bytes:
    """The topology (``nodes``: name → kind gpu | nic | switch; ``edges``: directed links) with each
    cable coloured by its busier direction's utilisation (``utilisation``: "u->v" → 0..1)."""
    import matplotlib
    from matplotlib.cm import ScalarMappable
    from matplotlib.collections import LineCollection
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure

    cables: dict[tuple[str, str], float | None] = {}
    for u, v in edges:
        key = (u, v) if _natural(u) <= _natural(v) else (v, u)
        load = utilisation.get(f"{u}->{v}")
        old = cables.get(key)
        cables[key] = load if old is None else old if load is None else max(old, load)
    shown = set(nodes)
    caption = f"{len(nodes)} nodes, {len(cables)} cables"
    if len(nodes) > MAX_NODES:
        hot = {n for (u, v), load in cables.items() if load for n in (u, v)}
        shown = {n for n, kind in nodes.items() if kind == "switch"} | hot
        caption = f"{len(shown)} of {len(nodes)} nodes shown: the switches and the ends of busy links"
    tier = tiers(nodes, edges)
    rows: dict[int, list[str]] = {}
    for n in sorted(shown, key=_natural):
        rows.setdefault(tier.get(n, 0), []).append(n)
    pos = {}
    for t, names in rows.items():
        for i, n in enumerate(names):
            pos[n] = ((i + 0.5) / len(names), float(t))
    fig = Figure(figsize=(12, 1.6 + 1.1 * len(rows)))
    ax = fig.add_subplot()
    vmax = max(1.0, max((x for x in cables.values() if x), default=0.0))
    norm, cmap = Normalize(0.0, vmax * 100), matplotlib.colormaps["YlOrRd"]
    idle, busy, colors = [], [], []
    for (u, v), load in sorted(cables.items(), key=lambda kv: kv[1] or 0.0):
        if u not in pos or v not in pos:
            continue
        if load:
            busy.append([pos[u], pos[v]])
            colors.append(cmap(norm(load * 100)))
        else:
            idle.append([pos[u], pos[v]])
    ax.add_collection(LineCollection(idle, colors=IDLE_LINK, linewidths=0.6, zorder=1))
    ax.add_collection(LineCollection(busy, colors=colors, linewidths=2.2, zorder=2))
    marks = {"gpu": ("s", "#4C78A8"), "nic": ("o", "#72B7B2"), "switch": ("D", "#555555")}
    for kind, (marker, color) in marks.items():
        pts = [pos[n] for n in pos if nodes.get(n) == kind]
        if pts:
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=marker, s=18 if len(pos) > 64 else 40,
                       color=color, zorder=3, label=kind)
    if len(pos) <= 48:
        for n, (x, y) in pos.items():
            ax.annotate(figure_text(n), (x, y), textcoords="offset points", xytext=(0, 6), ha="center",
                        fontsize=7)
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.6, max(rows, default=0) + 0.9)
    ax.set_yticks(sorted(rows))
    ax.set_yticklabels([f"tier {t}" for t in sorted(rows)], fontsize=8)
    ax.set_xticks([])
    ax.set_title(f"{figure_text(title)}\n{caption}", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", ncol=3, framealpha=0.8)
    fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax, label="utilisation % (busier direction)")
    fig.tight_layout()
    return _png(fig)
