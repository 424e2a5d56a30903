"""The fabric against hand-computed max-min cases and an independent reference."""
import os
import random

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from emulator.network import flow_fabric as fabric_module  # the module whose solves are counted
from emulator.network.fabric import Fabric, Flow, max_min_rates


def run_flows(capacity, flows):
    """flows: list of (start, links, weights, nbytes, latency) → completion times."""
    env = simpy.Environment()
    fab = Fabric(env, capacity)
    done = {}
    for i, (start, links, weights, nbytes, lat) in enumerate(flows):
        def go(_e, i=i, links=links, weights=weights, nbytes=nbytes, lat=lat):
            fab.transfer(tuple(links), tuple(weights), nbytes, lat, lambda i=i: done.__setitem__(i, env.now))
        env.timeout(start).callbacks.append(go)
    env.run()
    return [done[i] for i in range(len(flows))]


def test_one_flow_pays_latency_then_streams():
    # 1 GB over a 100 GB/s link after 5 us: 5e-6 + 1e9/100e9 = 0.010005 s
    (t,) = run_flows([100e9], [(0.0, [0], [1.0], 1e9, 5e-6)])
    assert t == pytest.approx(0.010005, rel=1e-12)


def test_two_flows_share_one_link():
    # two 1 GB flows on one 10 GB/s link: 5 GB/s each, both end at 1e9/5e9 = 0.2 s
    t = run_flows([10e9], [(0.0, [0], [1.0], 1e9, 0.0), (0.0, [0], [1.0], 1e9, 0.0)])
    assert t == pytest.approx([0.2, 0.2], rel=1e-12)


def test_late_flow_slows_the_first():
    # A: 1 GB from t=0 alone at 10 GB/s until t=0.05 (0.5 GB left); B: 1 GB from t=0.05.
    # Both at 5 GB/s: A's 0.5 GB ends at 0.05 + 0.1 = 0.15; B then has 0.5 GB left at 10 GB/s: 0.15 + 0.05 = 0.2
    t = run_flows([10e9], [(0.0, [0], [1.0], 1e9, 0.0), (0.05, [0], [1.0], 1e9, 0.0)])
    assert t == pytest.approx([0.15, 0.2], rel=1e-12)


def test_a_flow_alone_gets_its_narrowest_link():
    # one flow over links 0, 1 and 0 again (weight 1 each pass: Σ w = 2 on link 0), capacities 10 and
    # 30: link 0 allows 10 / 2 = 5, link 1 30 / 1 = 30 → 5; with weights 0.5 (an ECMP share) link 0
    # allows 10 / 1 = 10, link 1 30 / 0.5 = 60 → 10; a link of infinite capacity binds nothing → inf
    assert max_min_rates([Flow((0, 1, 0), (1, 1, 1), 1, None)], [10, 30]) == [5.0]
    assert max_min_rates([Flow((0, 1, 0), (0.5, 0.5, 0.5), 1, None)], [10, 30]) == [10.0]
    assert max_min_rates([Flow((0,), (1,), 1, None)], [float("inf")]) == [float("inf")]


def test_classic_three_link_example():
    # Links a=10, b=4, c=12 GB/s. f0 crosses a, b, c; f1 only a; f2 only b; f3 only c.
    # Filling: b saturates first at 4/2 = 2 → f0 = f2 = 2; then f1 = 10 - 2 = 8, f3 = 12 - 2 = 10.
    assert max_min_rates([Flow((0, 1, 2), (1, 1, 1), 1, None), Flow((0,), (1,), 1, None),
                          Flow((1,), (1,), 1, None), Flow((2,), (1,), 1, None)], [10, 4, 12]) == \
        pytest.approx([2, 8, 2, 10], rel=1e-12)
    # Completions with sizes f0=8, f1=8, f2=2, f3=8 GB: f3 at 8/10 = 0.8 s; f1 at 8/8 = 1 s and f2 at 2/2 = 1 s;
    # f0 has moved 2 GB by t=1, then runs alone at b's 4 GB/s: 6/4 = 1.5 s more → 2.5 s.
    G = 1e9
    t = run_flows([10 * G, 4 * G, 12 * G], [(0, [0, 1, 2], [1, 1, 1], 8 * G, 0), (0, [0], [1], 8 * G, 0),
                                           (0, [1], [1], 2 * G, 0), (0, [2], [1], 8 * G, 0)])
    assert t == pytest.approx([2.5, 1.0, 1.0, 0.8], rel=1e-9)


def test_weights_count_multiplicity():
    # a ring flow crossing link 0 twice (weight 2) on 10 GB/s: rate 5 GB/s, 1 GB takes 0.2 s
    (t,) = run_flows([10e9], [(0.0, [0], [2.0], 1e9, 0.0)])
    assert t == pytest.approx(0.2, rel=1e-12)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(1.0, 100.0), min_size=1, max_size=6).flatmap(
    lambda caps: st.tuples(st.just(caps), st.lists(
        st.lists(st.tuples(st.integers(0, len(caps) - 1), st.sampled_from([0.5, 1.0, 2.0])), min_size=1, max_size=4),
        min_size=1, max_size=8))))
def test_every_flow_has_a_bottleneck(case):
    # The characterisation of max-min fairness: each flow crosses a saturated link on which
    # no other flow has a larger rate.
    caps, routes = case
    flows = []
    for r in routes:
        w = {}
        for link, weight in r:
            w[link] = w.get(link, 0.0) + weight
        links = tuple(sorted(w))
        flows.append(Flow(links, tuple(w[l] for l in links), 1.0, None))
    rates = max_min_rates(flows, caps)
    load = [0.0] * len(caps)
    for f, r in zip(flows, rates):
        for l, w in zip(f.links, f.weights):
            load[l] += w * r
    for l, c in enumerate(caps):
        assert load[l] <= c * (1 + 1e-9)
    for i, f in enumerate(flows):
        ok = False
        for l in f.links:
            saturated = load[l] >= caps[l] * (1 - 1e-9)
            top = all(rates[j] <= rates[i] * (1 + 1e-9) for j, g in enumerate(flows) if l in g.links)
            ok = ok or (saturated and top)
        assert ok, (i, rates)


def reference_rates(capacity, routes):
    """Max-min by bisection on the common level of the unfrozen flows (no closed form)."""
    frozen = {}
    left = set(range(len(routes)))

    def loads(x):
        out = [0.0] * len(capacity)
        for i, links in enumerate(routes):
            for l in links:
                out[l] += frozen.get(i, x)
        return out

    while left:
        lo, hi = 0.0, 2.0 * max(capacity)
        for _ in range(200):
            mid = (lo + hi) / 2
            if all(u <= c for u, c in zip(loads(mid), capacity)):
                lo = mid
            else:
                hi = mid
        used = loads(lo)
        tight = {l for l, c in enumerate(capacity) if used[l] >= c * (1 - 1e-12)}
        newly = {i for i in left if tight & set(routes[i])}
        for i in newly:
            frozen[i] = lo
        left -= newly
    return [frozen[i] for i in range(len(routes))]


def reference_completions(capacity, flows):
    """An independent fluid simulator: re-solve everything by bisection at every event."""
    n = len(flows)
    remaining = [f[3] for f in flows]
    ready = [f[0] + f[4] for f in flows]
    done = [None] * n
    t = 0.0
    while any(d is None for d in done):
        active = [i for i in range(n) if done[i] is None and ready[i] <= t]
        rates = dict(zip(active, reference_rates(capacity, [flows[i][1] for i in active]))) if active else {}
        nxt = min([ready[i] for i in range(n) if done[i] is None and ready[i] > t] + [float("inf")])
        fin = min([t + remaining[i] / rates[i] for i in active] + [float("inf")])
        step = min(nxt, fin)
        for i in active:
            remaining[i] -= rates[i] * (step - t)
            if remaining[i] <= 1e-9 * flows[i][3]:
                done[i] = step
        t = step
    return done


def random_case(rng, nlinks, nflows, start, latency):
    """Capacities of ``rng.randint(*nlinks)`` links and ``rng.randint(*nflows)`` flows (start, links, weights,
    bytes, latency) over random subsets of them; ``start`` and ``latency`` draw from ``rng``."""
    n = rng.randint(*nlinks)
    caps = [rng.uniform(1.0, 20.0) for _ in range(n)]
    flows = []
    for _ in range(rng.randint(*nflows)):
        links = sorted(rng.sample(range(n), rng.randint(1, n)))
        flows.append((start(rng), links, [1.0] * len(links), rng.uniform(1.0, 30.0), latency(rng)))
    return caps, flows


def test_random_graphs_match_reference_simulator():
    rng = random.Random(7)
    for _case in range(25):
        caps, flows = random_case(rng, (2, 6), (1, 7), lambda r: r.choice([0.0, 0.0, r.uniform(0, 2)]),
                                  lambda r: r.choice([0.0, r.uniform(0, 0.5)]))
        got = run_flows(caps, flows)
        want = reference_completions(caps, flows)
        assert got == pytest.approx(want, rel=1e-6), (caps, flows)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000))
def test_vectorised_solver_agrees_with_the_pure_one(seed):
    # big components (more than VECTORISE_ABOVE flows) take the numpy path: same rates to 1e-12
    from emulator.network import maxmin as F

    rng = random.Random(seed)
    caps = [rng.uniform(1.0, 50.0) for _ in range(rng.randint(3, 30))]
    flows = []
    for _ in range(rng.randint(F.VECTORISE_ABOVE + 1, 160)):
        links = sorted(rng.sample(range(len(caps)), rng.randint(1, min(5, len(caps)))))
        flows.append(Flow(tuple(links), tuple(rng.choice([0.5, 1.0, 2.0]) for _ in links), 1.0, None))
    vec = F.max_min_rates_vectorised(flows, caps)
    old, F.VECTORISE_ABOVE = F.VECTORISE_ABOVE, 10**9
    try:
        pure = F.max_min_rates(flows, caps)
    finally:
        F.VECTORISE_ABOVE = old
    assert vec == pytest.approx(pure, rel=1e-12)


def test_link_loads_do_not_depend_on_flow_hashes(monkeypatch):
    """The flows on a link are walked in arrival order, not in the order of their hashes
    (identity: memory addresses, which change from run to run): the link-load series of a
    contended MoE run is the same under two opposite hash orders (it was not with sets)."""
    from emulator.run.simulation import simulate
    from emulator.scenario import load_scenario

    sc = load_scenario(os.path.join(os.path.dirname(__file__), "..", "scenarios", "mixtral-8x7b-moe-32-h100.yaml"))
    series = []
    for sign in (1, -1):
        monkeypatch.setattr(Flow, "__hash__", lambda self, sign=sign: sign * (id(self) >> 4))
        series.append(simulate(sc).link_series)
    assert series[0] == series[1]


def test_a_flow_started_ahead_meets_one_placed_before_its_start():
    # A: 1 GB from t=0 after 0.1 s of latency, alone as it is matched: started ahead (no event at 0.1).
    # B: 1 GB placed at 0.05, before A streams: A then starts on the clock at 0.1, as it would have.
    # B alone 0.05-0.1 at 10 GB/s: 0.5 GB; both at 5 GB/s: B's 0.5 GB ends at 0.1 + 0.1 = 0.2, when A
    # has moved 0.5 GB; A's last 0.5 GB alone at 10 GB/s: 0.2 + 0.05 = 0.25
    flows = [(0.0, [0], [1.0], 1e9, 0.1), (0.05, [0], [1.0], 1e9, 0.0)]
    t = run_flows([10e9], flows)
    assert t == pytest.approx([0.25, 0.2], rel=1e-12)
    assert t == pytest.approx(reference_completions([10e9], flows), rel=1e-9)


def test_a_flow_started_ahead_meets_one_placed_after_its_start():
    # A as above, streaming alone from 0.1; B placed at 0.15 finds it there (0.5 GB moved):
    # both at 5 GB/s, A's 0.5 GB ends at 0.15 + 0.1 = 0.25; B's last 0.5 GB alone: 0.25 + 0.05 = 0.3
    flows = [(0.0, [0], [1.0], 1e9, 0.1), (0.15, [0], [1.0], 1e9, 0.0)]
    t = run_flows([10e9], flows)
    assert t == pytest.approx([0.25, 0.3], rel=1e-12)
    assert t == pytest.approx(reference_completions([10e9], flows), rel=1e-9)


def test_a_lone_flow_started_ahead_costs_one_event_and_ends_as_on_the_clock():
    # 1 GB over a 100 GB/s link after 5 us: ends at 5e-6 + 0.01 either way; started ahead it is one
    # event (its end), on the clock two (its start after the latency, its end). A listener sees
    # every load change at its time, so it keeps the flow on the clock.
    def run(listen):
        env = simpy.Environment()
        fab = Fabric(env, [100e9])
        if listen:
            fab.listeners.append(lambda now, loads: None)
        end = []
        fab.transfer((0,), (1.0,), 1e9, 5e-6, lambda: end.append(env.now))
        events = 0
        while env.peek() < float("inf"):
            env.step()
            events += 1
        return end[0], events, fab.bytes_on_link[0]

    ahead, clock = run(False), run(True)
    assert ahead == (clock[0], 1, clock[2]) and clock[1] == 2
    assert ahead[0] == pytest.approx(0.010005, rel=1e-12) and ahead[2] == 1e9


def test_flows_started_ahead_end_as_on_the_clock_on_random_graphs():
    # the same flows run twice: started ahead where their links are idle (no listener), and every
    # one on the clock (a listener keeps them there); each completion must agree (exact but for
    # the order of same-time events, which can move a solve's sums by an ulp)
    def run(caps, flows, listen):
        env = simpy.Environment()
        fab = Fabric(env, caps)
        if listen:
            fab.listeners.append(lambda now, loads: None)
        done = {}
        for i, (start, links, nbytes, lat) in enumerate(flows):
            def go(_e, i=i, links=links, nbytes=nbytes, lat=lat):
                fab.transfer(tuple(links), (1.0,) * len(links), nbytes, lat, lambda i=i: done.__setitem__(i, env.now))
            env.timeout(start).callbacks.append(go)
        env.run()
        return [done[i] for i in range(len(flows))], fab.bytes_on_link

    rng = random.Random(11)
    for _case in range(200):
        nlinks = rng.randint(1, 5)
        caps = [rng.uniform(1.0, 20.0) for _ in range(nlinks)]
        flows = [(rng.choice([0.0, rng.uniform(0, 2)]), sorted(rng.sample(range(nlinks), rng.randint(1, nlinks))),
                  rng.uniform(1.0, 30.0), rng.choice([0.0, rng.uniform(0, 0.5), rng.uniform(0, 3)]))
                 for _ in range(rng.randint(1, 6))]
        ahead, clock = run(caps, flows, False), run(caps, flows, True)
        assert ahead[0] == pytest.approx(clock[0], rel=1e-12, abs=1e-12), (caps, flows)
        assert ahead[1] == pytest.approx(clock[1], rel=1e-12, abs=1e-9), (caps, flows)


def test_a_recurring_mix_is_solved_once_and_forgotten_when_a_capacity_changes(monkeypatch):
    # four flows of 100 B on one 100 B/s link, twice (the second batch at t 10): 25 B/s each, all end 4 s
    # after they start. The second batch is the same mix: its rates come from the memo. Then the link drops
    # to 50 B/s at t 20 and a third batch starts: 12.5 B/s each, 8 s; a stale memo would say 4 s.
    env = simpy.Environment()
    fab = Fabric(env, [100.0])
    ends: list[float] = []
    solved: list[int] = []
    real = fabric_module.max_min_rates
    monkeypatch.setattr(fabric_module, "max_min_rates", lambda flows, cap: solved.append(len(flows)) or
                        real(flows, cap))

    def batch(_e: object = None) -> None:
        for _ in range(4):
            fab.transfer((0,), (1.0,), 100.0, 0.0, lambda: ends.append(env.now))

    batch()
    env.timeout(10.0).callbacks.append(batch)
    env.timeout(20.0).callbacks.append(lambda _e: fab.set_capacity(0, 50.0))
    env.timeout(20.0).callbacks.append(batch)
    env.run()
    assert ends == pytest.approx([4.0] * 4 + [14.0] * 4 + [28.0] * 4, rel=1e-12)
    # the mix of four was solved at t 0 and again after the capacity changed, not at t 10 (the four of a
    # batch end together, so no smaller mix is solved between)
    assert solved == [4, 4]


def test_owed_bytes_are_added_times_their_count_when_read():
    """A run alone's (link, bytes) list owed three times, another once, and a flow settled on the clock:
    link 0 gets 3 × 2 B + the flow's 40 B, link 1 5 B, link 2 3 × 1 B; a later owe is added at the next read."""
    env = simpy.Environment()
    fab = Fabric(env, [10.0, 10.0, 10.0])
    a, b = ((0, 2.0), (2, 1.0)), ((1, 5.0),)
    for pairs in (a, b, a, a):
        fab.owe(pairs)
    fab.transfer((0,), (1.0,), 40.0, 0.0, lambda: None)  # 40 B at 10 B/s over link 0: 4 s
    env.run()
    assert fab.bytes_on_link == pytest.approx([6.0 + 40.0, 5.0, 3.0], rel=1e-12)
    fab.owe(a)  # one more run: 2 B and 1 B, added once at the next read (the three before are not added again)
    assert fab.bytes_on_link == pytest.approx([48.0, 5.0, 4.0], rel=1e-12)


def run_flows_issued_early(capacity, flows, issue_at=0.0):
    """``run_flows``, each flow handed over at ``issue_at`` (``Fabric.transfer_at``) to begin at its start."""
    env = simpy.Environment()
    fab = Fabric(env, capacity)
    done = {}
    flows = sorted(enumerate(flows), key=lambda x: x[1][0])  # issued in the order they begin

    def issue(_e):
        for i, (start, links, weights, nbytes, lat) in flows:
            fab.transfer_at(start, tuple(links), tuple(weights), nbytes, lat,
                            lambda i=i: done.__setitem__(i, env.now))

    env.timeout(issue_at).callbacks.append(issue)
    env.run()
    return [done[i] for i in range(len(flows))], fab


def test_a_transfer_handed_over_early_begins_at_its_time():
    # A: 1 GB, handed over at t=0 to begin at 1.0 after 0.5 s of latency (streams from 1.5); B: 1 GB
    # placed at 1.55 (latency 0), handed over at 0 as well. 10 GB/s: A alone 1.5-1.55 moves 0.5 GB; both
    # at 5 GB/s, A's last 0.5 GB ends at 1.55 + 0.1 = 1.65, when B has moved 0.5 GB; B's last 0.5 GB
    # alone at 10 GB/s: 1.65 + 0.05 = 1.7
    flows = [(1.0, [0], [1.0], 1e9, 0.5), (1.55, [0], [1.0], 1e9, 0.0)]
    got, fab = run_flows_issued_early([10e9], flows)
    assert got == pytest.approx([1.65, 1.7], rel=1e-12)
    assert got == run_flows([10e9], flows)  # as handed over at their times
    assert fab.bytes_on_link[0] == pytest.approx(2e9, rel=1e-12)
    # a flow placed on A's link before A begins (at 0.2, on the clock) starts A on the clock at 1.5:
    # B' 1 GB alone from 0.2 ends at 0.3, before A streams: A then alone, 1.5 + 0.1 = 1.6
    env = simpy.Environment()
    fab = Fabric(env, [10e9])
    ends = []
    fab.transfer_at(1.0, (0,), (1.0,), 1e9, 0.5, lambda: ends.append(("A", env.now)))
    assert fab._lazies == 1 and fab._m_lazy == 1  # started ahead: link 0 held
    env.timeout(0.2).callbacks.append(lambda _e: fab.transfer((0,), (1.0,), 1e9, 0.0,
                                                              lambda: ends.append(("B", env.now))))
    env.run()
    assert ends == [("B", pytest.approx(0.3, rel=1e-12)), ("A", pytest.approx(1.6, rel=1e-12))]
    assert fab._lazies == 0 and fab._m_lazy == 0 and fab._m_plan == 0


def test_transfers_handed_over_early_end_as_on_the_clock_on_random_graphs():
    # the random cases of the reference simulator, every flow handed over at t=0 to begin at its time:
    # the same ends as handed over at their times (exact but for the order of same-time events, an ulp)
    rng = random.Random(13)
    for _case in range(200):
        caps, flows = random_case(rng, (1, 5), (1, 6), lambda r: r.choice([0.0, r.uniform(0, 2)]),
                                  lambda r: r.choice([0.0, r.uniform(0, 0.5), r.uniform(0, 3)]))
        got, fab = run_flows_issued_early(caps, flows)
        assert got == pytest.approx(run_flows(caps, flows), rel=1e-12, abs=1e-12), (caps, flows)
        assert got == pytest.approx(reference_completions(caps, flows), rel=1e-6), (caps, flows)
        # nothing is left holding a link; every link that carries a flow now has its bit (none do)
        assert fab._m_lazy == 0 and fab._m_plan == 0 and not fab._lazy_on and not fab._plan_on
        assert not any(fab.on_link)
