"""Properties of any run (hypothesis): streams never overlap and keep program order; every op
starts after its dependencies end; the makespan is at least the critical path."""
from helpers import custom_scenario, star
from hypothesis import given, settings
from hypothesis import strategies as st

from emulator.program import COLLECTIVE, COMPUTE, Op, Program
from emulator.simulation import run_program

RANKS = 3


@st.composite
def programs(draw):
    ops = []
    n = draw(st.integers(1, 25))
    for i in range(n):
        rank = draw(st.integers(0, RANKS - 1))
        earlier = [o.id for o in ops if o.rank == rank]
        deps = tuple(sorted(set(draw(st.lists(st.sampled_from(earlier), max_size=2))))) if earlier else ()
        if draw(st.integers(0, 5)) == 0:  # a collective every rank issues, in the same position
            cid = len(ops)
            nbytes = draw(st.sampled_from([0.0, 1e6, 1e8]))
            for r in range(RANKS):
                ops.append(Op(cid + r, r, COLLECTIVE, stream="comm", collective="all_reduce",
                              group=tuple(range(RANKS)), bytes=nbytes))
            continue
        ops.append(Op(len(ops), rank, COMPUTE, stream=draw(st.sampled_from(["compute", "aux"])), deps=deps,
                      duration=draw(st.sampled_from([0.0, 1e-3, 2e-3, 5e-3]))))
    return Program(RANKS, ops)


def _critical_path(program):
    """Longest chain of compute durations through deps and stream order (communication as 0)."""
    best, last = {}, {}
    for op in program.ops:
        prev = [best[d] for d in op.deps]
        key = (op.rank, op.stream)
        if key in last:
            prev.append(best[last[key]])
        best[op.id] = max(prev, default=0.0) + (op.duration or 0.0)
        last[key] = op.id
    return max(best.values(), default=0.0)


@settings(max_examples=60, deadline=None)
@given(programs())
def test_run_invariants(tmp_path_factory, program):
    sc = custom_scenario(star(tmp_path_factory.mktemp("g"), RANKS))
    r = run_program(program, sc, record_links=False)
    spans = {s.op_id: s for s in r.spans}
    by_stream = {}
    for op in program.ops:
        s = spans[op.id]
        assert s.start_s <= s.end_s
        for d in op.deps:
            assert spans[d].end_s <= s.start_s + 1e-12
        by_stream.setdefault((op.rank, op.stream), []).append(s)
    for lane in by_stream.values():  # program order, no overlap
        for a, b in zip(lane, lane[1:]):
            assert a.end_s <= b.start_s + 1e-12
    assert r.iteration_time_s >= _critical_path(program) - 1e-12
