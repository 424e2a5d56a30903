"""The fabric: flow-level links shared max-min fairly (SimGrid's model, no TCP terms).

A transfer is a *flow*: a set of directed links, each used with a weight (how many
times the flow crosses it: a ring channel crosses each of its hops once; an ECMP
split crosses each of k paths with weight 1/k; a folded flow carries the
multiplicity of its symmetric copies). A flow of rate r puts w·r on each link.

Life of a flow (DESIGN.md, "Network model"):
1. it pays its latency first, which loads no link;
2. it then streams at its max-min fair rate until its bytes are done;
3. rates are re-solved only for the connected component (flows ↔ links) that
   changed, and every change at one timestamp is solved together (the solve is
   deferred until no other event is left at the current time); a flow that starts
   on links carrying nothing else is its own component and gets its rate at once,
   and one that ends alone frees its links with no solve (a pipeline's transfers,
   mostly: the deferred solve would give the same rates, one event later; a flow
   that joins it at the same time is solved with it as before); a flow whose links
   carry nothing as its latency begins is *started ahead* (``_ahead``): its end is
   scheduled at once, as a lone flow's, with no event for its start, and a flow
   placed on one of its links before that end makes it an ordinary flow, on the
   clock or streaming since its start (``_wake``) — the same times and bytes, one
   event fewer per transfer (GPT 530B: 1.18M → 0.66M events); a MoE token dispatch's plan (its
   phases) whose links carry nothing is *run ahead* as a whole (``run_plan(ahead=True)``): its run
   alone on an idle fabric (kept per plan and size) gives its end, a flow that meets it before
   then puts the flows of its phase then on the fabric as they stand, its later phases following
   on the clock (``_wake_plan``); flows started ahead on its links that have not begun to stream
   are *joined* to it and run with it (their run together kept per plan, size and joined flows);
   the same times but for the rounding of a shifted sum (``PLANS_AHEAD`` False runs it flow by
   flow; DeepSeek-V3 1024: 4.17M → 1.25M events alone, 0.27M with joined flows, its iteration time
   the same to 13 digits);
4. completions are scheduled lazily; one whose flow version is stale is ignored.

Links as bits: the links a flow started ahead or a plan run ahead holds, and the links that may carry
flows, are kept as sets of bits in Python ints (``_m_lazy``, ``_m_plan``, ``_m_on``; a link's bit is given
as flows first use it, so an int spans the links in use), so that whether a
flow's links are free is an ``&`` in C, not a walk of its links (a folded tensor-parallel pair's ring
crosses the NVLinks of every rank it stands for: 128 on DeepSeek-V3's layout, and those walks were most
of its run: 8.8 → 5.5 s of CPU, the same times to the last bit). The bytes a flow moves are kept per
path (its links and weights) as the clock settles them, and added link by link when ``bytes_on_link``
is read (a link's sum in another order: its last digits can differ).

Timeouts carry their flow as the event value to one shared callback (no closure
per flow or completion: fewer allocations, less garbage-collector work).

Determinism: the flows on a link are kept in an insertion-ordered dict, not a set.
A set of Flow objects iterates in the order of their identity hashes (addresses),
which differ from run to run; the order of a component's flows decides the order in
which loads are summed, and so the last bits of the link-load series.

Time-varying links (emulator.run.faults): ``set_capacity`` changes a link's capacity
in the middle of a run (its component is re-solved at once: a link of capacity 0
stalls its flows); ``reroute`` moves an in-flight flow's remaining bytes onto
other links; ``rewrite``, when set, may change the links of every flow as it
starts (a detour around a failed link).

The rates are max-min fair (``emulator.network.maxmin``, pure: progressive filling).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import simpy

from emulator.network.flows import FlowSpec, Plan
from emulator.network.maxmin import INF, alone_rate, max_min_rates
from emulator.network.trail import Kept, Trail, settle

__all__ = ["PLANS_AHEAD", "Alone", "Fabric", "Flow", "alone", "delay_to", "max_min_rates"]

# Whether ``run_plan(ahead=True)`` may run a plan ahead of the clock (``Fabric._run_ahead``). False runs
# every plan on the clock, flow by flow: the exact path the fast one is checked against (tests/test_fabric_ahead.py).
PLANS_AHEAD = True
# A component of at least this many flows has its rates remembered (``Fabric._rates_of``). Measured on
# Qwen3-235B with the 1F1B all-to-all overlap: 32-flow dispatch mixes take 1.4 ms to solve and 60 µs to
# look up, 4-flow ones 0.44 ms to solve; 12,792 solves held 300 distinct mixes. The run's CPU went
# 22.1 → 10.9 s from 8 flows up, 9.9 s from 4.
RATE_MEMO_FLOWS = 4
RATE_MEMO_SIZE = 4096  # mixes remembered: a key holds references to its flows' tuples, ~2 kB at 32 flows


MASKS_KEPT = 4096  # link tuples whose bits are remembered (``Fabric._mask``); the memo starts again past it


def delay_to(now: float, at: float) -> float:
    """A delay d with now + d == at exactly, as SimPy adds them (at − now alone can miss ``at`` by
    an ulp: then an op put off to ``at`` would start an ulp away from the end it waited for)."""
    d = at - now
    for _ in range(4):
        t = now + d
        if t == at:
            break
        d = math.nextafter(d, math.inf if t < at else -math.inf)
    return d


class Flow:
    """One flow in the fabric. ``links``/``weights`` are parallel tuples."""

    __slots__ = ("links", "weights", "remaining", "rate", "version", "last", "done", "mark", "lazy", "hmask")

    def __init__(self, links: tuple[int, ...], weights: tuple[float, ...], nbytes: float,
                 done: Callable[[], None]) -> None:
        self.links = links
        self.weights = weights
        self.remaining = nbytes
        self.rate = 0.0
        self.version = 0
        self.last = 0.0
        self.done = done
        self.mark = 0
        self.lazy = False  # started ahead of the clock, alone, on no link's list yet (``Fabric._ahead``)
        self.hmask = 0  # while lazy: the bits of its links that can bind (``Fabric._ahead``)


class Fabric:
    """Max-min fair flow fabric over links with capacities in B/s."""

    def __init__(self, env: simpy.Environment, capacity: Sequence[float]) -> None:
        self.env = env
        self.capacity = list(capacity)
        # the flows on each link, in arrival order (a dict as an ordered set: see the module doc)
        self.on_link: list[dict[Flow, None] | None] = [None] * len(self.capacity)
        self._dirty: set[int] = set()
        self._pending = False
        self._mark = 0
        self.solves = 0
        self._bytes = [0.0] * len(self.capacity)
        # bytes the clock settled, per flow path, not yet added link by link (``_settle``): (id(links),
        # id(weights)) → [links, weights, bytes]; the entry holds its tuples, so their ids stay theirs
        self._path_bytes: dict[tuple[int, int], list[Any]] = {}
        # bytes a run alone moved, owed to the links (``owe``): (link, bytes) pairs and how many times
        self._owed: dict[int, list[Any]] = {}
        # called after every re-solve with (time, {link: load in B/s}) of the component
        self.listeners: list[Callable[[float, dict[int, float]], None]] = []
        # called on every flow as it starts; may change its links and weights (emulator.run.faults)
        self.rewrite: Callable[[Flow], None] | None = None
        # links no flow mix can fill (emulator.network.slack): left out of components and solves
        self.slack = bytearray(len(self.capacity))
        self.bind: list[float] = self.capacity  # the capacities the solver sees (slack links: inf)
        # (links, weights) → the rate of a flow alone on them, those of them that are not slack, and their bits
        self._alone: dict[tuple[tuple[int, ...], tuple[float, ...]], tuple[float, tuple[int, ...], int]] = {}
        # Links are sets of bits in Python ints (bit l: link l), so that "does this flow meet any of those"
        # is one ``&`` in C, not a walk of its links (a folded TP pair's ring crosses 128 NVLinks).
        # The flows started ahead of the clock (``_ahead``) and the bits of their links that can bind; the
        # plans run ahead (``run_plan(ahead=True)``) and theirs. No two of them share a link.
        self._lazy_on: dict[Flow, None] = {}
        self._m_lazy = 0
        self._plan_on: dict[_Ahead, None] = {}
        self._m_plan = 0
        # the links whose list of flows (``on_link``) may be non-empty: set as flows go on, cleared as found empty
        self._m_on = 0
        self._masks: dict[int, tuple[tuple[int, ...], int]] = {}  # id(links) → (links, their bits)
        self._bit = [-1] * len(self.capacity)  # link → its bit (``_bits``), -1 until it has one
        self._link_of: list[int] = []  # bit → its link
        # (id(plan), bytes, the lazy flows it meets) → its run alone (with them), and its trail once a wake needs it
        self._solo: dict[tuple[object, ...], tuple[Plan, Alone, list[Trail | None]]] = {}
        # id(plan) → the links of it that can bind, and their bits
        self._hard: dict[int, tuple[Plan, tuple[int, ...], int]] = {}
        # a component's flows' (links, weights), in order → their max-min rates (``_rates_of``)
        self._rates: dict[tuple[tuple[tuple[int, ...], tuple[float, ...]], ...], list[float]] = {}
        self.woken = 0  # plans run ahead that a flow met before their end (run on the clock from then)
        self.joined = 0  # flows started ahead that a plan run ahead took in (``_run_ahead``)

    @property
    def _lazies(self) -> int:
        """How many flows are started ahead of the clock."""
        return len(self._lazy_on)

    @property
    def _aheads(self) -> int:
        """How many plans are run ahead of the clock."""
        return len(self._plan_on)

    def _bits(self, links: Sequence[int]) -> int:
        """The set of ``links`` as the bits of an int. Links get their bits as they first come here (the
        links flows use, in order), so that an int spans the links in use, not the whole fabric's (GPT
        530B: 1,615 of 15,440; an ``|`` or ``&`` walks its digits)."""
        bit, m = self._bit, 0
        for link in links:
            b = bit[link]
            if b < 0:
                b = bit[link] = len(self._link_of)
                self._link_of.append(link)
            m |= 1 << b
        return m

    def _lowest(self, mask: int) -> int:
        """The lowest link of a non-empty set of bits."""
        link_of, low = self._link_of, len(self.capacity)
        while mask:
            b = mask & -mask
            low = min(low, link_of[b.bit_length() - 1])
            mask ^= b
        return low

    def _mask(self, links: tuple[int, ...]) -> int:
        """The bits of ``links`` (kept per tuple: a plan's flows recur)."""
        hit = self._masks.get(id(links))
        if hit is None or hit[0] is not links:
            if len(self._masks) >= MASKS_KEPT:
                self._masks.clear()
            hit = self._masks[id(links)] = (links, self._bits(links))
        return hit[1]

    def _empty(self, links: tuple[int, ...], mask: int) -> bool:
        """Whether no flow is on any of ``links`` (of bits ``mask``) now; if so, their bits leave ``_m_on``."""
        on_link = self.on_link
        for link in links:
            if on_link[link]:
                return False
        self._m_on &= ~mask
        return True

    def set_slack(self, links: set[int]) -> None:
        """Leave ``links`` out of components and solves (``emulator.network.slack``: they never
        bind); their bytes and loads are still counted. Call before the first flow starts."""
        self.slack = bytearray(len(self.capacity))
        for link in links:
            self.slack[link] = 1
        self.bind = [INF if sl else c for c, sl in zip(self.capacity, self.slack)] if links else self.capacity
        self._alone.clear()
        self._hard.clear()
        self._rates.clear()

    # -- the narrow interface -------------------------------------------------
    def transfer(self, links: tuple[int, ...], weights: tuple[float, ...], nbytes: float,
                 latency: float, done: Callable[[], None]) -> Flow:
        """Move ``nbytes`` over the links after ``latency``; call ``done()`` at the end."""
        flow = Flow(links, weights, nbytes, done)
        if latency > 0.0:
            if not (self.rewrite is None and not self.listeners and self._ahead(flow, self.env.now + latency)):
                self.env.timeout(latency, flow).callbacks.append(self._started)
        else:
            self._start(flow)
        return flow

    def transfer_at(self, at: float, links: tuple[int, ...], weights: tuple[float, ...], nbytes: float,
                    latency: float, done: Callable[[], None]) -> Flow:
        """``transfer`` as called at ``at``, a time ahead of the clock, called now: the flow begins at
        ``at + latency``, as there (started ahead where its links carry nothing now, ``_ahead``: a flow
        placed on them before then starts it on the clock at its time; else one event at that time)."""
        flow = Flow(links, weights, nbytes, done)
        begin = at + latency
        if latency > 0.0 and self.rewrite is None and not self.listeners and self._ahead(flow, begin):
            return flow
        self.env.timeout(delay_to(self.env.now, begin), flow).callbacks.append(self._started)
        return flow

    def _ahead(self, f: Flow, at: float) -> bool:
        """Start ``f`` at ``at`` (after its latency) ahead of the clock, if its links carry nothing
        now: as a flow alone from ``at``, with its end scheduled and no event for its start.

        It stays *lazy* (on no link's list) until a flow is placed on one of its links, or it
        ends. A placement at or after ``at`` finds it streaming alone since ``at`` (``_wake`` puts
        it on its links as placed then: the same rate, the same bytes moved); one before ``at``
        starts it on the clock at ``at``, as it would have been. Until then its links carry
        nothing else, so it is alone, as its start would have found it: the same times, rates and
        bytes, one event fewer per transfer (a pipeline's transfers, mostly). Not with listeners
        (they see each load change at its time) nor with a ``rewrite`` (timed faults)."""
        if f.remaining <= 0.0 or not f.links:
            return False
        r, hard, hm = self._alone_on(f)
        if hm & self._m_lazy or hm & self._m_plan or (hm & self._m_on and not self._empty(hard, hm)):
            return False
        if not r > 0.0:
            return False
        delay = f.remaining / r
        if delay == INF:
            return False
        f.rate, f.last, f.version, f.lazy, f.hmask = r, at, 1, True, hm
        self._m_lazy |= hm
        self._lazy_on[f] = None
        self.env.timeout(delay_to(self.env.now, at + delay), (f, 1)).callbacks.append(self._finished)
        return True

    def _wake(self, f: Flow) -> None:
        """Lazy flow ``f`` meets a flow placed on one of its links now: from now on it is an
        ordinary flow (see ``_ahead``)."""
        self._unmark(f)
        now = self.env.now
        if now < f.last:  # not started yet: it starts on the clock, at its time
            f.rate = 0.0
            f.version += 1  # its scheduled end is stale
            self.env.timeout(delay_to(now, f.last), f).callbacks.append(self._started)
            return
        on_link = self.on_link
        for link in f.links:  # streaming alone since f.last: on its links, as placed then
            s = on_link[link]
            if s is None:
                s = on_link[link] = {}
            s[f] = None
        self._m_on |= self._mask(f.links)

    def _unmark(self, f: Flow) -> None:
        """Lazy flow ``f`` is lazy no more (woken, or ended)."""
        self._m_lazy ^= f.hmask  # its bits, and no other lazy flow's
        del self._lazy_on[f]
        f.lazy = False

    def _alone_on(self, f: Flow) -> tuple[float, tuple[int, ...], int]:
        """The rate of ``f`` alone on its links (it depends on them only: a plan's flows recur), those
        of its links that are not slack, and their bits."""
        key = (f.links, f.weights)
        hit = self._alone.get(key)
        if hit is None:
            hard = tuple(l for l in f.links if not self.slack[l])
            hit = self._alone[key] = (alone_rate(f, self.bind), hard, self._bits(hard))
        return hit

    def _wake_all(self) -> None:
        """Every lazy flow or plan becomes an ordinary one (before links change or are inspected)."""
        # in the order of their lowest links, as a walk of the links finds them; those on no link that can
        # bind (slack only) are never met, and stay as they are
        for a in sorted((a for a in self._plan_on if a.mask), key=lambda a: self._lowest(a.mask)):
            self._wake_plan(a)
        for f in sorted((f for f in self._lazy_on if f.hmask), key=lambda f: self._lowest(f.hmask)):
            self._wake(f)

    def set_capacity(self, link: int, capacity: float) -> None:
        """The link's capacity (B/s) is ``capacity`` from now on; its flows are re-solved (and no
        link is slack any more: the proof took the capacities as they were)."""
        self._wake_all()
        self.capacity[link] = capacity
        self._alone.clear()
        self._hard.clear()
        self._rates.clear()
        self._solo.clear()
        if self.bind is not self.capacity:
            self.slack = bytearray(len(self.capacity))
            self.bind = self.capacity
        self._dirty.add(link)
        self._request_solve()

    def flows_on(self, link: int) -> list[Flow]:
        """The flows streaming over ``link`` now, in arrival order."""
        self._wake_all()
        return list(self.on_link[link] or ())

    def reroute(self, flow: Flow, links: tuple[int, ...], weights: tuple[float, ...]) -> None:
        """An in-flight flow's remaining bytes go over ``links`` from now on."""
        self._wake_all()
        self._settle(flow, self.env.now)
        on_link = self.on_link
        for link in flow.links:
            s = on_link[link]
            assert s is not None  # the flow was added to every link of its own
            s.pop(flow, None)
            self._dirty.add(link)
        flow.links, flow.weights = links, weights
        flow.rate = 0.0
        flow.version += 1  # its scheduled completion is stale
        self._place(flow)
        self._request_solve()  # the old links' survivors speed up

    def _started(self, event: simpy.Event) -> None:
        """A flow's latency is over (the timeout's value is the flow)."""
        self._start(event.value)  # type: ignore[arg-type]  # simpy types every value Optional[Any]

    # -- internals ------------------------------------------------------------
    def _start(self, flow: Flow) -> None:
        if self.rewrite is not None:
            self.rewrite(flow)
        if flow.remaining <= 0.0 or not flow.links:
            flow.done()
            return
        flow.last = self.env.now
        self._place(flow)

    def _place(self, flow: Flow) -> None:
        """Put ``flow`` on each of its links (insertion-ordered sets) and ask for a re-solve; a flow
        whose links carry nothing else is its own component, and gets its rate at once."""
        on_link, slack = self.on_link, self.slack
        fm = self._mask(flow.links)
        met = self._owners(fm) if fm & self._m_plan or fm & self._m_lazy else None
        alone = True
        for link in flow.links:
            if met:  # a plan run ahead or a flow started ahead on this link is woken as the flow reaches it
                o = met.pop(link, None)
                if type(o) is _Ahead:
                    if o in self._plan_on:
                        self._wake_plan(o)
                elif o is not None and o.lazy:
                    self._wake(o)
            s = on_link[link]
            if s is None:
                s = on_link[link] = {}
            elif s and not slack[link]:
                alone = False
            s[flow] = None
        self._m_on |= fm
        if alone:
            self._assign_alone(flow)
            return
        self._dirty.update(flow.links)
        self._request_solve()

    def _owners(self, mask: int) -> dict[int, Any]:
        """Link → the plan run ahead or the flow started ahead that holds it, for the links of ``mask``
        that one holds."""
        out: dict[int, Any] = {}
        for a in self._plan_on:
            if a.mask & mask:
                for link in a.links:
                    out[link] = a
        for f in self._lazy_on:
            if f.hmask & mask:
                for link in self._alone_on(f)[1]:
                    out[link] = f
        return out

    def _assign_alone(self, f: Flow) -> None:
        """``_assign([f])`` of a flow alone on its links (the usual case: one call, no lists)."""
        r = self._alone_on(f)[0]
        if not (f.rate == r and f.version):
            self._settle(f, self.env.now)
            f.rate = r
            f.version += 1
            delay = f.remaining / r if r > 0.0 else INF
            if delay != INF:  # else it cannot progress (zero capacity): reported as a deadlock
                self.env.timeout(delay, (f, f.version)).callbacks.append(self._finished)
        if self.listeners:
            self._report([f])

    def _request_solve(self) -> None:
        if not self._pending:
            self._pending = True
            self.env.timeout(0.0).callbacks.append(self._solve)

    def _solve(self, _event: object = None) -> None:
        env = self.env
        if env.peek() == env.now:  # more changes at this timestamp: solve them together
            env.timeout(0.0).callbacks.append(self._solve)
            return
        self._pending = False
        self.solves += 1
        self._mark += 1
        mark = self._mark
        dirty, self._dirty = self._dirty, set()
        seen_links: set[int] = set()
        slack = self.slack
        for link in dirty:
            if link in seen_links or slack[link]:
                continue
            flows = self._component(link, seen_links, mark)
            if flows:
                self._assign(flows)
            elif self.listeners:
                for cb in self.listeners:
                    cb(self.env.now, {link: 0.0})
        if self.listeners:  # a slack link's load, once its flows' rates are all settled
            loads = {link: self.link_load(link) for link in dirty if slack[link]}
            if loads:
                for cb in self.listeners:
                    cb(self.env.now, loads)

    def _component(self, start: int, seen_links: set[int], mark: int) -> list[Flow]:
        flows: list[Flow] = []
        stack = [start]
        seen_links.add(start)
        on_link, slack = self.on_link, self.slack
        while stack:
            link = stack.pop()
            s = on_link[link]
            if not s:
                continue
            for f in s:
                if f.mark == mark:
                    continue
                f.mark = mark
                flows.append(f)
                for l2 in f.links:
                    if l2 not in seen_links and not slack[l2]:
                        seen_links.add(l2)
                        stack.append(l2)
        return flows

    def _assign(self, flows: list[Flow]) -> None:
        if len(flows) == 1:
            self._assign_alone(flows[0])
            return
        now = self.env.now
        for f, r in zip(flows, self._rates_of(flows)):
            if f.rate == r and f.version:
                continue
            self._settle(f, now)
            f.rate = r
            f.version += 1
            delay = f.remaining / r if r > 0.0 else INF
            if delay == INF:
                continue  # cannot progress (zero capacity); reported as a deadlock
            self.env.timeout(delay, (f, f.version)).callbacks.append(self._finished)
        if self.listeners:
            self._report(flows)

    def _rates_of(self, flows: list[Flow]) -> list[float]:
        """The max-min rates of a component, remembered by its flows' (links, weights) in order where it has
        at least RATE_MEMO_FLOWS flows: the same mix recurs (an EP group's dispatch, micro-batch after
        micro-batch), and its rates depend on nothing else while the capacities stand (set_capacity and
        set_slack forget them). The memo starts again past RATE_MEMO_SIZE mixes."""
        if len(flows) < RATE_MEMO_FLOWS:
            return max_min_rates(flows, self.bind)
        key = tuple([(f.links, f.weights) for f in flows])
        hit = self._rates.get(key)
        if hit is None:
            if len(self._rates) >= RATE_MEMO_SIZE:
                self._rates.clear()
            hit = self._rates[key] = max_min_rates(flows, self.bind)
        return hit

    def _report(self, flows: list[Flow]) -> None:
        """Tell the listeners the load the re-solved ``flows`` put on their links now."""
        loads: dict[int, float] = {}
        slack = self.slack
        for f in flows:
            for link, w in zip(f.links, f.weights):
                if not slack[link]:
                    loads[link] = loads.get(link, 0.0) + w * f.rate
                elif link not in loads:  # other components' flows cross it too
                    loads[link] = self.link_load(link)
        now = self.env.now
        for cb in self.listeners:
            cb(now, loads)

    def _settle(self, f: Flow, now: float) -> None:
        """The bytes ``f`` moved since it was last settled leave its remaining; they are kept per path
        (links, weights), and added to each link when ``bytes_on_link`` is read (trail.py ``settle``)."""
        settle(f, now, self._path_bytes)

    def _finished(self, event: simpy.Event) -> None:
        """A scheduled completion: the timeout's value is (flow, its version when scheduled)."""
        flow, version = event.value  # type: ignore[misc]  # simpy types every value Optional[Any]
        self._finish(flow, version)

    def _finish(self, f: Flow, version: int) -> None:
        if f.version != version:
            return  # stale completion
        self._settle(f, self.env.now)
        f.remaining = 0.0
        f.version += 1
        if f.lazy:  # alone to its end, on no link's list
            self._unmark(f)
            f.done()
            return
        on_link, slack = self.on_link, self.slack
        alone = True
        for link in f.links:
            s = on_link[link]
            assert s is not None  # the flow was added to every link of its own
            s.pop(f, None)
            if s and not slack[link]:
                alone = False
        if alone:  # it ran alone: no survivor to speed up; its links report 0 load (a slack link, the rest's)
            if self.listeners:
                now = self.env.now
                for link in f.links:
                    load = self.link_load(link) if slack[link] else 0.0
                    for cb in self.listeners:
                        cb(now, {link: load})
        else:
            self._dirty.update(f.links)  # survivors speed up; an emptied link reports 0 load
            self._request_solve()
        f.done()

    def run_plan(self, plan: Plan, nbytes: float, done: Callable[[], None], ahead: bool = False) -> None:
        """Run a collective's or transfer's flow ``plan`` for a buffer of ``nbytes`` from now: its
        phases one after the other, each flow of a phase started together (``transfer``); call
        ``done()`` when the last flow of the last phase is done (an empty plan: at once).

        With ``ahead``, a plan of several flows whose links carry nothing now is run ahead of the clock
        (``_run_ahead``): one event for its end instead of two per flow and a solve per change."""
        if not plan:
            done()
            return
        if len(plan) == 1 and len(plan[0]) == 1:  # one flow (a TP pair's ring, mostly): ``_phase``'s, without its count
            f = plan[0][0]
            self.transfer(f.links, f.weights, nbytes * f.volume, f.latency, done)
            return
        if ahead and PLANS_AHEAD and self.rewrite is None and not self.listeners \
                and self._run_ahead(plan, nbytes, done):
            return
        self._phase(plan, 0, nbytes, done)

    def _run_ahead(self, plan: Plan, nbytes: float, done: Callable[[], None]) -> bool:
        """Run ``plan`` as it runs alone (``alone``, once per plan and size), if none of its links
        that can bind carries a flow now: its end is scheduled at once and its links are marked. A
        flow placed on one of them before that end wakes it (``_wake_plan``): its flows are put on
        the fabric as the run alone has them then, and run on the clock from there. Until then its
        links carry nothing else, so max-min sharing is among its own flows, as alone: the same
        rates, phases of latency and ends (shifted by the start; the last bits of a sum may differ).

        Links that carry flows started ahead (``_ahead``) that have not begun to stream yet do not stop
        it: those flows are alone on their links, so the plan and they are a component of their own
        until another flow meets one of them; they are *joined* to the plan and run with it (``alone``
        with ``extras``, kept per plan, size and the joined flows' links, bytes and offsets: the same
        recur every micro-batch), each ending at its time there. A flow that meets any of them wakes
        all of them (``_wake_plan``)."""
        hit_hard = self._hard.get(id(plan))
        if hit_hard is None:
            slack = self.slack
            bind = tuple(sorted({l for phase in plan for f in phase for l in f.links if not slack[l]}))
            hit_hard = self._hard[id(plan)] = (plan, bind, self._bits(bind))
        hard, mask = hit_hard[1], hit_hard[2]
        if mask & self._m_plan or (mask & self._m_on and not self._empty(hard, mask)):
            return False
        now = self.env.now
        extras: tuple[Flow, ...] = ()
        if mask & self._m_lazy:  # in the order of the first of its links each holds
            met = sorted((f for f in self._lazy_on if f.hmask & mask), key=lambda f: self._lowest(f.hmask & mask))
            for f in met:
                if f.last < now:  # streaming already: its bytes so far are the clock's to settle
                    return False
            extras = tuple(met)
        joined: tuple[Extra, ...] = tuple((f.links, f.weights, f.remaining, f.last - now) for f in extras)
        key: tuple[object, ...] = (id(plan), nbytes, *joined)
        hit = self._solo.get(key)
        if hit is None:
            holder: list[Trail | None] = [None]
            hit = self._solo[key] = (plan, alone(plan, nbytes, self.capacity, joined, record=False), holder)
        solo = hit[1]
        if extras:
            marked = set(hard)
            for f in extras:  # on no link's list: ended by the group from now on (its own end is stale)
                marked.update(self._alone_on(f)[1])
                mask |= f.hmask
                self._unmark(f)
                f.version += 1
            hard = tuple(sorted(marked))
            self.joined += len(extras)
        a = _Ahead(plan, nbytes, done, now, solo, hard, extras, mask, joined, hit[2])
        self._m_plan |= mask
        self._plan_on[a] = None
        self.env.timeout(solo.duration, a).callbacks.append(self._ahead_ended)
        for i, end in enumerate(solo.ends):
            self.env.timeout(end, (a, i)).callbacks.append(self._joined_ended)
        return True

    def _unmark_plan(self, a: "_Ahead") -> None:
        self._m_plan ^= a.mask  # its bits, and no other plan's
        del self._plan_on[a]

    def _ahead_ended(self, event: simpy.Event) -> None:
        a: _Ahead = event.value  # type: ignore[assignment]  # simpy types every value Optional[Any]
        if a.woken:
            return
        a.ended_plan = True
        self._member_ended(a)
        a.done()

    def _joined_ended(self, event: simpy.Event) -> None:
        """A flow joined to a plan run ahead ends at its time in their run together."""
        a, i = event.value  # type: ignore[misc]  # simpy types every value Optional[Any]
        if a.woken:
            return
        a.ended[i] = True
        f = a.extras[i]
        f.remaining = 0.0
        f.rate = 0.0
        f.version += 1
        self._member_ended(a)
        f.done()

    def _member_ended(self, a: "_Ahead") -> None:
        """One of a plan run ahead and its joined flows has ended; after the last, its links are free."""
        a.left -= 1
        if a.left:
            return
        self._unmark_plan(a)
        self.owe(a.solo.link_bytes)

    def _wake_plan(self, a: "_Ahead") -> None:
        """Plan ``a``, run ahead, meets a flow now: its run alone is read at now (its trail, recorded on a
        fresh fabric as ``alone`` runs it at the first wake of a plan run ahead alike: trail.py), and each
        flow of its phase then, and each flow joined to it, goes on this fabric as it stands there: ended,
        waiting out its latency, or streaming with its bytes left; the plan's later phases follow on the
        clock (``_run_ahead``)."""
        self._unmark_plan(a)
        a.woken = True
        self.woken += 1
        now = self.env.now
        trail = a.trail[0]
        if trail is None:
            trail = a.trail[0] = _Replay(a, self.capacity).record()
        replay = trail.at(now - a.start)
        n = len(replay.specs)
        left = [n - sum(replay.ended[:n])]
        p = replay.phase

        def one_done() -> None:
            left[0] -= 1
            if left[0] == 0:
                self._next_phase(a.plan, p, a.nbytes, a.done)

        on_link = self.on_link
        specs = [(f.links, f.weights) for f in replay.specs] + [(f.links, f.weights) for f in a.extras]
        for i, ((links, weights), twin, end) in enumerate(zip(specs, replay.twins, replay.ended)):
            joined = a.extras[i - n] if i >= n else None
            if (a.ended[i - n] if joined is not None else a.ended_plan or replay.done):
                continue  # its end came on the clock already, or the plan's last phase is over
            if end:
                if joined is not None:  # ends now: as on the clock, at this time
                    self._ended_later(joined)
                continue
            started = twin.started
            if started:
                replay.settle(twin)
            if joined is None:
                flow = Flow(links, weights, twin.remaining, one_done)
            else:
                flow = joined
                flow.remaining = twin.remaining
                flow.version += 1  # its end in the run together is stale
            if not started:
                flow.rate = 0.0
                at = a.start + replay.began + replay.specs[i].latency if joined is None else joined.last
                self.env.timeout(delay_to(now, at), flow).callbacks.append(self._started)
                continue
            flow.last, flow.rate = now, twin.rate
            if joined is None:
                flow.version = 1
            for link in flow.links:
                s = on_link[link]
                if s is None:
                    s = on_link[link] = {}
                s[flow] = None
            self._m_on |= self._mask(flow.links)
            if twin.rate > 0.0:
                self.env.timeout(flow.remaining / twin.rate, (flow, flow.version)).callbacks.append(self._finished)
            self._dirty.update(flow.links)
        moved, replayed = self._bytes, replay.bytes_on()
        for link in {link for phase in a.plan for f in phase for link in f.links} | \
                {link for f in a.extras for link in f.links}:
            moved[link] += replayed.get(link, 0.0)
        if replay.done and not a.ended_plan:
            self.env.timeout(0.0).callbacks.append(lambda _e: a.done())
        self._request_solve()

    def _ended_later(self, f: Flow) -> None:
        """A flow joined to a plan ends now, in the replay of their run together: its ``done`` is called
        by an event at this time, as its end on the clock would be."""
        f.remaining = 0.0
        f.rate = 0.0
        f.version += 1
        self.env.timeout(0.0).callbacks.append(lambda _e: f.done())

    def _phase(self, plan: Plan, p: int, nbytes: float, done: Callable[[], None]) -> None:
        flows = plan[p]
        if not flows:
            self._next_phase(plan, p, nbytes, done)
            return
        left = [len(flows)]

        def one_done() -> None:
            left[0] -= 1
            if left[0] == 0:
                self._next_phase(plan, p, nbytes, done)

        for f in flows:
            self.transfer(f.links, f.weights, nbytes * f.volume, f.latency, one_done)

    def _next_phase(self, plan: Plan, p: int, nbytes: float, done: Callable[[], None]) -> None:
        if p + 1 < len(plan):
            self._phase(plan, p + 1, nbytes, done)
        else:
            done()

    @property
    def bytes_on_link(self) -> list[float]:
        """Bytes each link has carried so far: what the clock settled, and what runs alone owe (``owe``)."""
        pending = self._path_bytes
        if pending:  # in the order the paths first moved bytes
            moved = self._bytes
            for links, weights, b in pending.values():
                for link, w in zip(links, weights):
                    moved[link] += w * b
            pending.clear()
        owed = self._owed
        if owed:
            moved = self._bytes
            for pairs, times in owed.values():
                for link, b in pairs:
                    moved[link] += b * times
            owed.clear()
        return self._bytes

    def owe(self, pairs: Sequence[tuple[int, float]]) -> None:
        """A run alone (a plan run ahead, a private collective, a block's collectives) moved ``pairs``,
        (link, bytes), once more: counted here, added to ``bytes_on_link`` when it is read, as bytes × times
        (each distinct run's pairs are walked once, not once per run: they recur every micro-batch)."""
        hit = self._owed.get(id(pairs))
        if hit is None:
            self._owed[id(pairs)] = [pairs, 1]
        else:
            hit[1] += 1

    def link_load(self, link: int) -> float:
        """Current load Σ w·r on a link (B/s)."""
        s = self.on_link[link]
        if not s:
            return 0.0
        total = 0.0
        for f in s:
            links = f.links
            if links.count(link) == 1:  # a link once on a path (as routes give it): found in C
                total += f.weights[links.index(link)] * f.rate
                continue
            for l2, w in zip(links, f.weights):
                if l2 == link:
                    total += w * f.rate
        return total


class _Replay:
    """A plan run ahead (``_Ahead``) and its joined flows run alone on a fresh fabric, as ``alone`` ran them (the
    same flows started in the same order), kept after each of its event times (``record``: trail.py) for the
    wakes of every plan run ahead with the same plan, size and joined flows."""

    def __init__(self, a: "_Ahead", capacity: Sequence[float]) -> None:  # noqa: D107
        self.env = simpy.Environment()
        self.fabric = Fabric(self.env, capacity)
        self.fabric.listeners.append(lambda _t, _l: None)  # as ``alone``: no flow started ahead there
        self.plan, self.nbytes = a.plan, a.nbytes
        self.phase, self.began, self.done = -1, 0.0, False
        self.specs: list[FlowSpec] = []
        self._twins: list[Flow] = []
        self._ended: list[bool] = []
        self._extra_ended = [False] * len(a.joined)
        self._start(0)
        self._extra_twins = [self.fabric.transfer(links, weights, size, start, self._mark(i))
                             for i, (links, weights, size, start) in enumerate(a.joined)]  # after the first phase

    def record(self) -> Trail:
        """The run to its end, its state kept before any event and after the events of each time."""
        env, trail = self.env, Trail()
        trail.add(-INF, self._kept())
        while (t := env.peek()) < INF:
            while env.peek() == t:
                env.step()
            trail.add(t, self._kept())
        return trail

    def _kept(self) -> Kept:
        on = self.fabric.on_link
        twins = self._twins + self._extra_twins
        return Kept(self.phase, self.began, self.done, tuple(self.specs),
                    tuple((f.links, f.weights, f.remaining, f.last, f.rate,
                           bool(f.links) and f in (on[f.links[0]] or {})) for f in twins),
                    tuple(self._ended + self._extra_ended),
                    tuple((links, weights, b) for links, weights, b in self.fabric._path_bytes.values()))

    def _mark(self, i: int) -> Callable[[], None]:
        def one() -> None:
            self._extra_ended[i] = True
        return one

    def _start(self, p: int) -> None:
        """Phase ``p`` begins (empty ones are passed over, as ``Fabric._phase`` does)."""
        plan = self.plan
        while p < len(plan) and not plan[p]:
            p += 1
        if p == len(plan):
            self.done = True
            return
        ended = [False] * len(plan[p])
        self.phase, self.began, self.specs, self._ended = p, self.env.now, list(plan[p]), ended
        left = [len(ended)]

        def one_done(i: int) -> Callable[[], None]:
            def one() -> None:
                ended[i] = True
                left[0] -= 1
                if left[0] == 0:
                    self._start(p + 1)
            return one

        self._twins = [self.fabric.transfer(f.links, f.weights, self.nbytes * f.volume, f.latency, one_done(i))
                       for i, f in enumerate(plan[p])]


class _Ahead:
    """A plan run ahead of the clock (``Fabric._run_ahead``): what it is, when it began, its run alone, the
    flows joined to it, which of them and whether the plan have ended, and how many of those are left."""

    __slots__ = ("plan", "nbytes", "done", "start", "solo", "links", "mask", "woken", "extras", "ended",
                 "ended_plan", "left", "joined", "trail")

    def __init__(self, plan: Plan, nbytes: float, done: Callable[[], None], start: float, solo: "Alone",
                 links: tuple[int, ...], extras: tuple[Flow, ...] = (), mask: int = 0, joined: tuple[Extra, ...] = (),
                 trail: list[Trail | None] | None = None) -> None:  # noqa: D107
        self.plan, self.nbytes, self.done, self.start, self.solo, self.links = plan, nbytes, done, start, solo, links
        self.mask = mask  # the bits of ``links``
        self.woken = False
        self.extras = extras
        self.joined = joined  # the joined flows as they were at the start: links, weights, bytes, start (s)
        # its trail once a wake needs it, shared by the plans run ahead alike (``_solo``)
        self.trail: list[Trail | None] = trail if trail is not None else [None]
        self.ended = [False] * len(extras)
        self.ended_plan = False
        self.left = 1 + len(extras)


@dataclass(frozen=True)
class Alone:
    """A plan run alone on an idle fabric from time 0: how long it takes, the bytes it leaves on
    each link, the load changes a listener of the fabric saw, as (time, {link: B/s}), and when each
    flow run with it (``alone``'s ``extras``) ended."""

    duration: float
    link_bytes: tuple[tuple[int, float], ...]
    loads: tuple[tuple[float, dict[int, float]], ...]
    ends: tuple[float, ...] = ()


Extra = tuple[tuple[int, ...], tuple[float, ...], float, float]  # a flow's links, weights, bytes, start (s)


def alone(plan: Plan, nbytes: float, capacity: Sequence[float], extras: Sequence[Extra] = (),
          record: bool = True) -> Alone:
    """Run ``plan`` for ``nbytes`` by itself on a fresh fabric of ``capacity`` (with ``extras``: and
    those flows, each started at its time; their ends are ``Alone.ends``; without ``record``, no load
    changes are kept: a fabric's runs ahead keep none, and are kept per plan, size and joined flows).

    Where nothing else ever uses a plan's links (the engine's private collectives), this is
    exactly what the plan does in the full run, shifted by its start: max-min sharing happens
    among its own flows only, and phases, latencies and rate changes are the same events."""
    env = simpy.Environment()
    fabric = Fabric(env, capacity)
    loads: list[tuple[float, dict[int, float]]] = []
    if record:
        fabric.listeners.append(lambda now, load: loads.append((now, dict(load))))
    else:  # a listener all the same: no flow is started ahead there (``_Replay`` replays it so)
        fabric.listeners.append(lambda _t, _l: None)
    end = [-1.0]
    ends = [-1.0] * len(extras)

    def done() -> None:
        end[0] = env.now

    def ended(i: int) -> Callable[[], None]:
        def one() -> None:
            ends[i] = env.now
        return one

    fabric.run_plan(plan, nbytes, done)
    for i, (links, weights, size, start) in enumerate(extras):  # after the plan's: as ``_wake_plan`` replays
        fabric.transfer(links, weights, size, start, ended(i))
    env.run()
    if end[0] < 0.0 or min(ends, default=0.0) < 0.0:
        raise ValueError("a plan run alone never finished (a link of no capacity?)")
    on = fabric.bytes_on_link  # only the plan's links carry bytes (no scan of the whole fabric's)
    used = {l for phase in plan for f in phase for l in f.links} | {l for x in extras for l in x[0]}
    moved = tuple((l, on[l]) for l in sorted(used) if on[l])
    return Alone(end[0], moved, tuple(loads), tuple(ends))
