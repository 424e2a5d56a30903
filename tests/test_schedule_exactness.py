"""Pipeline bubbles through the whole stack (builder → engine), with deterministic op costs
and free communication: (p−1)/m for GPipe and 1F1B, (p−1)/(v·m) for interleaved."""
import dataclasses
from collections import defaultdict

import pytest
from helpers import custom_scenario, write_graph

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
    nodes = [{"id": f"g{i}", "kind": "gpu"} for i in range(p)] + [{"id": "s", "kind": "switch"}]
    links = [d for i in range(p) for d in ({"src": f"g{i}", "dst": "s", "bandwidth": 1e9, "latency": 0},
                                           {"src": "s", "dst": f"g{i}", "bandwidth": 1e9, "latency": 0})]
    net = custom_scenario(write_graph(tmp_path, nodes, links))
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
    nodes = [{"id": f"g{i}", "kind": "gpu"} for i in range(p)] + [{"id": "s", "kind": "switch"}]
    links = [d for i in range(p) for d in ({"src": f"g{i}", "dst": "s", "bandwidth": 1e9, "latency": 0},
                                           {"src": "s", "dst": f"g{i}", "bandwidth": 1e9, "latency": 0})]
    net = custom_scenario(write_graph(tmp_path, nodes, links))
    for sched, bubble in (("1f1b", TF + TB + TW), ("zb-h1", TF + TB - TW)):
        sc = load_scenario_text(TEXT.format(p=p, m=m, sched=sched, v=1), "b.yaml")
        program = build_program(sc, None)
        assert any(".wgrad." in op.name for op in program.ops) == (sched == "zb-h1")
        program = _deterministic_split(program)
        t = run_program(program, net, record_links=False).iteration_time_s
        assert t == pytest.approx(m * (TF + TB + TW) + (p - 1) * bubble, rel=1e-9)
