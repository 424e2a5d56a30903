"""A MoE token dispatch's plan run ahead of the clock (``Fabric.run_plan(ahead=True)``): the same ends and
bytes as on the clock, by hand on a tiny fabric, woken by a flow that meets it, and on whole MoE runs
against the exact path (``PLANS_AHEAD = False``)."""
import json
import math

import pytest
import simpy

import emulator.network.fabric as fabric_mod
from emulator.cli import main
from emulator.network.fabric import Fabric
from emulator.network.flows import FlowSpec

# Two links of 100 B/s. The plan, for a buffer of S = 100 B: A crosses link 0 with the whole buffer (volume 1,
# no latency); B crosses links 0 and 1 with half of it (volume 0.5) after a latency of 0.25 s.
PLAN = [[FlowSpec((0,), (1.0,), 1.0, 0.0), FlowSpec((0, 1), (1.0, 1.0), 0.5, 0.25)]]


def run_tiny(ahead, joiner_at=None, joins=False):
    """Start PLAN at t = 2 s (and, at ``joiner_at``, a flow C of 100 B on link 1): the plan's end, C's end,
    the bytes on each link, how many plans were woken, and whether the plan ran ahead. With ``joins``, a flow
    meeting the plan may join it (``Fabric._join``); without, it wakes it."""
    env = simpy.Environment()
    fab = Fabric(env, [100.0, 100.0])
    fab.joins = joins
    ends = {}
    ran_ahead = []

    def start_plan(_e):
        fab.run_plan(PLAN, 100.0, lambda: ends.__setitem__("plan", env.now), ahead=ahead)
        ran_ahead.append(fab._aheads == 1 and not fab.on_link[0] and not fab.on_link[1])

    env.timeout(2.0).callbacks.append(start_plan)
    if joiner_at is not None:
        env.timeout(joiner_at).callbacks.append(
            lambda _e: fab.transfer((1,), (1.0,), 100.0, 0.0, lambda: ends.__setitem__("C", env.now)))
    env.run()
    return ends, list(fab.bytes_on_link), fab.woken, ran_ahead[0]


def test_a_plan_run_ahead_ends_at_its_hand_computed_time():
    # From t = 2: A alone on link 0 until B's latency is over, 0.25 s at 100 B/s = 25 B. Then A and B share
    # link 0, 50 B/s each (link 1 carries B alone: not tight). B's 50 B take 1 s: B ends at 2 + 0.25 + 1 =
    # 3.25 s; A has moved 25 + 50 = 75 B, its last 25 B alone at 100 B/s take 0.25 s: the plan ends at 3.5 s.
    # Bytes: link 0 carries A's 100 + B's 50 = 150 B, link 1 B's 50 B.
    ends, moved, woken, ran_ahead = run_tiny(ahead=True)
    assert ran_ahead  # one timeout for its end, no flow on the fabric's links
    assert ends == {"plan": 3.5}
    assert moved == [150.0, 50.0]
    assert woken == 0
    assert run_tiny(ahead=False)[:2] == (ends, moved)  # on the clock, flow by flow: the same


def test_a_flow_meeting_a_plan_run_ahead_wakes_it():
    # C (100 B on link 1) arrives at t = 2.75, 0.75 s into the plan: A has moved 25 B alone + 0.5 s · 50 B/s =
    # 50 B (50 left), B 0.5 s · 50 = 25 B (25 left). Now link 0 carries A, B and link 1 carries B, C: every
    # link splits 50/50, so A, B and C stream at 50 B/s. B's 25 B end at 2.75 + 0.5 = 3.25 s; A then has
    # 50 − 25 = 25 B alone at 100 B/s: the plan ends at 3.25 + 0.25 = 3.5 s. C has 100 − 25 = 75 B at
    # 3.25 s, alone at 100 B/s: it ends at 4.0 s. Bytes: link 0 150 B, link 1 B's 50 + C's 100 = 150 B.
    ends, moved, woken, ran_ahead = run_tiny(ahead=True, joiner_at=2.75)
    assert ran_ahead
    assert woken == 1
    assert ends == {"plan": 3.5, "C": 4.0}
    assert moved == [150.0, 150.0]
    assert run_tiny(ahead=False, joiner_at=2.75)[:2] == (ends, moved)


def test_a_flow_meeting_a_plan_run_ahead_on_free_links_joins_it():
    # C's link 1 is the plan's, and it has no other: C is joined to the plan, the two run together from the
    # plan's start with C begun 0.75 s in; the same ends and bytes as woken (above), and no plan woken
    ends, moved, woken, ran_ahead = run_tiny(ahead=True, joiner_at=2.75, joins=True)
    assert ran_ahead
    assert woken == 0
    assert ends == {"plan": 3.5, "C": 4.0}
    assert moved == [150.0, 150.0]


@pytest.mark.parametrize("trials, late, woken", [(8, 2, 0), (1, 1, 1)], ids=["joined", "woken"])
def test_a_second_flow_meeting_a_plan_joins_it_while_trials_last(trials, late, woken, monkeypatch):
    # C joins PLAN at 2.75 s (above); E, 100 B on link 1, comes at 3.0 s. Its run together is new: with a trial
    # left for the plan (JOIN_TRIALS) it is made and E joins; with none, and no join served by the one run made
    # (JOIN_HITS), the plan is woken. Either way: at 3.0 A has 37.5 B left, B 12.5, C 87.5. Link 1 splits B, C, E
    # at 100/3 B/s each, link 0 gives A the rest, 200/3. B ends at 3.0 + 12.5 · 3/100 = 3.375 s; A has
    # 37.5 − 25 = 12.5 B left, alone at 100 B/s: the plan ends at 3.5 s. C (75 B) and E (87.5 B) share link 1 at
    # 50 B/s: C ends at 3.375 + 1.5 = 4.875 s, E's last 12.5 B alone at 5.0 s. Bytes: link 0 A's 100 + B's 50,
    # link 1 B's 50 + C's + E's 100.
    monkeypatch.setattr(fabric_mod, "JOIN_TRIALS", trials)
    env = simpy.Environment()
    fab = Fabric(env, [100.0, 100.0])
    ends = {}
    env.timeout(2.0).callbacks.append(
        lambda _e: fab.run_plan(PLAN, 100.0, lambda: ends.__setitem__("plan", env.now), ahead=True))
    for name, at in (("C", 2.75), ("E", 3.0)):
        env.timeout(at).callbacks.append(
            lambda _e, name=name: fab.transfer((1,), (1.0,), 100.0, 0.0, lambda: ends.__setitem__(name, env.now)))
    env.run()
    assert (fab.late, fab.woken) == (late, woken)
    assert ends == pytest.approx({"plan": 3.5, "C": 4.875, "E": 5.0}, rel=1e-12)
    assert fab.bytes_on_link == pytest.approx([150.0, 250.0], rel=1e-12)


def test_a_flow_meeting_a_plan_and_a_busy_link_wakes_the_plan():
    # Three links of 100 B/s. PLAN from t = 2 s; D, 100 B on link 2, streams on the clock from 2.5 s; C, 100 B
    # over links 1 and 2, at 2.75 s meets the plan on link 1 and D on link 2: not joined, the plan is woken.
    # At 2.75: A has 50 B left, B 25 B, D 75 B; links 0 (A, B), 1 (B, C), 2 (C, D) split 50/50: all at 50 B/s.
    # B ends at 3.25 s; A (25 B left) alone at 100 B/s ends at 3.5 s. C (75 B left) and D (50 B left) share
    # link 2 at 50 B/s: D ends at 4.25 s, C's last 25 B alone at 100 B/s at 4.5 s. Bytes: link 0 A's 100 + B's
    # 50, link 1 B's 50 + C's 100, link 2 D's 100 + C's 100.
    env = simpy.Environment()
    fab = Fabric(env, [100.0, 100.0, 100.0])
    ends = {}
    env.timeout(2.0).callbacks.append(
        lambda _e: fab.run_plan(PLAN, 100.0, lambda: ends.__setitem__("plan", env.now), ahead=True))
    env.timeout(2.5).callbacks.append(
        lambda _e: fab.transfer((2,), (1.0,), 100.0, 0.0, lambda: ends.__setitem__("D", env.now)))
    env.timeout(2.75).callbacks.append(
        lambda _e: fab.transfer((1, 2), (1.0, 1.0), 100.0, 0.0, lambda: ends.__setitem__("C", env.now)))
    env.run()
    assert (fab.woken, fab.late) == (1, 0)
    assert ends == {"plan": 3.5, "D": 4.25, "C": 4.5}
    assert fab.bytes_on_link == [150.0, 150.0, 200.0]


def test_a_plan_on_a_busy_link_runs_on_the_clock():
    # C starts on link 1 at t = 1 and streams alone until 1 + 100 B / 100 B/s = 2 s; the plan started at
    # 1.5 s finds B's link 1 busy and runs flow by flow: nothing ahead, no plan to wake
    env = simpy.Environment()
    fab = Fabric(env, [100.0, 100.0])
    env.timeout(1.0).callbacks.append(lambda _e: fab.transfer((1,), (1.0,), 100.0, 0.0, lambda: None))
    env.timeout(1.5).callbacks.append(lambda _e: fab.run_plan(PLAN, 100.0, lambda: None, ahead=True))
    env.run(until=1.75)
    assert fab._aheads == 0 and fab.woken == 0


# A plan of two phases on two links of 100 B/s, for S = 100 B: X crosses link 0 with the whole buffer; then Y
# crosses links 0 and 1 with half of it after a latency of 0.25 s (HybridEP's plans have phases).
PHASES = [[FlowSpec((0,), (1.0,), 1.0, 0.0)], [FlowSpec((0, 1), (1.0, 1.0), 0.5, 0.25)]]


def run_phases(ahead, joiner_at=None, joins=False):
    """PHASES from t = 2 s (and at ``joiner_at`` a flow C of 100 B on link 1): ends, bytes, plans woken (with
    ``joins``: flows joined as they began instead)."""
    env = simpy.Environment()
    fab = Fabric(env, [100.0, 100.0])
    fab.joins = joins
    ends = {}
    env.timeout(2.0).callbacks.append(
        lambda _e: fab.run_plan(PHASES, 100.0, lambda: ends.__setitem__("plan", env.now), ahead=ahead))
    if joiner_at is not None:
        env.timeout(joiner_at).callbacks.append(
            lambda _e: fab.transfer((1,), (1.0,), 100.0, 0.0, lambda: ends.__setitem__("C", env.now)))
    env.run()
    return ends, list(fab.bytes_on_link), fab.late if joins else fab.woken


# X alone ends at 2 + 100/100 = 3 s; Y streams from 3.25 s, 50 B alone at 100 B/s: the plan ends at 3.75 s.
# C at 3.5 s (second phase, streaming): Y has 25 B left and shares link 1 with C at 50 B/s: it ends at 4.0 s; C
# has moved 25 B, its 75 B alone end at 4.75 s. C at 3.125 s (Y's latency): C alone moves 12.5 B until 3.25 s,
# then Y and C at 50 B/s: Y's 50 B end at 4.25 s; C's last 100 − 12.5 − 50 = 37.5 B alone at 4.625 s.
@pytest.mark.parametrize("joiner_at, ends, moved", [
    (None, {"plan": 3.75}, [150.0, 50.0]),
    (3.5, {"plan": 4.0, "C": 4.75}, [150.0, 150.0]),
    (3.125, {"plan": 4.25, "C": 4.625}, [150.0, 150.0]),
], ids=["alone", "woken-streaming", "woken-in-latency"])
def test_a_plan_of_phases_runs_ahead_and_wakes_in_its_later_phase(joiner_at, ends, moved):
    assert run_phases(True, joiner_at) == (ends, moved, 0 if joiner_at is None else 1)
    assert run_phases(False, joiner_at)[:2] == (ends, moved)
    # C joined to the plan instead (link 1 is the plan's alone): the same ends and bytes, one flow joined
    assert run_phases(True, joiner_at, joins=True) == (ends, moved, 0 if joiner_at is None else 1)


def run_joined(ahead, joiner_at=None, lazy_at=2.0, lazy_latency=0.5, joins=False):
    """Three links of 100 B/s. At ``lazy_at`` a flow L of 50 B over links 1 and 2 is started with a latency of
    ``lazy_latency`` (the fabric idle: started ahead, its end scheduled), at t = 2 s PLAN (S = 100 B); at
    ``joiner_at`` a flow C of 100 B on link 2. Ends, bytes per link, plans woken, whether the plan ran ahead."""
    env = simpy.Environment()
    fab = Fabric(env, [100.0, 100.0, 100.0])
    fab.joins = joins
    ends = {}
    ran_ahead = []

    def start(_e):
        fab.run_plan(PLAN, 100.0, lambda: ends.__setitem__("plan", env.now), ahead=ahead)
        ran_ahead.append(fab._aheads == 1 and fab._lazies == 0 and not any(fab.on_link))

    env.timeout(lazy_at).callbacks.append(
        lambda _e: fab.transfer((1, 2), (1.0, 1.0), 50.0, lazy_latency, lambda: ends.__setitem__("L", env.now)))
    env.timeout(2.0).callbacks.append(start)
    if joiner_at is not None:
        env.timeout(joiner_at).callbacks.append(
            lambda _e: fab.transfer((2,), (1.0,), 100.0, 0.0, lambda: ends.__setitem__("C", env.now)))
    env.run()
    return ends, list(fab.bytes_on_link), fab.woken, ran_ahead[0]


def test_a_plan_run_ahead_takes_in_a_flow_started_ahead_on_its_links():
    # L is started ahead (alone: its end scheduled for 2.5 + 50/100 = 3.0 s) and shares link 1 with B, so the
    # plan and L run together. From t = 2: A alone on link 0 at 100 B/s; at 2.25 B starts (A has 75 B left):
    # link 0 splits A, B at 50 B/s. At 2.5 L starts: link 1 splits B, L at 50 B/s (link 2: L alone, not tight),
    # every flow at 50 B/s. Left at 2.5: A 75 − 12.5 = 62.5 B, B 50 − 12.5 = 37.5 B, L 50 B. B ends at
    # 2.5 + 37.5/50 = 3.25 s; A then has 62.5 − 37.5 = 25 B alone at 100 B/s: the plan ends at 3.5 s. L has
    # 50 − 37.5 = 12.5 B alone at 100 B/s: it ends at 3.375 s (not its 3.0 s alone). Bytes: link 0 A's 100 +
    # B's 50 = 150 B, link 1 B's 50 + L's 50 = 100 B, link 2 L's 50 B.
    ends, moved, woken, ran_ahead = run_joined(ahead=True)
    assert ran_ahead  # L joined to the plan: nothing started ahead alone, nothing on the links
    assert ends == {"plan": 3.5, "L": 3.375}
    assert moved == [150.0, 100.0, 50.0]
    assert woken == 0
    assert run_joined(ahead=False)[:2] == (ends, moved)  # on the clock, flow by flow: the same


# C (100 B on link 2, L's link the plan does not use) comes at t = 3.0. As above until then: A has
# 62.5 − 0.5·50 = 37.5 B left, B 37.5 − 25 = 12.5 B, L 50 − 25 = 25 B. Link 2 now splits L and C, link 1 B and
# L, link 0 A and B: all at 50 B/s. B ends at 3.0 + 12.5/50 = 3.25 s; then A alone at 100 B/s with 37.5 − 12.5
# = 25 B ends at 3.5 s, L (12.5 B left, still sharing link 2 with C at 50 B/s) at 3.5 s. C has moved 25 B by
# then; its 75 B alone at 100 B/s end at 4.25 s. Bytes: link 2 L's 50 + C's 100 = 150 B.
# C at 2.25 s, as B's latency ends and before L's: B starts on the clock at 2.25 s, L at 2.5 s. C streams alone
# on link 2 until 2.5 s (75 B left), then links 0, 1, 2 each split two flows: all at 50 B/s; left at 2.5: A 62.5,
# B 37.5, C 75, L 50 B. B ends at 3.25 s; A's last 25 B alone at 100 B/s end at 3.5 s, L's 12.5 B at 50 B/s
# (beside C) at 3.5 s, C's last 37.5 − 12.5 = 25 B alone at 3.75 s.
@pytest.mark.parametrize("joiner_at, ends, moved", [
    (3.0, {"plan": 3.5, "L": 3.5, "C": 4.25}, [150.0, 100.0, 150.0]),
    (2.25, {"plan": 3.5, "L": 3.5, "C": 3.75}, [150.0, 100.0, 150.0]),
], ids=["all-streaming", "in-latency"])
def test_a_flow_meeting_a_joined_flow_wakes_the_plan(joiner_at, ends, moved):
    got, got_moved, woken, ran_ahead = run_joined(ahead=True, joiner_at=joiner_at)
    assert ran_ahead
    assert woken == 1
    assert (got, got_moved) == (ends, moved)
    assert run_joined(ahead=False, joiner_at=joiner_at)[:2] == (ends, moved)
    # with joins, C (on link 2, which the plan holds through L) joins the plan and L: the same, none woken
    assert run_joined(ahead=True, joiner_at=joiner_at, joins=True)[:3] == (ends, moved, 0)


def test_a_capacity_change_wakes_a_plan_and_its_joined_flow():
    # set_capacity (a timed fault) puts every flow run ahead on the fabric first; at the same capacity the
    # rates and ends are those of the run together (test_a_plan_run_ahead_takes_in_...: 3.5 s and 3.375 s)
    env = simpy.Environment()
    fab = Fabric(env, [100.0, 100.0, 100.0])
    ends = {}
    env.timeout(2.0).callbacks.append(lambda _e: (
        fab.transfer((1, 2), (1.0, 1.0), 50.0, 0.5, lambda: ends.__setitem__("L", env.now)),
        fab.run_plan(PLAN, 100.0, lambda: ends.__setitem__("plan", env.now), ahead=True)))
    env.timeout(3.0).callbacks.append(lambda _e: fab.set_capacity(2, 100.0))
    env.run()
    assert fab.joined == 1 and fab.woken == 1
    assert ends == {"L": 3.375, "plan": 3.5}
    assert fab.bytes_on_link == [150.0, 100.0, 50.0]


def test_a_flow_started_ahead_that_streams_already_keeps_the_plan_on_the_clock():
    # L, started at 1.75 s with a latency of 0.125 s, streams alone from 1.875 s: the bytes it has moved by the
    # plan's start are the clock's to settle, so the plan runs flow by flow. L alone on link 1 at 100 B/s has
    # 50 − 37.5 = 12.5 B left when B starts at 2.25; B and L then share link 1 at 50 B/s, A and B link 0: L ends
    # at 2.25 + 12.5/50 = 2.5 s. A (75 − 12.5 = 62.5 B left) and B (37.5 B) go on sharing link 0 at 50 B/s: B
    # ends at 2.5 + 0.75 = 3.25 s, A's last 25 B alone at 100 B/s at 3.5 s.
    ends, moved, woken, ran_ahead = run_joined(ahead=True, lazy_at=1.75, lazy_latency=0.125)
    assert not ran_ahead and woken == 0
    assert ends == {"L": 2.5, "plan": 3.5}
    assert run_joined(ahead=False, lazy_at=1.75, lazy_latency=0.125)[:2] == (ends, moved)


# DeepSeek-V2-Lite with expert parallelism 16 over 2 DGX H100: each MoE layer's token dispatch and combine
# cross both nodes' NICs.
TWO_NODES = ["scenarios/deepseek-v2-lite-moe-16-h100.yaml", "--set", "parallel.ep=16",
             "--set", "training.global_batch=16"]
# The same over 6 nodes with 3 pipeline stages and 4 micro-batches: a stage's activations to the next stage
# cross the NICs its dispatches use, and meet one in flight.
PIPELINE = ["scenarios/deepseek-v2-lite-moe-16-h100.yaml", "--set", "parallel.ep=16", "--set", "parallel.pp=3",
            "--set", "cluster.nodes=6", "--set", "training.global_batch=64"]
# EP 16 over the attention's TP 2 × DP 8 (MoE parallel folding, etp 1, as the DeepSeek-V3 layout) with DeepEP:
# a tensor-parallel all-gather started ahead on the NVLink its dispatch uses, about to stream as it begins,
# is run with it (``Fabric._run_ahead``'s joined flows). The parameter all-gathers of the step's first forward and
# the gradient reduce-scatters of its last backward, over DP 8, stream beside dispatches too and meet some run
# ahead (woken, or with joins joined late). (The experts, over their expert-DP group of 1, gather nothing.)
EP_OVER_TP = ["scenarios/deepseek-v2-lite-moe-16-h100.yaml", "--set", "parallel.ep=16", "--set", "parallel.tp=2",
              "--set", "parallel.etp=1", "--set", "parallel.dp=8", "--set", "training.global_batch=16",
              "--set", "parallel.sequence_parallel=true", "--set", "parallel.moe_token_dispatcher_type=flex",
              "--set", "parallel.moe_flex_dispatcher_backend=deepep"]
# The same with HybridEP, whose plans have three phases (its 64-token pipeline)
HYBRID_EP = EP_OVER_TP[:-1] + ["parallel.moe_flex_dispatcher_backend=hybridep"]
# The alltoall dispatcher padded to capacity (Qwen3-235B's recipe): every rank receives the mean, a plain
# all_to_all (program.is_token_exchange), over the pipeline's 6 nodes
PADDED = PIPELINE + ["--set", "model.moe_expert_capacity_factor=1.0", "--set",
                     "model.moe_pad_expert_input_to_capacity=true"]


def summary_and_counts(args, ahead, monkeypatch, capsys, joins=True):
    """The run's --json summary (wall time dropped), plans run ahead, plans woken, flows joined to a plan as it
    began (``joined``) and as they began (``late``, with ``joins``)."""
    monkeypatch.setattr(fabric_mod, "PLANS_AHEAD", ahead)
    monkeypatch.setattr(fabric_mod, "JOINS", joins)
    counts = {"ahead": 0, "woken": 0, "joined": 0, "late": 0}
    run_ahead, wake_plan = Fabric._run_ahead, Fabric._wake_plan

    def counted_run_ahead(self, *a):
        went = run_ahead(self, *a)
        counts["ahead"] += went
        counts["joined"], counts["late"] = self.joined, self.late
        return went

    def counted_wake(self, a):
        counts["woken"] += 1
        wake_plan(self, a)
        counts["late"] = self.late

    monkeypatch.setattr(Fabric, "_run_ahead", counted_run_ahead)
    monkeypatch.setattr(Fabric, "_wake_plan", counted_wake)
    assert main(["run", *args, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    summary["sim"].pop("wall_s")
    return summary, counts


def split_busiest(summary):
    """The busiest links without their names, and by name: links of the same bytes but for the last bits
    (the NICs of one pipeline stage) may come in either order, and so differ at the list's cut."""
    busiest = summary["links"].pop("busiest")
    return [{k: v for k, v in b.items() if k != "link"} for b in busiest], {b["link"]: b for b in busiest}


def tied_nic_directions(fast, exact):
    """The busiest NIC's direction left out where both runs name the same NIC at the same utilisation: its
    two directions carry the same bytes (an all-to-all's), and the last bits of their sums, added in
    another order by the fast path, pick which of them is named (outputs/nic.py busiest_nic)."""
    f, e = fast["links"]["busiest_nic"], exact["links"]["busiest_nic"]
    if f["nic"] == e["nic"] and math.isclose(f["utilisation"], e["utilisation"], rel_tol=1e-12):
        f.pop("direction")
        e.pop("direction")


def assert_same(fast, exact, path="summary"):
    """Every key and string the same, every number equal to within its last bits: the plan run ahead
    adds the same rates and bytes in another order (its run alone shifted by its start)."""
    if isinstance(exact, dict):
        assert sorted(fast) == sorted(exact), path
        for key in exact:
            assert_same(fast[key], exact[key], f"{path}.{key}")
    elif isinstance(exact, list):
        assert len(fast) == len(exact), path
        for i, (f, e) in enumerate(zip(fast, exact)):
            assert_same(f, e, f"{path}[{i}]")
    elif isinstance(exact, float):
        assert math.isclose(fast, exact, rel_tol=1e-12, abs_tol=1e-300), (path, fast, exact)
    else:
        assert fast == exact, path


EXACT: dict = {}  # id(args) → the exact path's summary and counts (each case runs it once for both joins)


@pytest.mark.parametrize("joins", [True, False], ids=["joins", "wakes"])
@pytest.mark.parametrize("args", [TWO_NODES, PIPELINE, EP_OVER_TP, HYBRID_EP, PADDED],
                         ids=["ep16-2-nodes", "ep16-pp3-6-nodes", "ep16-over-tp2-deepep", "ep16-over-tp2-hybridep",
                              "ep16-pp3-padded-all-to-all"])
def test_the_dispatch_fast_path_gives_the_exact_paths_summary(args, joins, monkeypatch, capsys):
    fast, counts = summary_and_counts(args, True, monkeypatch, capsys, joins)
    if id(args) not in EXACT:
        EXACT[id(args)] = summary_and_counts(args, False, monkeypatch, capsys)
    exact, none = json.loads(json.dumps(EXACT[id(args)][0])), EXACT[id(args)][1]
    assert counts["ahead"] > 0 and none == {"ahead": 0, "woken": 0, "joined": 0, "late": 0}
    assert fast["sim"].pop("events") < exact["sim"].pop("events")  # what the fast path is for
    fast_list, fast_named = split_busiest(fast)
    exact_list, exact_named = split_busiest(exact)
    tied_nic_directions(fast, exact)
    assert_same(fast_list, exact_list)
    both = sorted(set(fast_named) & set(exact_named))
    assert len(both) >= len(exact_named) // 2
    assert_same([fast_named[n] for n in both], [exact_named[n] for n in both])
    assert_same(fast, exact)
    if args is PADDED:  # its dispatches are plain all_to_alls (none all_to_all_v), and they ran ahead
        from emulator.run.simulation import build_workload
        from emulator.scenario import load_scenario

        sets = [a for a in args[1:] if a != "--set"]
        program, _ = build_workload(load_scenario(args[0], sets), blocks=True)
        names = {p.collective for op in program.ops for p in (op.parts or (op,)) if p.collective}
        assert "all_to_all" in names and not any(n.startswith("all_to_all_v") for n in names)
    met = counts["late"] if joins else counts["woken"]  # a flow met a dispatch run ahead: joined to it, or woken
    if not joins:
        assert counts["late"] == 0
    if args is PIPELINE or args is PADDED:
        assert met > 0  # a pipeline transfer met a dispatch run ahead
    if args is EP_OVER_TP or args is HYBRID_EP:
        assert counts["joined"] > 0 and met > 0  # all-gathers run with dispatches; some met them later


@pytest.mark.parametrize("args", [["scenarios/quickstart.yaml"], EP_OVER_TP], ids=["quickstart", "ep16-over-tp2-deepep"])
def test_collectives_handed_over_early_give_the_clocks_summary(args, monkeypatch, capsys):
    # quickstart: TP 2 and DP 2 on one node's NVLink ports, no collective private; one rank of each TP pair
    # simulated, so each TP collective waits for no one and is one flow: handed to the fabric as its start
    # is known (Engine._issue). Against every one started on the clock: the same summary to its last bits
    # (flows that begin together placed in another order), and fewer events.
    from emulator.run.engine import Engine

    issued = [0]
    issue = Engine._issue

    def counted(self, *a):
        went = issue(self, *a)
        issued[0] += went
        return went

    monkeypatch.setattr(Engine, "_issue", counted)
    early, _ = summary_and_counts(args, True, monkeypatch, capsys)
    assert issued[0] > 0
    monkeypatch.setattr(Engine, "_issue", lambda self, *a: False)
    clock, _ = summary_and_counts(args, True, monkeypatch, capsys)
    # one start event fewer per collective issued early, less those that shared a start with another op
    saved = clock["sim"].pop("events") - early["sim"].pop("events")
    assert 0 < saved <= issued[0]
    early_list, _ = split_busiest(early)
    clock_list, _ = split_busiest(clock)
    assert_same(early_list, clock_list)
    assert_same(early, clock)


# Context parallelism by all-gather over 2 DGX A100 a CP group (TP 4 × CP 4), 2 pipeline stages over 4 nodes: the fold
# takes each CP group whole (folding._cp_axes), so its K/V all-gathers and their reduce-scatters have one simulated
# member and several flows, and run ahead (program.runs_ahead); the stages' activations cross the NICs they use.
CP_ALL_GATHER = """
name: cp-all-gather
cluster: {nodes: 4, node: dgx-a100, fabric: {kind: fat_tree, leaf_size: 4}}
model: {preset: gpt3-1.3b, layers: 4, seq_len: 8192}
training: {global_batch: 4, micro_batch: 1}
parallel: {tp: 4, cp: 4, pp: 2, cp_comm_type: all_gather}
"""


def test_a_cp_all_gather_folded_whole_runs_ahead_and_gives_the_exact_paths_summary(tmp_path, monkeypatch, capsys):
    path = tmp_path / "cp.yaml"
    path.write_text(CP_ALL_GATHER)
    fast, counts = summary_and_counts([str(path)], True, monkeypatch, capsys)
    exact, none = summary_and_counts([str(path)], False, monkeypatch, capsys)
    assert fast["sim"]["ranks_simulated"] == 2  # one a stage: 32 / 2 stages / (4 TP x 4 CP folded)
    assert counts["ahead"] > 0 and none["ahead"] == 0
    assert fast["sim"].pop("events") < exact["sim"].pop("events")
    fast_list, _ = split_busiest(fast)
    exact_list, _ = split_busiest(exact)
    tied_nic_directions(fast, exact)
    assert_same(fast_list, exact_list)
    assert_same(fast, exact)
