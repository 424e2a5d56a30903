"""Engine semantics: streams, dependencies, rendezvous, send/recv, deadlocks, exact spans."""
import pytest
from helpers import custom_scenario, star, write_graph

from emulator.program import COLLECTIVE, COMPUTE, RECV, SEND, Op, Program
from emulator.run.engine import DeadlockError
from emulator.run.simulation import run_program


def test_send_over_k_hops_is_exact(tmp_path):
    # A chain g0 - s1 - s2 - s3 - g1: k = 4 links of 25 GB/s and 0.5 us each.
    # 1 MiB: 4 × 0.5 us + 1048576 / 25e9 = 2e-6 + 4.194304e-5 = 4.394304e-05 s
    nodes = [{"id": "g0", "kind": "gpu"}, {"id": "g1", "kind": "gpu"}] + [{"id": f"s{i}", "kind": "switch"} for i in (1, 2, 3)]
    chain = ["g0", "s1", "s2", "s3", "g1"]
    links = [{"src": a, "dst": b, "bandwidth": "25 GB/s", "latency": "0.5 us"} for a, b in zip(chain, chain[1:])]
    sc = custom_scenario(write_graph(tmp_path, nodes, links))
    ops = [Op(0, 0, SEND, peer=1, bytes=1048576, tag=7), Op(1, 1, RECV, peer=0, bytes=1048576, tag=7)]
    r = run_program(Program(2, ops), sc)
    assert r.iteration_time_s == pytest.approx(4.394304e-05, rel=1e-9)


def test_ring_all_reduce_is_exact(tmp_path):
    # 8 GPUs on a star switch, 50 GB/s, 1 us per link: a hop is 2 us.
    # 2(n−1)·α + 2(n−1)/n·S/B = 14 × 2e-6 + 14/8 × 1e9/50e9 = 2.8e-5 + 0.035 = 0.035028 s
    sc = custom_scenario(star(tmp_path, 8, bw=50e9, lat=1e-6))
    g = tuple(range(8))
    ops = [Op(r, r, COLLECTIVE, collective="all_reduce", group=g, bytes=1e9) for r in g]
    assert run_program(Program(8, ops), sc).iteration_time_s == pytest.approx(0.035028, rel=1e-9)


def test_streams_run_in_order_and_deps_cross_streams(tmp_path):
    # rank 0: compute a (2 s) then compute b (3 s) on one stream; c (1 s) on stream "x" after a.
    # b and c start together at 2 s and share the GPU (each at half speed, devices/sharing.py):
    # c ends at 2 + 1·2 = 4 s, b has 3 − 1 = 2 s of work left and ends at 4 + 2 = 6 s.
    # a: 0–2, b: 2–6, c: 2–4 → makespan 6 s = 2 + 3 + 1 (the GPU is never idle)
    sc = custom_scenario(star(tmp_path, 1))
    ops = [Op(0, 0, COMPUTE, duration=2.0, name="a"), Op(1, 0, COMPUTE, duration=3.0, name="b"),
           Op(2, 0, COMPUTE, stream="x", deps=(0,), duration=1.0, name="c")]
    spans = {s.name: (s.start_s, s.end_s) for s in run_program(Program(1, ops), sc).spans}
    assert spans == {"a": (0.0, 2.0), "b": (2.0, 6.0), "c": (2.0, 4.0)}


def test_collective_waits_for_the_last_member(tmp_path):
    # rank 1 computes 1 s before issuing; the all-reduce (2 GPUs, 100 GB/s, hop 2 us) of 1 GB
    # starts at 1 s: 2 × 2e-6 + 1 × 1e9/100e9 = 0.010004 → ends at 1.010004 on both ranks.
    sc = custom_scenario(star(tmp_path, 2))
    ops = [Op(0, 0, COLLECTIVE, collective="all_reduce", group=(0, 1), bytes=1e9),
           Op(1, 1, COMPUTE, duration=1.0), Op(2, 1, COLLECTIVE, collective="all_reduce", group=(0, 1), bytes=1e9)]
    spans = {s.op_id: s for s in run_program(Program(2, ops), sc).spans}
    assert spans[0].start_s == 0.0 and spans[0].xfer_s == 1.0
    assert spans[0].end_s == pytest.approx(1.010004, rel=1e-12)
    assert spans[2].end_s == spans[0].end_s


def test_recv_without_send_is_a_deadlock(tmp_path):
    sc = custom_scenario(star(tmp_path, 2))
    ops = [Op(0, 0, RECV, peer=1, bytes=10, tag=3), Op(1, 1, COMPUTE, duration=1.0)]
    with pytest.raises(DeadlockError) as err:
        run_program(Program(2, ops), sc)
    assert "rank 0" in str(err.value) and "recv from rank 1 tag 3" in str(err.value)


def test_missing_collective_member_is_a_deadlock(tmp_path):
    sc = custom_scenario(star(tmp_path, 3))
    ops = [Op(r, r, COLLECTIVE, collective="all_gather", group=(0, 1, 2), bytes=10) for r in (0, 1)]
    with pytest.raises(DeadlockError, match="waits for the other members"):
        run_program(Program(3, ops), sc)


def test_dependency_cycle_is_a_deadlock(tmp_path):
    sc = custom_scenario(star(tmp_path, 1))
    ops = [Op(0, 0, COMPUTE, stream="a", deps=(1,), duration=1.0), Op(1, 0, COMPUTE, stream="b", deps=(0,), duration=1.0)]
    with pytest.raises(DeadlockError, match="not started"):
        run_program(Program(1, ops), sc)


def test_iterations_repeat_back_to_back(tmp_path):
    # one 2 s op per iteration, 3 iterations: makespan 6 s, iteration time 2 s
    from dataclasses import replace

    sc = custom_scenario(star(tmp_path, 1))
    sc = replace(sc, simulation=replace(sc.simulation, iterations=3))
    r = run_program(Program(1, [Op(0, 0, COMPUTE, duration=2.0)]), sc)
    assert r.iteration_time_s == pytest.approx(2.0) and len(r.spans) == 3
