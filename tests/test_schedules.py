"""Pipeline schedules: exact bubbles on a tiny list scheduler, in-flight counts, validation."""
import pytest

from emulator.errors import ScenarioError
from emulator.scenario.stages import rank_of, stage_layers, virtual_stage
from emulator.workload.schedules import SCHEDULES, Task, dualpipe_steps, dualpipev_steps, max_in_flight, schedule


def makespan(name: str, p: int, m: int, v: int, tf: float, tb: float) -> float:
    """Run every stage's task list in order; F(mb, k) needs F(mb, k-1), B(mb, k) needs B(mb, k+1)
    (and the last virtual stage's F(mb)); communication is free. Costs are per chunk."""
    lists = {s: schedule(name, s, p, m, v) for s in range(p)}
    pos = {s: 0 for s in range(p)}
    free = {s: 0.0 for s in range(p)}
    done: dict = {}
    V = p * v
    while any(pos[s] < len(lists[s]) for s in range(p)):
        moved = False
        for s in range(p):
            while pos[s] < len(lists[s]):
                t = lists[s][pos[s]]
                vs = t.chunk * p + s
                if t.phase == "F":
                    need = [("F", t.microbatch, vs - 1)] if vs > 0 else []
                else:
                    need = [("B", t.microbatch, vs + 1)] if vs < V - 1 else [("F", t.microbatch, vs)]
                if any(n not in done for n in need):
                    break
                start = max([free[s]] + [done[n] for n in need])
                free[s] = start + (tf if t.phase == "F" else tb)
                done[(t.phase, t.microbatch, vs)] = free[s]
                pos[s] += 1
                moved = True
        assert moved, "schedule deadlocks"
    return max(free.values())


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(4, 8), (4, 4), (8, 32), (2, 5)])
def test_bubble_gpipe_1f1b(name, p, m):
    # tf = 1, tb = 2 per stage: ideal work m·3; makespan (m + p − 1)·3, bubble (p−1)/m.
    span = makespan(name, p, m, 1, 1.0, 2.0)
    assert span == pytest.approx((m + p - 1) * 3.0)
    assert (span - 3.0 * m) / (3.0 * m) == pytest.approx((p - 1) / m)


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (4, 4, 2), (2, 4, 3), (4, 12, 3), (8, 16, 2)])
def test_bubble_interleaved(p, m, v):
    # Per chunk tf = 1/v, tb = 2/v: ideal m·3, bubble (p−1)/(v·m) → makespan 3m + 3(p−1)/v.
    span = makespan("interleaved-1f1b", p, m, v, 1.0 / v, 2.0 / v)
    assert (span - 3.0 * m) / (3.0 * m) == pytest.approx((p - 1) / (v * m))


@pytest.mark.parametrize("name,v", [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2)])
def test_every_task_once(name, v):
    p, m = 4, 8
    for s in range(p):
        tasks = schedule(name, s, p, m, v)
        want = {(ph, mb, c) for ph in "FB" for mb in range(m) for c in range(v)}
        assert sorted(tasks) == sorted(Task(*x) for x in want)


def test_in_flight():
    # 1F1B: stage s holds p − s micro-batches (p = 4: 4, 3, 2, 1); GPipe holds all m = 8.
    assert [max_in_flight(schedule("1f1b", s, 4, 8)) for s in range(4)] == [4, 3, 2, 1]
    assert max_in_flight(schedule("gpipe", 0, 4, 8)) == 8
    # Interleaved stage 0, p = 4, v = 2: warm-up (4−1)·2 + (2−1)·4 = 10 chunks, +1 in steady state.
    assert max_in_flight(schedule("interleaved-1f1b", 0, 4, 8, 2)) == 11
    # 1F1B with fewer micro-batches than stages keeps only m.
    assert max_in_flight(schedule("1f1b", 0, 8, 3)) == 3


def test_interleaved_order_matches_megatron():
    # p = 2, v = 2, m = 4, stage 1: warm-up (2−1−1)·2 + 1·2 = 2: F(0,c0) F(1,c0), then 1F1B.
    t = schedule("interleaved-1f1b", 1, 2, 4, 2)
    assert t[:4] == [Task("F", 0, 0), Task("F", 1, 0), Task("F", 0, 1), Task("B", 0, 1)]


def test_validation():
    with pytest.raises(ScenarioError, match="multiple of pp"):
        schedule("interleaved-1f1b", 0, 4, 6, 2)
    with pytest.raises(ScenarioError, match="unknown schedule"):
        schedule("zigzag", 0, 4, 8)
    with pytest.raises(ScenarioError, match="interleaved"):
        schedule("1f1b", 0, 4, 8, 2)
    with pytest.raises(ScenarioError, match="interleaved"):
        schedule("zb-h1", 0, 4, 8, 2)
    assert set(SCHEDULES) == {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "dualpipev", "dualpipe"}
    with pytest.raises(ScenarioError, match="dualpipe needs an even pp"):
        schedule("dualpipe", 0, 3, 12, 1)
    with pytest.raises(ScenarioError, match="dualpipe needs an even number of micro-batches"):
        schedule("dualpipe", 0, 4, 9, 1)
    with pytest.raises(ScenarioError, match=r"at least 2\*pp = 8, got 6"):
        schedule("dualpipe", 0, 4, 6, 1)
    with pytest.raises(ScenarioError, match="interleaved"):
        schedule("dualpipe", 0, 4, 8, 2)
    with pytest.raises(ScenarioError, match="virtual_stages must be 2"):
        schedule("zb-v", 0, 4, 8, 1)
    with pytest.raises(ScenarioError, match="virtual_stages must be 2"):
        schedule("dualpipev", 0, 4, 8, 3)
    with pytest.raises(ScenarioError, match=r"at least 2\*pp = 8 micro-batches"):
        schedule("dualpipev", 0, 4, 7, 2)


def split_makespan(name: str, p: int, m: int, tf: float, tb: float, tw: float) -> float:
    """As makespan, with split backwards: a whole backward B costs tb + tw and sends its input gradient
    at its end, an input-gradient pass I costs tb and sends at its end, W(mb) costs tw and follows I(mb);
    B or I (mb) needs the next stage's gradient ("G")."""
    lists = {s: schedule(name, s, p, m) for s in range(p)}
    cost = {"F": tf, "B": tb + tw, "I": tb, "W": tw}
    pos, free, done = {s: 0 for s in range(p)}, {s: 0.0 for s in range(p)}, {}
    while any(pos[s] < len(lists[s]) for s in range(p)):
        moved = False
        for s in range(p):
            while pos[s] < len(lists[s]):
                t = lists[s][pos[s]]
                grad = [("G", t.microbatch, s + 1)] if s < p - 1 else [("F", t.microbatch, s)]
                need = {"F": [("F", t.microbatch, s - 1)] if s else [], "B": grad, "I": grad,
                        "W": [("G", t.microbatch, s)]}[t.phase]
                if any(n not in done for n in need):
                    break
                free[s] = max([free[s]] + [done[n] for n in need]) + cost[t.phase]
                done[(t.phase if t.phase in "FW" else "G", t.microbatch, s)] = free[s]
                pos[s] += 1
                moved = True
        assert moved, "schedule deadlocks"
    return max(free.values())


@pytest.mark.parametrize("p,m", [(4, 8), (4, 4), (8, 16), (2, 5), (3, 7)])
@pytest.mark.parametrize("tf,tb,tw", [(1.0, 1.0, 1.0), (1.0, 2.0, 1.0), (2.0, 2.0, 1.0)])
def test_bubble_zb_h1(p, m, tf, tb, tw):
    # Qi et al. ICLR'24 Table 1: 1F1B bubble (p−1)(F+B+W), ZB-H1 (p−1)(F+B−W), over the work m(F+B+W).
    # e.g. p 4, m 8, F 1, B 2, W 1: 1F1B 8·4 + 3·4 = 44, ZB-H1 8·4 + 3·(1+2−1) = 38.
    work = m * (tf + tb + tw)
    assert split_makespan("1f1b", p, m, tf, tb, tw) == pytest.approx(work + (p - 1) * (tf + tb + tw))
    assert split_makespan("zb-h1", p, m, tf, tb, tw) == pytest.approx(work + (p - 1) * (tf + tb - tw))


def test_zb_h1_order_and_memory():
    p, m = 4, 8
    for s in range(p):  # every F once; each micro-batch's backward whole (B) or I then, later, W
        tasks = schedule("zb-h1", s, p, m)
        assert sorted(t for t in tasks if t.phase == "F") == [Task("F", mb) for mb in range(m)]
        for mb in range(m):
            whole, part, w = (sum(t == Task(ph, mb) for t in tasks) for ph in "BIW")
            assert (whole, part, w) in ((1, 0, 0), (0, 1, 1))
            assert not part or tasks.index(Task("W", mb)) > tasks.index(Task("I", mb))
    assert schedule("zb-h1", 0, p, m) == schedule("1f1b", 0, p, m)  # stage 0 splits nothing
    # stage 3 (r = 3, no warm-up) splits its first 3 backwards and holds their W back; the 4th to 7th are
    # whole; the last (i = 7 ≥ r) is split and runs W0; W1, W2 and W7 run at the end (pop_all)
    t3 = schedule("zb-h1", 3, p, m)
    assert t3[:8] == [Task("F", 0), Task("I", 0), Task("F", 1), Task("I", 1), Task("F", 2), Task("I", 2),
                      Task("F", 3), Task("B", 3)]
    assert t3[-6:] == [Task("F", 7), Task("I", 7), Task("W", 0), Task("W", 1), Task("W", 2), Task("W", 7)]
    # held from F to W: p = 4 micro-batches on every stage (the paper's p·M_B, 1F1B's stage-0 peak)
    assert [max_in_flight(schedule("zb-h1", s, p, m)) for s in range(p)] == [4, 4, 4, 4]


def v_makespan(name: str, p: int, m: int, tf: float, tb: float, tw: float) -> float:
    """As split_makespan over a V's 2p chunks (rank s holds chunks s and 2p − 1 − s); costs are per chunk.
    DualPipeV's steps run as its source runs them: a pair (F of one chunk, B of the other) costs both, and
    both passes' outputs leave at its end (``_forward_backward_chunk`` sends after the compute)."""
    steps = {s: {"dualpipev": dualpipev_steps, "dualpipe": dualpipe_steps}[name](s, p, m) if "dual" in name
             else [(t,) for t in schedule(name, s, p, m, 2)] for s in range(p)}
    # dualpipe: chunk c of rank s runs as the V's, but each direction is a pipeline of its own p stages
    first = {vs for vs in range(2 * p) if vs % p == 0} if name == "dualpipe" else {0}
    last = {vs for vs in range(2 * p) if vs % p == p - 1} if name == "dualpipe" else {2 * p - 1}
    cost = {"F": tf, "B": tb + tw, "I": tb, "W": tw}
    pos, free, done = {s: 0 for s in range(p)}, {s: 0.0 for s in range(p)}, {}

    def needs(t: Task, vs: int) -> list:
        grad = [("G", t.microbatch, vs + 1)] if vs not in last else [("F", t.microbatch, vs)]
        return {"F": [("F", t.microbatch, vs - 1)] if vs not in first else [], "B": grad, "I": grad,
                "W": [("G", t.microbatch, vs)]}[t.phase]

    while any(pos[s] < len(steps[s]) for s in range(p)):
        moved = False
        for s in range(p):
            while pos[s] < len(steps[s]):
                step = steps[s][pos[s]]
                need = [n for t in step for n in needs(t, virtual_stage(t.chunk, s, p, True))]
                if any(n not in done for n in need):
                    break
                free[s] = max([free[s]] + [done[n] for n in need]) + sum(cost[t.phase] for t in step)
                for t in step:
                    done[(t.phase if t.phase in "FW" else "G", t.microbatch, virtual_stage(t.chunk, s, p, True))] = free[s]
                pos[s] += 1
                moved = True
        assert moved, "schedule deadlocks"
    return max(free.values())


def test_v_placement():
    # p 4: rank 0 holds chunks 0 and 7, rank 3 chunks 3 and 4 (the V's tip); an interleaved split 0 and 4.
    assert [virtual_stage(c, 0, 4, True) for c in (0, 1)] == [0, 7]
    assert [virtual_stage(c, 3, 4, True) for c in (0, 1)] == [3, 4]
    assert [rank_of(vs, 4, True) for vs in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert [rank_of(vs, 4) for vs in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert stage_layers((1, 2, 3, 4, 5, 6, 7, 8), 4, True)[0] == (1, 8)


@pytest.mark.parametrize("name", ["zb-v", "dualpipev"])
@pytest.mark.parametrize("p,m", [(4, 8), (2, 4), (3, 7), (8, 16)])
def test_v_every_task_once(name, p, m):
    # every (micro-batch, chunk) once forward and once backward: whole (B), or split in I then W
    for s in range(p):
        tasks = schedule(name, s, p, m, 2)
        for c in (0, 1):
            for mb in range(m):
                got = [t.phase for t in tasks if (t.microbatch, t.chunk) == (mb, c)]
                assert got in (["F", "B"], ["F", "I", "W"])
        if name == "zb-v":  # the authors' greedy splits every backward
            assert not [t for t in tasks if t.phase == "B"]


@pytest.mark.parametrize("p,m", [(4, 8), (4, 16), (8, 16), (2, 4), (3, 6)])
def test_bubble_zb_v(p, m):
    # Equal chunk costs F = B = W = 1 (the order the authors' greedy makes for them): 2m chunk passes of each
    # kind on every rank, 6m; the last rank waits for the p − 1 chunk forwards before it, and nothing else
    # idles: 6m + (p − 1) (p 4, m 8: 51). 1F1B on the same stages (2 chunks: F 2, B + W 4) 6m + 6(p − 1).
    assert v_makespan("zb-v", p, m, 1.0, 1.0, 1.0) == pytest.approx(6 * m + (p - 1))
    assert split_makespan("1f1b", p, m, 2.0, 2.0, 2.0) == pytest.approx(6 * m + 6 * (p - 1))


@pytest.mark.parametrize("p,m", [(4, 8), (4, 10), (8, 16), (2, 4), (3, 6), (6, 12)])
@pytest.mark.parametrize("tf,tb,tw", [(1.0, 1.0, 1.0), (2.0, 2.0, 1.0), (1.0, 1.0, 0.5)])
def test_bubble_dualpipev(p, m, tf, tb, tw):
    # DualPipe README over PP = 2p stages: bubble (PP/2 − 1)(F&B + B − 3W), B the whole backward tb + tw,
    # F&B = tf + tb + tw (passes not overlapped). p 4, (1, 1, 1): 3·(3 + 2 − 3) = 6 over the work 2m·3.
    fb, b = tf + tb + tw, tb + tw
    assert v_makespan("dualpipev", p, m, tf, tb, tw) == pytest.approx(2 * m * (tf + tb + tw)
                                                                      + (p - 1) * (fb + b - 3 * tw))


def test_dualpipev_order_and_memory():
    # dualpipev.py step 1 on rank 0 of 4: (4 − 0 − 1)·2 = 6 forwards of chunk 0, step 2: F0 F1 once; step 3
    # I, W, F of chunk 1; the main step pairs F0&B1 then F1&B0 (the last rank runs its first F0, B1 apart).
    s0 = dualpipev_steps(0, 4, 8)
    assert s0[:8] == [(Task("F", i, 0),) for i in range(7)] + [(Task("F", 0, 1),)]
    assert s0[8:11] == [(Task("I", 0, 1),), (Task("W", 0, 1),), (Task("F", 1, 1),)]
    assert (Task("F", 7, 0), Task("B", 3, 1)) in s0
    s3 = dualpipev_steps(3, 4, 8)
    assert s3[8:10] == [(Task("F", 4, 0),), (Task("B", 0, 1),)]
    # activations per device: the README's PP + 1 chunk micro-batches (PP = 2p = 8: 9), on every rank;
    # ZB-V the paper's p·M_B, 1F1B's first-stage peak: 2p chunks of half a stage (8)
    assert [max_in_flight(schedule("dualpipev", s, 4, 8, 2)) for s in range(4)] == [9, 9, 9, 9]
    assert [max_in_flight(schedule("zb-v", s, 4, 8, 2)) for s in range(4)] == [8, 8, 8, 8]


@pytest.mark.parametrize("p,m", [(4, 8), (4, 12), (8, 16), (8, 20), (2, 4), (6, 12)])
@pytest.mark.parametrize("tf,tb,tw", [(1.0, 1.0, 1.0), (2.0, 2.0, 1.0), (1.0, 1.0, 0.5)])
def test_bubble_dualpipe(p, m, tf, tb, tw):
    # DualPipe README over PP = p stages: (PP/2 − 1)(F&B + B − 3W), B = tb + tw, F&B = tf + tb + tw, over the
    # work m(F + B) (m/2 micro-batches a direction, one stage each). p 8, (1, 1, 1): 3·(3 + 2 − 3) = 6.
    fb, b = tf + tb + tw, tb + tw
    assert v_makespan("dualpipe", p, m, tf, tb, tw) == pytest.approx(m * (tf + tb + tw)
                                                                     + (p // 2 - 1) * (fb + b - 3 * tw))


def test_dualpipe_order_and_memory():
    # the README's figure, 8 ranks and 20 micro-batches, device 0: F0 … F6 of its own direction, then the
    # reverse direction's F, I, W three times, its F, and F7 beside a reverse backward; micro-batches
    # 10 … 19 are the reverse direction's (entering at rank 7), on module 1 of rank 0
    d0 = dualpipe_steps(0, 8, 20)
    assert d0[:7] == [(Task("F", i, 0),) for i in range(7)]
    assert d0[7:17] == [(Task("F", 10, 1),), (Task("I", 10, 1),), (Task("W", 10, 1),), (Task("F", 11, 1),),
                        (Task("I", 11, 1),), (Task("W", 11, 1),), (Task("F", 12, 1),), (Task("I", 12, 1),),
                        (Task("W", 12, 1),), (Task("F", 13, 1),)]
    assert d0[17] == (Task("F", 7, 0), Task("B", 13, 1))
    # device 7 mirrors it: its module 0 is stage 7 of the forward direction, module 1 stage 0 of the reverse
    d7 = dualpipe_steps(7, 8, 20)
    assert d7[:7] == [(Task("F", 10 + i, 1),) for i in range(7)] and d7[7] == (Task("F", 0, 0),)
    # activations per device: the README's PP + 1 stage micro-batches
    assert [max_in_flight(schedule("dualpipe", s, 8, 16)) for s in range(8)] == [9] * 8
