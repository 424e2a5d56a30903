"""A run alone kept at each of its event times, and the state it is in at any moment (pure: no SimPy).

A MoE dispatch run ahead of the clock (``Fabric._run_ahead``) that meets another flow is woken: its flows
go onto the fabric as its run alone has them at that moment (``Fabric._wake_plan``). The same plan, size
and joined flows are woken many times, at other moments (Qwen3-235B with a skewed load: 3,246 wakes of 36
such runs), so the run is recorded once (``fabric.record``) as a :class:`Trail`: after each time at which
events happened, the phase it is in, each flow's bytes left, last settle time, rate and whether it
streams, which flows have ended, and the bytes each path has moved. ``Trail.at(tau)`` is the state after
the last of those times before ``tau`` (a replay run until ``tau`` processes the events before it), and
:class:`Moment` moves it on to ``tau`` the way the fabric settles a flow (``Fabric._settle``): the same
operations in the same order, so a wake gives the numbers a replay to ``tau`` gave, to the last bit.
"""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Any, Protocol

from emulator.network.flows import FlowSpec

Path = tuple[tuple[int, ...], tuple[float, ...], float]  # a path's links, weights and the bytes it moved


class Twin:
    """A flow of the run alone at a moment: its path, bytes left, last settle time, rate, and whether it
    streams (its latency over, not ended)."""

    __slots__ = ("links", "weights", "remaining", "last", "rate", "started")

    def __init__(self, links: tuple[int, ...], weights: tuple[float, ...], remaining: float, last: float,
                 rate: float, started: bool) -> None:  # noqa: D107
        self.links, self.weights, self.remaining, self.last, self.rate = links, weights, remaining, last, rate
        self.started = started


@dataclass(frozen=True)
class Kept:
    """The run's state after the events of one time: its phase (−1 before the first), when that phase
    began, whether the plan is done, the phase's flows (``specs``), the twins of those flows and then of
    the joined flows, which of them have ended, and the bytes moved per path in the order paths first
    moved bytes."""

    phase: int
    began: float
    done: bool
    specs: tuple[FlowSpec, ...]
    twins: tuple[tuple[tuple[int, ...], tuple[float, ...], float, float, float, bool], ...]
    ended: tuple[bool, ...]
    paths: tuple[Path, ...]


class Trail:
    """The states of one run alone, each after the events of its time (times ascending)."""

    def __init__(self) -> None:  # noqa: D107
        self.times: list[float] = []
        self.kept: list[Kept] = []

    def add(self, time: float, kept: Kept) -> None:
        self.times.append(time)
        self.kept.append(kept)

    def at(self, tau: float) -> "Moment":
        """The run ``tau`` seconds after its start: the state after the last time before ``tau`` (the
        first state, kept before any event, where none is)."""
        k = max(0, bisect_left(self.times, tau) - 1)
        return Moment(self.kept[k], tau)


class Moment:
    """A kept state read at ``tau``: its twins copied (``settle`` moves one on to ``tau``), its paths'
    bytes copied (``bytes_on`` adds them per link)."""

    def __init__(self, kept: Kept, tau: float) -> None:  # noqa: D107
        self.phase, self.began, self.done, self.specs = kept.phase, kept.began, kept.done, kept.specs
        self.ended = kept.ended
        self.twins = [Twin(*t) for t in kept.twins]
        self.tau = tau
        self._paths: dict[tuple[int, int], list[Any]] = {(id(links), id(weights)): [links, weights, b]
                                                          for links, weights, b in kept.paths}

    def settle(self, f: Twin) -> None:
        """``Fabric._settle`` of ``f`` at ``tau`` (:func:`settle`)."""
        settle(f, self.tau, self._paths)

    def paths(self) -> list[list[Any]]:
        """The bytes the run has moved per path, [links, weights, bytes], in the order paths first moved."""
        return list(self._paths.values())

    def bytes_on(self) -> dict[int, float]:
        """Bytes per link the run has moved (``Fabric.bytes_on_link`` of a fresh fabric: paths in order)."""
        out: dict[int, float] = {}
        for links, weights, b in self._paths.values():
            for link, w in zip(links, weights):
                out[link] = out.get(link, 0.0) + w * b
        return out


class Settled(Protocol):
    """What :func:`settle` reads and writes of a flow (the fabric's Flow, a trail's Twin)."""

    links: tuple[int, ...]
    weights: tuple[float, ...]
    remaining: float
    last: float
    rate: float


def settle(f: Settled, now: float, paths: dict[tuple[int, int], list[Any]]) -> None:
    """The bytes ``f`` moved since it was last settled leave its remaining; they are kept per path (links,
    weights) in ``paths``, [links, weights, bytes] in the order paths first moved. The fabric's arithmetic
    (``Fabric._settle``), shared with :class:`Moment`, so that a trail read at a moment gives the fabric's
    numbers to the last bit."""
    if f.rate:
        moved = f.rate * (now - f.last)
        f.remaining = max(0.0, f.remaining - moved)
        key = (id(f.links), id(f.weights))
        hit = paths.get(key)
        if hit is None:
            paths[key] = [f.links, f.weights, moved]
        else:
            hit[2] += moved
    f.last = now
