"""A plan run ahead, woken: its run alone kept at each event time (network/trail.py) reads, at any moment,
to the last bit what a replay of that run up to the moment gives."""
import random

from emulator.network.fabric import _Ahead, _Replay
from emulator.network.flows import FlowSpec


def random_ahead(rng):
    """A plan of 1-3 phases of 1-4 flows over 2-6 links, and 0-2 joined flows starting at offsets."""
    n = rng.randint(2, 6)
    caps = [rng.uniform(1.0, 20.0) for _ in range(n)]

    def path():
        links = tuple(sorted(rng.sample(range(n), rng.randint(1, n))))
        return links, tuple(rng.choice([1.0, 2.0]) for _ in links)

    plan = [[FlowSpec(*path(), rng.uniform(0.5, 2.0), rng.choice([0.0, rng.uniform(0.0, 0.3)]))
             for _ in range(rng.randint(1, 4))] for _ in range(rng.randint(1, 3))]
    joined = tuple((*path(), rng.uniform(1.0, 20.0), rng.choice([0.0, rng.uniform(0.0, 1.0)]))
                   for _ in range(rng.randint(0, 2)))
    return caps, _Ahead(plan, rng.uniform(1.0, 10.0), lambda: None, 0.0, None, (), (), 0, joined)


def replayed(a, caps, tau):
    """The state a replay run until ``tau`` leaves, its streaming flows settled there (as the wakes did)."""
    r = _Replay(a, caps)
    if tau > 0.0:
        r.env.run(until=tau)
    twins = r._twins + r._extra_twins
    on = r.fabric.on_link
    streaming = [bool(f.links) and f in (on[f.links[0]] or {}) for f in twins]
    for f, s in zip(twins, streaming):
        if s:
            r.fabric._settle(f, tau)
    links = {link for phase in a.plan for f in phase for link in f.links} | {link for j in a.joined for link in j[0]}
    moved = r.fabric.bytes_on_link
    return (r.phase, r.began, r.done, [(f.remaining, f.rate, f.last) for f in twins], streaming,
            r._ended + r._extra_ended, {link: moved[link] for link in links if moved[link]})


def read(trail, tau):
    m = trail.at(tau)
    for f in m.twins:
        if f.started:
            m.settle(f)
    return (m.phase, m.began, m.done, [(f.remaining, f.rate, f.last) for f in m.twins],
            [f.started for f in m.twins], list(m.ended), {k: v for k, v in m.bytes_on().items() if v})


def test_a_trail_reads_as_a_replay_to_the_last_bit():
    rng = random.Random(11)
    checked = 0
    for _case in range(40):
        caps, a = random_ahead(rng)
        trail = _Replay(a, caps).record()
        end = trail.times[-1]
        # at its event times (a replay until t leaves the events at t undone), between them, and at 0
        taus = [0.0] + [t for t in trail.times[1:]] + [rng.uniform(0.0, end) for _ in range(6)]
        for tau in taus:
            assert read(trail, tau) == replayed(a, caps, tau), (a.plan, a.joined, tau)
            checked += 1
    assert checked > 300  # 40 plans, each at its event times and 6 moments between


def test_a_trail_keeps_each_time_once():
    # one flow of 10 B at 2 B/s after 1 s of latency: events at 1 (it streams, rated alone at once) and 6 (it
    # ends: 10/2 = 5 s later); kept before any event and after the events of each of those times
    a = _Ahead([[FlowSpec((0,), (1.0,), 1.0, 1.0)]], 10.0, lambda: None, 0.0, None, ())
    trail = _Replay(a, [2.0]).record()
    assert trail.times == [float("-inf"), 1.0, 6.0]
    m = trail.at(3.5)  # streaming since 1 s: 2.5 s at 2 B/s moved 5 B
    (f,) = m.twins
    m.settle(f)
    assert (f.remaining, f.rate, m.bytes_on()) == (5.0, 2.0, {0: 5.0})
    assert trail.at(6.5).done and trail.at(6.0).phase == 0  # at 6 its end is not yet processed
