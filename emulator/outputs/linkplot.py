"""Link utilisation of one run: which links are hot, and when.

``Result.link_series[link] = [(t, load B/s), ...]`` is piecewise constant: the
load holds from t until the next entry (or the end of the run). Over a time bin
[a, b) the utilisation of a link of capacity C is

    u = (∫_a^b load(t) dt) / ((b − a) · C)

(so 100 % means the link carried its full capacity for the whole bin; folded
runs count every copy's traffic). The busiest links are those with the largest
mean utilisation over the run, ∫ load dt / (T · C).
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from emulator.errors import EmulatorError
from emulator.outputs.figures import save_figure
from emulator.outputs.printable import figure_text
from emulator.result import Result

Series = Sequence[tuple[float, float]]


def cumulative(series: Series, times: np.ndarray) -> np.ndarray:
    """∫_0^t load for every t in ``times`` (load 0 before the first entry)."""
    if not series:
        return np.zeros_like(times, dtype=float)
    ts = np.array([t for t, _ in series], dtype=float)
    loads = np.array([x for _, x in series], dtype=float)
    # F at each breakpoint: the integral of the previous segments
    F = np.concatenate([[0.0], np.cumsum(loads[:-1] * np.diff(ts))])
    idx = np.searchsorted(ts, times, side="right") - 1
    out = np.zeros_like(times, dtype=float)
    inside = idx >= 0
    i = idx[inside]
    out[inside] = F[i] + loads[i] * (times[inside] - ts[i])
    return out


def utilisation(series: Series, capacity: float, t_end: float, bins: int) -> np.ndarray:
    """Mean utilisation (0..1) of one link in each of ``bins`` equal bins of [0, t_end]."""
    edges = np.linspace(0.0, t_end, bins + 1)
    F = cumulative(series, edges)
    width = t_end / bins
    return np.diff(F) / (width * capacity) if capacity > 0 and width > 0 else np.zeros(bins)


def busiest(link_series: Mapping[int, Series], capacity: Sequence[float], t_end: float, top: int) -> list[int]:
    """The ``top`` links by mean utilisation over [0, t_end] (ties: the lower link id)."""
    end = np.array([t_end])
    score = {l: float(cumulative(s, end)[0]) / (t_end * capacity[l])
             for l, s in link_series.items() if capacity[l] > 0 and t_end > 0}
    ranked = sorted((l for l in score if score[l] > 0), key=lambda l: (-score[l], l))
    return ranked[:top]


def plot_links(result: Result, path: str, top: int = 16, bins: int = 200) -> list[str]:
    """A heatmap of utilisation % (busiest links × time) of a run simulated with
    ``record_links=True``; writes ``path`` (PNG) and the same name with .svg."""
    from matplotlib.figure import Figure

    topo = result.topology
    t_end = max((s.end_s for s in result.spans), default=0.0)
    links = busiest(result.link_series, topo.capacity, t_end, top)
    if not links:
        raise EmulatorError("no link carried traffic in this run (was it simulated with record_links=True?)")
    grid = np.array([utilisation(result.link_series[l], topo.capacity[l], t_end, bins) for l in links]) * 100
    fig = Figure(figsize=(10, 0.35 * len(links) + 1.8))
    ax = fig.add_subplot()
    im = ax.imshow(grid, aspect="auto", cmap="inferno", vmin=0, vmax=max(100.0, float(grid.max())),
                   extent=(0, t_end * 1e3, len(links) - 0.5, -0.5), interpolation="nearest")
    ax.set_yticks(range(len(links)))
    ax.set_yticklabels([f"{topo.links[l][0]}→{topo.links[l][1]}  ({topo.capacity[l] / 1e9:.0f} GB/s)"
                        for l in links], fontsize=8)
    ax.set_xlabel("time (ms)")
    ax.set_title(f"{figure_text(result.scenario.name)}: utilisation of the {len(links)} busiest links")
    fig.colorbar(im, ax=ax, label="utilisation %")
    fig.tight_layout()
    return save_figure(fig, path)
