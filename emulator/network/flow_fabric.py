"""The flow fabric: flow-level links shared max-min fairly (SimGrid's model, no TCP terms).

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
   event fewer per transfer (GPT 530B: 1.18M → 0.66M events); a whole flow plan is run
   ahead alike by the fabric that runs plans (emulator.network.fabric): its links are held
   as a flow started ahead holds its own (``_m_plan``), and a flow placed on one of them
   wakes it (``_wake_held``);
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
from collections import deque
from itertools import repeat
from typing import Any, Callable, Sequence

import simpy

from emulator.network.maxmin import INF, alone_rate, max_min_rates
from emulator.network.trail import settle

__all__ = ["FlowFabric", "Flow", "delay_to"]

# A component of at least this many flows has its rates remembered (``FlowFabric._rates_of``). Measured on
# Qwen3-235B with the 1F1B all-to-all overlap: 32-flow dispatch mixes take 1.4 ms to solve and 60 µs to
# look up, 4-flow ones 0.44 ms to solve; 12,792 solves held 300 distinct mixes. The run's CPU went
# 22.1 → 10.9 s from 8 flows up, 9.9 s from 4.
RATE_MEMO_FLOWS = 4
RATE_MEMO_SIZE = 4096  # mixes remembered: a key holds references to its flows' tuples, ~2 kB at 32 flows


MASKS_KEPT = 4096  # link tuples whose bits are remembered (``FlowFabric._mask``); the memo starts again past it


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

    __slots__ = ("links", "weights", "remaining", "rate", "version", "last", "done", "lazy", "hmask")

    def __init__(self, links: tuple[int, ...], weights: tuple[float, ...], nbytes: float,
                 done: Callable[[], None]) -> None:
        self.links = links
        self.weights = weights
        self.remaining = nbytes
        self.rate = 0.0
        self.version = 0
        self.last = 0.0
        self.done = done
        self.lazy = False  # started ahead of the clock, alone, on no link's list yet (``FlowFabric._ahead``)
        self.hmask = 0  # while lazy: the bits of its links that can bind (``FlowFabric._ahead``)


class FlowFabric:
    """Max-min fair flow fabric over links with capacities in B/s (runs flows; ``Fabric``, in
    emulator.network.fabric, runs flow plans on it)."""

    def __init__(self, env: simpy.Environment, capacity: Sequence[float]) -> None:
        self.env = env
        self.capacity = list(capacity)
        # the flows on each link, in arrival order (a dict as an ordered set: see the module doc)
        self.on_link: list[dict[Flow, None]] = [{} for _ in self.capacity]
        self._dirty: set[int] = set()
        self._pending = False
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
        # every flow run on the clock: none started ahead (``_ahead``), no plan run ahead (a run alone's fabric:
        # emulator.network.fabric ``alone``, whose flows must be placed as the exact path places them)
        self.on_clock = False
        # links no flow mix can fill (emulator.network.slack): left out of components and solves
        self.slack = bytearray(len(self.capacity))
        self.bind: list[float] = self.capacity  # the capacities the solver sees (slack links: inf)
        # (links, weights) → the rate of a flow alone on them, those of them that are not slack, and their bits
        self._alone: dict[tuple[tuple[int, ...], tuple[float, ...]], tuple[float, tuple[int, ...], int]] = {}
        # Links are sets of bits in Python ints (bit l: link l), so that "does this flow meet any of those"
        # is one ``&`` in C, not a walk of its links (a folded TP pair's ring crosses 128 NVLinks).
        # The flows started ahead of the clock (``_ahead``) and the bits of their links that can bind; the
        # bits of the links the plans run ahead hold (``Fabric.run_plan(ahead=True)``, emulator.network.fabric:
        # none on a fabric of flows alone; a flow placed on one wakes its plan, ``_wake_held``). No two of them
        # share a link.
        self._lazy_on: dict[Flow, None] = {}
        self._m_lazy = 0
        self._m_plan = 0
        # the links whose list of flows (``on_link``) may be non-empty: set as flows go on, cleared as found empty
        self._m_on = 0
        # id(links) → (links, their bits, those of them that can bind, whether they ascend): ``_entry``
        self._masks: dict[int, tuple[tuple[int, ...], int, frozenset[int], bool]] = {}
        self._bit = [-1] * len(self.capacity)  # link → its bit (``_bits``), -1 until it has one
        self._link_of: list[int] = []  # bit → its link
        # a component's flows' (links, weights), in order → their max-min rates (``_rates_of``)
        self._rates: dict[tuple[tuple[tuple[int, ...], tuple[float, ...]], ...], list[float]] = {}

    @property
    def _lazies(self) -> int:
        """How many flows are started ahead of the clock."""
        return len(self._lazy_on)

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
        return self._entry(links)[1]

    def _entry(self, links: tuple[int, ...]) -> tuple[tuple[int, ...], int, frozenset[int], bool]:
        """``links``, their bits, those of them that can bind (not slack), and whether they ascend, kept
        per tuple (the memo starts again past MASKS_KEPT tuples, and when links turn slack or back)."""
        hit = self._masks.get(id(links))
        if hit is not None and hit[0] is links:
            return hit
        if len(self._masks) >= MASKS_KEPT:
            self._masks.clear()
        slack = self.slack
        hit = self._masks[id(links)] = (links, self._bits(links), frozenset(l for l in links if not slack[l]),
                                        all(a < b for a, b in zip(links, links[1:])))
        return hit

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
        self._masks.clear()
        self._rates.clear()

    # -- the narrow interface -------------------------------------------------
    def transfer(self, links: tuple[int, ...], weights: tuple[float, ...], nbytes: float,
                 latency: float, done: Callable[[], None]) -> Flow:
        """Move ``nbytes`` over the links after ``latency``; call ``done()`` at the end."""
        flow = Flow(links, weights, nbytes, done)
        if latency > 0.0:
            if not (self._may_ahead() and self._ahead(flow, self.env.now + latency)):
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
        if latency > 0.0 and self._may_ahead() and self._ahead(flow, begin):
            return flow
        self.env.timeout(delay_to(self.env.now, begin), flow).callbacks.append(self._started)
        return flow

    def _may_ahead(self) -> bool:
        """Whether flows may be started or run ahead of the clock: not with listeners (they see each load change
        at its time), nor with a ``rewrite`` (timed faults), nor on a fabric kept ``on_clock``."""
        return self.rewrite is None and not self.listeners and not self.on_clock

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
            on_link[link][f] = None
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
        """Every lazy flow becomes an ordinary one (before links change or are inspected; ``Fabric`` wakes
        its plans run ahead first)."""
        # in the order of their lowest links, as a walk of the links finds them; those on no link that can
        # bind (slack only) are never met, and stay as they are
        for f in sorted((f for f in self._lazy_on if f.hmask), key=lambda f: self._lowest(f.hmask)):
            self._wake(f)

    def set_capacity(self, link: int, capacity: float) -> None:
        """The link's capacity (B/s) is ``capacity`` from now on; its flows are re-solved (and no
        link is slack any more: the proof took the capacities as they were)."""
        self._wake_all()
        self.capacity[link] = capacity
        self._alone.clear()
        self._rates.clear()
        if self.bind is not self.capacity:
            self.slack = bytearray(len(self.capacity))
            self.bind = self.capacity
            self._masks.clear()
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
            on_link[link].pop(flow, None)
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
        on_link, slack, links = self.on_link, self.slack, flow.links
        hit = self._entry(links)
        fm = hit[1]
        met = self._owners(fm) if fm & self._m_plan or fm & self._m_lazy else None
        if not met and hit[3]:  # no holder to wake, no link twice: both loops in C
            alone = not any(map(on_link.__getitem__, hit[2]))
            n = len(links)
            deque(map(dict.__setitem__, map(on_link.__getitem__, links), repeat(flow, n), repeat(None, n)), 0)
            self._m_on |= fm
            if alone:
                self._assign_alone(flow)
                return
            self._dirty.update(links)
            self._request_solve()
            return
        alone = True
        for link in flow.links:
            if met:  # a plan run ahead or a flow started ahead on this link is woken as the flow reaches it
                o = met.pop(link, None)
                if isinstance(o, Flow):
                    if o.lazy:
                        self._wake(o)
                elif o is not None:
                    self._wake_held(o)
            s = on_link[link]
            if s and not slack[link]:
                alone = False
            s[flow] = None
        self._m_on |= fm
        if alone:
            self._assign_alone(flow)
            return
        self._dirty.update(flow.links)
        self._request_solve()

    def _owners(self, mask: int) -> dict[int, Any]:
        """Link → the flow started ahead that holds it, for the links of ``mask`` that one holds (``Fabric``
        adds its plans run ahead)."""
        out: dict[int, Any] = {}
        for f in self._lazy_on:
            if f.hmask & mask:
                for link in self._alone_on(f)[1]:
                    out[link] = f
        return out

    def _wake_held(self, holder: Any) -> None:
        """A flow placed now meets ``holder`` on one of its links: a holder of links other than a flow
        started ahead (``_owners``), which it wakes. A fabric of flows alone has none; ``Fabric`` has its
        plans run ahead."""

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
        dirty, self._dirty = self._dirty, set()
        seen: set[int] = set()  # the links met so far (``_component``)
        slack, on_link = self.slack, self.on_link
        for link in dirty:
            if link in seen or slack[link]:
                continue
            seen.add(link)
            flows = self._component(link, seen) if on_link[link] else []
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

    def _component(self, start: int, seen: set[int]) -> list[Flow]:
        """The flows connected to link ``start`` through links that can bind, found depth first; the links met
        join ``seen`` (``start`` is in it). A flow's links that can bind are taken as a set, and only those not
        met yet are walked on (a folded all-to-all flow crosses 58 links, of which a component's next flow
        meets about 5 new: Qwen3-235B with the 1F1B overlap walked 42M links, 3.5M new), pushed in the order
        of its links, as a walk of them would push them."""
        flows: list[Flow] = []
        got: set[Flow] = set()  # as ``flows``
        stack = [start]
        on_link, masks = self.on_link, self._masks
        while stack:
            s = on_link[stack.pop()]
            if not s or s.keys() <= got:  # a link's flows mostly met already: checked in C
                continue
            for f in s:
                if f in got:
                    continue
                got.add(f)
                flows.append(f)
                links = f.links
                hit = masks.get(id(links))  # ``_entry``'s lookup, inline: once per flow of every component
                if hit is None or hit[0] is not links:
                    hit = self._entry(links)
                new = hit[2].difference(seen)
                if not new:
                    continue
                seen.update(new)
                if len(new) == 1:
                    stack.extend(new)
                elif hit[3]:  # links ascending: their order is the links' own
                    stack.extend(sorted(new))
                else:
                    first = {link: i for i, link in reversed(list(enumerate(links)))}
                    stack.extend(sorted(new, key=first.__getitem__))
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
        on_link, slack, links = self.on_link, self.slack, f.links
        # off each of its links (on every one of its own: ``_place``), then alone if none that can bind carries
        # another; both loops in C (a folded all-to-all flow crosses 58 links)
        n = len(links)
        deque(map(dict.pop, map(on_link.__getitem__, links), repeat(f, n), repeat(None, n)), 0)
        hit = self._entry(links)
        alone = not any(map(on_link.__getitem__, hit[2]))
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
