"""Slack links (emulator/network/slack.py): links no mix of flows can fill are left out of the
fabric's components and solves, with the same rates, bytes and loads."""
import pytest
import simpy

from emulator.network.fabric import Fabric
from emulator.network.flows import FlowSpec
from emulator.network.slack import slack_links

# two leaves L0, L1 under one spine S; hosts a, b on L0 and c, d on L1
ENDS = [("a", "L0"), ("b", "L0"), ("L0", "S"), ("S", "L1"), ("L1", "c"), ("L1", "d")]
A_L0, B_L0, L0_S, S_L1, L1_C, L1_D = range(6)
FLOWS = [FlowSpec((A_L0, L0_S, S_L1, L1_C), (1.0, 1.0, 1.0, 1.0), 1.0, 0.0),  # a → c
         FlowSpec((B_L0, L0_S, S_L1, L1_D), (1.0, 1.0, 1.0, 1.0), 1.0, 0.0)]  # b → d


def test_uplink_and_downlink_are_slack_without_oversubscription():
    # L0→S: what enters L0 over a→L0 and b→L0 bounds it: 1·1 + 1·1 = 2 ≤ its 2 B/s. S→L1: what
    # leaves L1 over L1→c and L1→d, 2 ≤ 2. The host links, where flows start or end, witness them.
    assert slack_links(FLOWS, ENDS, [1, 1, 2, 2, 1, 1]) == {L0_S, S_L1}
    # 1.5 B/s up: 2 > 1.5 on both sides of L0→S (entering: a, b; leaving: S→L1 at 2), not slack;
    # S→L1 still is (leaving: 2 ≤ 2), witnessed by L1→c and L1→d
    assert slack_links(FLOWS, ENDS, [1, 1, 1.5, 2, 1, 1]) == {S_L1}


def test_a_witness_is_never_left_out():
    # one flow around a ring x → y → z → x: each link is bounded by the one before it (and the one
    # after), so each could be slack alone, but not all: a witness of a slack link stays
    ends = [("x", "y"), ("y", "z"), ("z", "x")]
    ring = [FlowSpec((0, 1, 2), (1.0, 1.0, 1.0), 1.0, 0.0), FlowSpec((0, 1, 2), (0.5, 0.5, 0.5), 1.0, 0.0)]
    assert slack_links(ring[:1], ends, [1.0, 1.0, 1.0]) == set()  # one flow shares no link: nothing to gain
    got = slack_links(ring, ends, [1.0, 1.0, 1.0])
    # every link has 1 witness a side (ratio 1, bound 1 ≤ 1); ties go by id. Link 0: its entering
    # witness z→x is kept; link 1's entering witness is link 0 (slack), but by its leaving witness
    # z→x (kept) it is slack too; link 2 is a witness: kept
    assert got == {0, 1}
    # a merged class (link compression: 1 ≡ 2) is slack or not as a whole: 2 stands for 1 and 2, and
    # link 0, witnessed by 2 (entering) or 1 (leaving), leaves that class kept
    assert slack_links(ring, ends, [1.0, 1.0, 1.0], {0: 0, 1: 2, 2: 2}) == {0}


def test_flows_meeting_on_a_slack_link_are_each_alone():
    env = simpy.Environment()
    fabric = Fabric(env, [1.0, 1.0, 2.0, 2.0, 1.0, 1.0])
    fabric.set_slack({L0_S, S_L1})
    loads = []
    fabric.listeners.append(lambda now, load: loads.append((now, dict(load))))
    ends = []
    for f, nbytes in zip(FLOWS, (2.0, 3.0)):
        fabric.transfer(f.links, f.weights, nbytes, 0.0, lambda: ends.append(env.now))
    env.run()
    # each streams at 1 B/s (its host links), as max-min gives with the spine links in: 2 B and 3 B
    # end at 2 s and 3 s, with no solve (each flow was alone on the links that bind it)
    assert ends == [2.0, 3.0] and fabric.solves == 0
    assert fabric.bytes_on_link[L0_S] == pytest.approx(5.0) and fabric.bytes_on_link[A_L0] == pytest.approx(2.0)
    # the uplink's load as each flow starts (1, then 1 + 1 = 2 B/s) and as the first ends (1 B/s)
    up = [(t, l[L0_S]) for t, l in loads if L0_S in l]
    assert up == [(0.0, 1.0), (0.0, 2.0), (2.0, 1.0), (3.0, 0.0)]


def test_a_capacity_change_ends_the_slack():
    fabric = Fabric(simpy.Environment(), [1.0, 1.0, 2.0, 2.0, 1.0, 1.0])
    fabric.set_slack({L0_S})
    assert fabric.bind[L0_S] == float("inf")
    fabric.set_capacity(L0_S, 0.5)  # degraded: the proof no longer holds
    assert not any(fabric.slack) and fabric.bind[L0_S] == 0.5


def test_a_run_with_slack_links_is_the_run_without(monkeypatch):
    """DP 3 × PP 5 × TP 8 on 15 DGX A100 nodes, leaves of 2, every rank simulated (fold: off): the
    pipeline transfers cross the spine, whose links are slack (1:1). The iteration time and every
    link's bytes must be those of the same run with no link slack."""
    from test_folding_effect import scenario

    import emulator.network.collectives as coll
    from emulator.run.simulation import simulate

    found: list[int] = []
    real = coll.slack_links

    def counted(*a, **k):
        out = real(*a, **k)
        found.append(len(out))
        return out

    monkeypatch.setattr(coll, "slack_links", counted)
    with_slack = simulate(scenario(3, 5, 8, 2, fold="off"))
    assert found and found[-1] > 0  # the leaf–spine links of the 8 leaves
    monkeypatch.setattr(coll, "slack_links", lambda *a, **k: set())
    without = simulate(scenario(3, 5, 8, 2, fold="off"))
    assert with_slack.iteration_time_s == pytest.approx(without.iteration_time_s, rel=1e-12)
    assert with_slack.link_bytes == pytest.approx(without.link_bytes, rel=1e-9)
    assert with_slack.events < without.events  # transfers alone on their NICs: no deferred solve
