"""One hardware queue (parallel.cuda_device_max_connections: 1): a kernel waiting for another stream holds back
every kernel issued after it (emulator/run/wiring.py issue_order, emulator/run/engine.py)."""
import dataclasses
from pathlib import Path

import pytest
from helpers import custom_scenario, star

from emulator.program import COMPUTE, Op, Program
from emulator.run.simulation import run_program
from emulator.run.wiring import issue_order
from emulator.scenario.reader import load_scenario_text
from emulator.workload.builder import build_program

V2_LITE_SCENARIO = str(Path(__file__).resolve().parents[1] / "scenarios" / "deepseek-v2-lite-moe-16-h100.yaml")


def _bucketed() -> list[Op]:
    # three compute ops of 1 s in a row, and two copies on their own stream ("d2h": timed, no SMs) written after
    # them, as the builder writes a step's gradient reduce-scatters: the first after op 0 (2.5 s), the second
    # after op 1 (0.5 s)
    return [Op(0, 0, COMPUTE, duration=1.0), Op(1, 0, COMPUTE, duration=1.0), Op(2, 0, COMPUTE, duration=1.0),
            Op(3, 0, COMPUTE, stream="d2h", deps=(0,), duration=2.5),
            Op(4, 0, COMPUTE, stream="d2h", deps=(1,), duration=0.5)]


def _run(tmp_path, ops: list[Op], queues: int):
    sc = custom_scenario(star(tmp_path, 1))
    sc = dataclasses.replace(sc, parallel=dataclasses.replace(sc.parallel, cuda_device_max_connections=queues))
    r = run_program(Program(1, ops), sc)
    return r, {s.op_id: (s.start_s, s.end_s) for s in r.spans}


def test_hooked_ops_are_issued_after_their_last_prerequisite():
    # keys: op 0 (0,), op 1 (1,), op 2 (2,); op 3 hangs on its dep op 0: (0, 3); op 4's prerequisites are op 1
    # (1,) and its stream's op 3 (0, 3): the later is op 1, so (1, 4). In key order: 0, 3, 1, 4, 2.
    assert list(issue_order(_bucketed())) == [3, 4, -1, 1, 2]


def test_a_copy_waiting_for_its_stream_holds_back_the_compute_issued_after_it(tmp_path):
    # Many queues: op 3 runs [1, 3.5] after op 0; op 4 after op 1 and op 3: [3.5, 4]; the compute runs on,
    # op 2 [2, 3]; the iteration ends at 4 s.
    r, t = _run(tmp_path, _bucketed(), 0)
    assert t[2] == (pytest.approx(2.0), pytest.approx(3.0)) and r.iteration_time_s == pytest.approx(4.0)
    # One queue, issued 0, 3, 1, 4, 2: op 4 is launched when op 3 ends (3.5 s), and op 2, behind it in the
    # queue, only then: [3.5, 4.5]; the iteration ends at 4.5 s.
    r, t = _run(tmp_path, _bucketed(), 1)
    assert t[4] == (pytest.approx(3.5), pytest.approx(4.0))
    assert t[2] == (pytest.approx(3.5), pytest.approx(4.5)) and r.iteration_time_s == pytest.approx(4.5)


def test_a_kernel_launched_early_holds_nothing_back(tmp_path):
    # The same with the second copy's wait gone (no stream before it: stream "h2d"): op 4 is launched at op 1's
    # end, [2, 2.5], and op 2 right after it, [2, 3]; one queue changes nothing, the iteration ends with op 3
    # at 1 + 2.5 = 3.5 s both ways.
    ops = _bucketed()
    ops[4] = dataclasses.replace(ops[4], stream="h2d")
    for queues in (0, 1):
        r, t = _run(tmp_path, ops, queues)
        assert t[2] == (pytest.approx(2.0), pytest.approx(3.0)) and r.iteration_time_s == pytest.approx(3.5)


ZERO1 = """
name: zero1-gathers
cluster: {nodes: 1, node: dgx-h100}
model: {preset: gpt3-1.3b}
training: {global_batch: 8, micro_batch: 1}
parallel: {tp: 1, pp: 1, dp: 8, zero: 1, grad_bucket: "1 B"}
"""


def test_each_parameter_gather_is_issued_at_the_forward_of_the_bucket_before():
    # ZeRO 1 with overlapped gathers, one unit a bucket ("1 B"): the step's first gather (the embedding's) is
    # written first; each unit's forward hook issues the next bucket's gather, so the gather of layer 0 comes
    # right before the embedding's forward, that of layer 1 right before layer 0's, and so on.
    program = build_program(load_scenario_text(ZERO1))
    names = [op.name for op in program.ops if op.rank == 0]
    assert names[0] == "param_ag.embed" and names[1] == "param_ag.layer0"
    assert names[2].startswith("mb0.embed.fwd")
    i = names.index("param_ag.layer1")
    assert names[i + 1].startswith("mb0.layer0.fwd") and names[i - 1].startswith("mb0.embed.fwd")


V2_LITE = ("model: {preset: deepseek-v2-lite, moe_permute_fusion: true, moe_imbalance: 1.2}, "
           "training: {global_batch: 32, micro_batch: 1, recompute: selective, attention: flash}, "
           "parallel: {tp: 1, pp: 1, dp: 16, ep: 8, zero: 1%s}")


def test_a_job_of_a_mix_with_one_queue_runs_as_it_runs_alone():
    from emulator.run.simulation import simulate
    from emulator.scenario.reader import load_scenario

    # two DeepSeek-V2-Lite jobs of 2 DGX H100 each, one leaf apiece (nothing shared); job a sets one queue. Each
    # runs, alone and in the mix, as scenarios/deepseek-v2-lite-moe-16-h100.yaml runs with its own setting.
    text = ("name: two\ncluster: {nodes: 4, node: dgx-h100, fabric: {kind: fat_tree, leaf_size: 2}}\njobs:\n"
            f"  - {{name: a, nodes: 2, placement: contiguous, {V2_LITE % ', cuda_device_max_connections: 1'}}}\n"
            f"  - {{name: b, nodes: 2, placement: contiguous, {V2_LITE % ''}}}\n")
    mix = simulate(load_scenario_text(text, "two.yaml"), record_links=False)
    alone = {q: simulate(load_scenario(V2_LITE_SCENARIO, [f"parallel.cuda_device_max_connections={q}"]),
                         record_links=False) for q in (0, 1)}
    assert alone[1].iteration_time_s > alone[0].iteration_time_s  # the queue costs this model (the guide: 5 ms)
    a, b = mix.jobs
    assert a.alone_iteration_time_s == pytest.approx(alone[1].iteration_time_s, rel=1e-12)
    assert b.alone_iteration_time_s == pytest.approx(alone[0].iteration_time_s, rel=1e-12)
    assert a.iteration_time_s == pytest.approx(a.alone_iteration_time_s, rel=1e-12)
    assert b.iteration_time_s == pytest.approx(b.alone_iteration_time_s, rel=1e-12)


def test_the_run_says_when_it_models_one_queue():
    from emulator.run.simulation import build_workload

    note = ("one hardware queue a GPU (parallel.cuda_device_max_connections: 1): an op waiting for its stream or a "
            "dep holds back every op issued after it")
    for queues, said in ((1, True), (0, False), (8, False)):
        text = ZERO1.replace('grad_bucket: "1 B"}', f'grad_bucket: "1 B", cuda_device_max_connections: {queues}}}')
        _, notes = build_workload(load_scenario_text(text))
        assert (note in notes) is said
