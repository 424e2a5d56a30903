"""One GPU's compute streams share the GPU (processor sharing, emulator/devices/sharing.py).

Issue #17: a trace with compute on 3 streams of one GPU ran them concurrently, each at full
speed, so the GPU did 3 s of work per second.
"""
import pytest
from helpers import custom_scenario, star
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emulator.devices.sharing import SharedGpu
from emulator.program import COMPUTE, Op, Program
from emulator.run.simulation import run_program


def test_shared_gpu_bookkeeping_by_hand():
    # jobs of 1 s and 3 s from t=0: both at half speed; the 1 s job ends at 1·2 = 2 s, the other has
    # 3 − 1 = 2 s left, then a 0.5 s job starts at 2 s: ends at 2 + 0.5·2 = 3 s; the first then has
    # 1.5 s left and ends alone at 3 + 1.5 = 4.5 s.
    g = SharedGpu()
    g.add(0.0, 1, 1.0)
    g.add(0.0, 2, 3.0)
    assert g.next_end() == 2.0 and g.finish(2.0) == [1]
    g.add(2.0, 3, 0.5)
    assert g.next_end() == 3.0 and g.finish(3.0) == [3]
    assert g.next_end() == 4.5 and g.finish(4.5) == [2]
    assert g.next_end() is None


def test_three_streams_share_one_gpu(tmp_path):
    # 1, 2 and 3 s of compute on streams a, b, c from t=0. Each runs at 1/3 speed until the 1 s op
    # ends at 1·3 = 3 s; the others have 1 and 2 s left, at 1/2 speed: the 2 s op ends at 3 + 1·2 = 5 s;
    # the last has 1 s left, alone: 6 s = 1 + 2 + 3 (full speed each would have ended at 1, 2, 3 s).
    sc = custom_scenario(star(tmp_path, 1))
    ops = [Op(i, 0, COMPUTE, stream=s, duration=d, name=s) for i, (s, d) in enumerate(zip("abc", (1.0, 2.0, 3.0)))]
    spans = {s.name: (s.start_s, s.end_s) for s in run_program(Program(1, ops), sc).spans}
    assert spans == {"a": (0.0, 3.0), "b": (0.0, 5.0), "c": (0.0, 6.0)}


def test_host_ops_and_other_gpus_do_not_share(tmp_path):
    # A "cpu" stream is the host's time, and rank 1 is another GPU: 2 s each, all from t=0, end at 2 s.
    sc = custom_scenario(star(tmp_path, 2))
    ops = [Op(0, 0, COMPUTE, duration=2.0), Op(1, 0, COMPUTE, stream="cpu", duration=2.0),
           Op(2, 1, COMPUTE, duration=2.0)]
    assert run_program(Program(2, ops), sc).iteration_time_s == 2.0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(st.sampled_from([0.25, 0.5, 1.0, 1.5, 3.0]), min_size=1, max_size=4), min_size=1, max_size=4),
       st.booleans())
def test_the_streams_of_one_gpu_never_exceed_its_compute(tmp_path, streams, chained):
    # Property: each op lasts at least its full-speed duration, and the GPU does at most one second of
    # work per second: the makespan is at least Σ durations. With no dependencies across streams every
    # stream always has work ready, so the GPU is never idle either: the makespan is exactly Σ durations.
    # ``chained`` makes each stream's first op wait for the previous stream's first op (idle time allowed).
    sc = custom_scenario(star(tmp_path, 1))
    ops, firsts = [], []
    for s, durations in enumerate(streams):
        for j, d in enumerate(durations):
            deps = (firsts[-1],) if chained and j == 0 and firsts else ()
            if j == 0:
                firsts.append(len(ops))
            ops.append(Op(len(ops), 0, COMPUTE, stream=f"s{s}", deps=deps, duration=d))
    r = run_program(Program(1, ops), sc)
    total = sum(sum(d) for d in streams)
    assert all(s.end_s - s.start_s >= ops[s.op_id].duration * (1 - 1e-12) for s in r.spans)
    assert r.iteration_time_s >= total * (1 - 1e-12)
    if not chained:
        assert r.iteration_time_s == pytest.approx(total, rel=1e-12)


def test_compute_slows_while_a_collective_is_resident():
    # one DGX A100 with comm_overlap_slowdown 2: on ranks 0 and 1, kernel A (1 s of work) runs on the
    # compute stream while an all-reduce of the pair, issued at 0 on stream dp, is resident until
    # it ends at e. A runs at 1/2 until e (e < 2: it has done e/2), then at full speed:
    # it ends at e + (1 − e/2) = 1 + e/2. Without the slowdown it ends at 1 s.
    from emulator.program import COLLECTIVE, COMPUTE, Op, Program
    from emulator.run.simulation import run_program
    from emulator.scenario import load_scenario_text

    ops = []
    for r in (0, 1):
        ops += [Op(2 * r, r, COMPUTE, duration=1.0, name="A"),
                Op(2 * r + 1, r, COLLECTIVE, stream="dp", collective="all_reduce", group=(0, 1), bytes=1e9, name="C")]
    for f, slowed in ((1.0, False), (2.0, True)):
        sc = load_scenario_text("name: o\ncluster:\n  nodes: 1\n  node:\n    preset: dgx-a100\n"
                                f"    gpu: {{preset: A100-SXM4-80GB, comm_overlap_slowdown: {f}}}\n", "o.yaml")
        spans = {(s.rank, s.name): s for s in run_program(Program(2, ops), sc).spans}
        e = spans[(0, "C")].end_s
        assert e < 2.0
        assert spans[(0, "A")].end_s == pytest.approx(1.0 + e / 2 if slowed else 1.0, rel=1e-12)


def test_shared_gpu_speed():
    # one kernel of 3 s of work from t = 0; at t = 1 the speed drops to 1/2 (1 s done, 2 left):
    # it ends at 1 + 2 / (1/2) = 5 s.
    g = SharedGpu()
    g.add(0.0, 7, 3.0)
    g.set_speed(1.0, 0.5)
    assert g.next_end() == pytest.approx(5.0)
    assert g.finish(5.0) == [7]
