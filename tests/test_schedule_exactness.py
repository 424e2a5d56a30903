"""Pipeline bubbles through the whole stack (builder → engine), with deterministic op costs
and free communication: (p−1)/m for GPipe and 1F1B, (p−1)/(v·m) for interleaved."""
import dataclasses
from collections import defaultdict

import pytest
from helpers import free_net

from emulator.program import COMPUTE, Program
from emulator.run.simulation import run_program
from emulator.scenario import load_scenario_text
from emulator.workload.builder import build_program

TEXT = """
name: bubble
cluster: {{nodes: 1, node: {{preset: dgx-a100, gpus_per_node: {p}}}}}
model: {{preset: gpt3-125m, layers: 8}}
training: {{global_batch: {m}, micro_batch: 1}}
parallel: {{tp: 1, pp: {p}, dp: 1, schedule: {sched}, virtual_stages: {v}, overlap_grad_reduce: false}}
"""
TF, TB = 1.0, 2.0  # forward and backward time of one micro-batch on one stage (all its chunks)


def _deterministic(program: Program, v: int) -> Program:
    """Every compute op of a (rank, chunk, micro-batch, phase) shares TF/v or TB/v equally;
    optimizer and other work costs nothing; every transfer carries 0 bytes."""
    groups = defaultdict(list)
    for op in program.ops:
        if op.kind == COMPUTE and op.category in ("fwd", "bwd", "recompute"):
            groups[(op.rank, op.stage, op.microbatch, "fwd" if op.category == "fwd" else "bwd")].append(op.id)
    share = {}
    for (_r, _s, _m, phase), ids in groups.items():
        for i in ids:
            share[i] = (TF if phase == "fwd" else TB) / v / len(ids)
    ops = []
    for op in program.ops:
        if op.kind == COMPUTE:
            ops.append(dataclasses.replace(op, duration=share.get(op.id, 0.0)))
        else:
            ops.append(dataclasses.replace(op, bytes=0.0))
    return Program(program.ranks, ops, program.fold, program.meta)


@pytest.mark.parametrize("sched,p,m,v", [("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1), ("1f1b", 2, 6, 1),
                                         ("interleaved-1f1b", 4, 8, 2), ("interleaved-1f1b", 2, 4, 4)])
def test_bubble_fraction_is_exact(tmp_path, sched, p, m, v):
    sc = load_scenario_text(TEXT.format(p=p, m=m, sched=sched, v=v), "b.yaml")
    program = _deterministic(build_program(sc, None), v)
    # free communication: a star with zero latency (custom graphs add no launch or step costs)
    net = free_net(tmp_path, p)
    t = run_program(program, net, record_links=False).iteration_time_s
    ideal = m * (TF + TB)
    expected = (p - 1) / m if sched != "interleaved-1f1b" else (p - 1) / (v * m)
    assert t / ideal - 1 == pytest.approx(expected, rel=1e-9, abs=1e-12)


TW = 1.0  # weight-gradient (W) time of one micro-batch on one stage; TB is then its input-gradient part


def _deterministic_split(program: Program) -> Program:
    """As _deterministic for split backwards: a (rank, micro-batch)'s forward ops share TF; a split
    backward's I ops (the backward less the wgrad kernels) share TB and its W ops (names
    ``mb<i>.<unit>.wgrad.``) TW; a whole backward's ops share TB + TW."""
    groups = defaultdict(list)
    for op in program.ops:
        if op.kind == COMPUTE and op.category in ("fwd", "bwd"):
            phase = "fwd" if op.category == "fwd" else ("W" if ".wgrad." in op.name else "B")
            groups[(op.rank, op.microbatch, phase)].append(op.id)
    share = {}
    for (r, mb, ph), ids in groups.items():
        cost = {"fwd": TF, "W": TW, "B": TB if (r, mb, "W") in groups else TB + TW}[ph]
        share.update({i: cost / len(ids) for i in ids})
    ops = [dataclasses.replace(op, duration=share.get(op.id, 0.0)) if op.kind == COMPUTE
           else dataclasses.replace(op, bytes=0.0) for op in program.ops]
    return Program(program.ranks, ops, program.fold, program.meta)


@pytest.mark.parametrize("p,m", [(4, 8), (2, 6)])
def test_zb_h1_step_is_the_closed_form(tmp_path, p, m):
    # Qi et al. ICLR'24 Table 1 with F = 1, B = 2, W = 1 per stage: 1F1B (B and W one backward of 3)
    # m·4 + (p−1)·4; ZB-H1 m·4 + (p−1)·(1 + 2 − 1). p 4, m 8: 44 and 38; p 2, m 6: 28 and 26.
    net = free_net(tmp_path, p)
    for sched, bubble in (("1f1b", TF + TB + TW), ("zb-h1", TF + TB - TW)):
        sc = load_scenario_text(TEXT.format(p=p, m=m, sched=sched, v=1), "b.yaml")
        program = build_program(sc, None)
        assert any(".wgrad." in op.name for op in program.ops) == (sched == "zb-h1")
        program = _deterministic_split(program)
        t = run_program(program, net, record_links=False).iteration_time_s
        assert t == pytest.approx(m * (TF + TB + TW) + (p - 1) * bubble, rel=1e-9)


def _deterministic_chunks(program: Program, tf: float, tb: float, tw: float) -> Program:
    """As _deterministic_split per chunk: the forward ops of a (rank, virtual stage, micro-batch) share
    tf, a split backward's I ops tb and its W ops tw, a whole backward's ops tb + tw; the rest is free."""
    groups = defaultdict(list)
    for op in program.ops:
        if op.kind == COMPUTE and op.category in ("fwd", "bwd"):
            phase = "fwd" if op.category == "fwd" else ("W" if ".wgrad." in op.name else "B")
            groups[(op.rank, op.stage, op.microbatch, phase)].append(op.id)
    share = {}
    for (r, vs, mb, ph), ids in groups.items():
        cost = {"fwd": tf, "W": tw, "B": tb if (r, vs, mb, "W") in groups else tb + tw}[ph]
        share.update({i: cost / len(ids) for i in ids})
    ops = [dataclasses.replace(op, duration=share.get(op.id, 0.0)) if op.kind == COMPUTE
           else dataclasses.replace(op, bytes=0.0) for op in program.ops]
    return Program(program.ranks, ops, program.fold, program.meta)



@pytest.mark.parametrize("p,m", [(4, 8), (2, 4)])
def test_zb_v_step_is_the_closed_form(tmp_path, p, m):
    # ZB-V with equal chunk costs F = B = W = 1 (the paper's ZB-V assumption; the authors' greedy is run
    # with equal costs): each rank runs 2m chunk passes of each kind, 6m; the last rank can start only
    # after the p − 1 chunk forwards upstream of it, and the order leaves no other idle time (the
    # zero-bubble README: ZBV's bubble rate 0): step 6m + (p − 1). p 4, m 8: 48 + 3 = 51; p 2, m 4: 25.
    # 1F1B on the same stages (a stage = the rank's 2 chunks: F 2, B + W 4): 6m + 6(p − 1): 66 and 30.
    net = free_net(tmp_path, p)
    for sched, v, step in (("zb-v", 2, 6 * m + (p - 1)), ("1f1b", 1, 6 * m + 6 * (p - 1))):
        sc = load_scenario_text(TEXT.format(p=p, m=m, sched=sched, v=v), "b.yaml")
        program = build_program(sc, None)
        if sched == "zb-v":  # two chunks a rank, in a V: rank 0 holds the first and the last
            assert {op.stage for op in program.ops if op.rank == 0 and op.stage >= 0} == {0, 2 * p - 1}
            program = _deterministic_chunks(program, 1.0, 1.0, 1.0)
        else:
            program = _deterministic_chunks(program, 2.0, 2.0, 2.0)
        t = run_program(program, net, record_links=False).iteration_time_s
        assert t == pytest.approx(step, rel=1e-9)


@pytest.mark.parametrize("p,m,tf,tb,tw", [(4, 8, 1.0, 1.0, 1.0), (4, 10, 2.0, 2.0, 1.0), (2, 4, 1.0, 1.0, 1.0)])
def test_dualpipev_step_is_the_closed_form(tmp_path, p, m, tf, tb, tw):
    # DualPipe README, DualPipeV over PP = 2p stages (chunks): bubble (PP/2 − 1)(F&B + B − 3W), with B the
    # whole backward (tb + tw) and F&B an overlapped pair, here a dense model's: F + B one after the other,
    # both passes' sends at its end. Work 2m(F + B). p 4, m 8, (1, 1, 1): F&B 3, B 2: 3·(3 + 2 − 3) = 6,
    # step 48 + 6 = 54; p 4, m 10, (2, 2, 1): F&B 5, B 3: 3·(5 + 3 − 3) = 15, step 100 + 15 = 115;
    # p 2, m 4, (1, 1, 1): 1·2 = 2, step 24 + 2 = 26 (the README's figure: F one cell, B two, W one).
    sc = load_scenario_text(TEXT.format(p=p, m=m, sched="dualpipev", v=2), "b.yaml")
    program = _deterministic_chunks(build_program(sc, None), tf, tb, tw)
    t = run_program(program, free_net(tmp_path, p), record_links=False).iteration_time_s
    fb, b = tf + tb + tw, tb + tw
    assert t == pytest.approx(2 * m * (tf + tb + tw) + (p - 1) * (fb + b - 3 * tw), rel=1e-9)


@pytest.mark.parametrize("p,m,tf,tb,tw", [(4, 8, 1.0, 1.0, 1.0), (4, 12, 2.0, 2.0, 1.0), (2, 4, 1.0, 1.0, 1.0)])
def test_dualpipe_step_is_the_closed_form(tmp_path, p, m, tf, tb, tw):
    # DualPipe README over PP = p stages: bubble (PP/2 − 1)(F&B + B − 3W), B the whole backward tb + tw, F&B
    # tf + tb + tw (a dense model's pair, sends at its end). Each rank runs m micro-batches of one stage each
    # (m/2 a direction): work m(F + B). p 4, m 8, (1, 1, 1): 1·(3 + 2 − 3) = 2, step 24 + 2 = 26; p 4, m 12,
    # (2, 2, 1): 1·(5 + 3 − 3) = 5, step 60 + 5 = 65; p 2: no bubble, step 4·3 = 12. The gradient all-reduce
    # of rank i and pp − 1 − i moves 0 bytes here (free communication).
    sc = load_scenario_text(TEXT.format(p=p, m=m, sched="dualpipe", v=1), "b.yaml")
    program = build_program(sc, None)
    assert len([op for op in program.ops if op.name == "dualpipe_grad_all_reduce"]) == p
    program = _deterministic_chunks(program, tf, tb, tw)
    t = run_program(program, free_net(tmp_path, p), record_links=False).iteration_time_s
    fb, b = tf + tb + tw, tb + tw
    assert t == pytest.approx(m * (tf + tb + tw) + (p // 2 - 1) * (fb + b - 3 * tw), rel=1e-9)
