"""Uneven pipeline splits: first/last chunk layers, through the plan, the engine and the memory model."""
import dataclasses
from collections import defaultdict

import pytest
from helpers import free_net

from emulator.errors import ScenarioError
from emulator.program import COMPUTE, Program
from emulator.run.simulation import run_program
from emulator.scenario import load_scenario_text
from emulator.scenario.stages import chunk_layers, stage_layers
from emulator.workload.builder import build_program
from emulator.workload.memory import memory_report
from emulator.workload.plan import make_plan
from emulator.workload.schedules import max_in_flight, schedule


def test_llama3_405b_split_and_megatron_first_last():
    # Llama 3 (§3.3.2): 126 layers on pp 16 × 8 chunks = 128 chunks, the first and the last hold no layer
    split = chunk_layers(126, 16, 8, first=0, last=0)
    assert split == (0,) + (1,) * 126 + (0,)
    per_stage = stage_layers(split, 16)
    assert per_stage[0] == (0, 1, 1, 1, 1, 1, 1, 1) and per_stage[15] == (1, 1, 1, 1, 1, 1, 1, 0)
    assert [sum(s) for s in per_stage] == [7] + [8] * 14 + [7]
    # without interleaving a chunk is a stage: Megatron's --decoder-first/last-pipeline-num-layers 7
    assert chunk_layers(126, 16, 1, 7, 7) == (7,) + (8,) * 14 + (7,)
    assert chunk_layers(10, 4, 1, first=1) == (1, 3, 3, 3)  # (10 - 1) / 3 = 3 each
    assert chunk_layers(8, 2, 2) == (2, 2, 2, 2)  # even
    assert chunk_layers(10, 1, 1, first=3) == (10,)  # one chunk: the ends do not apply


@pytest.mark.parametrize("args, key, text", [
    ((10, 4, 1), "parallel.pp", "model.layers (10) must be divisible by pp*virtual_stages = 4*1 = 4"),
    ((10, 4, 1, 5), "parallel.first_chunk_layers",
     "first_chunk_layers 5 leave 5 of 10 layers for the other 3 of 4 chunks"),
    ((10, 4, 1, None, 9), "parallel.last_chunk_layers", "leave 1 of 10 layers for the other 3 of 4 chunks"),
    ((10, 2, 1, 4, 5), "parallel.first_chunk_layers", "the 2 chunks must hold all 10 layers"),
])
def test_bad_splits_name_the_key(args, key, text):
    with pytest.raises(ScenarioError) as err:
        chunk_layers(*args)
    assert err.value.key == key and text in err.value.message


TEXT = """
name: uneven
cluster: {{nodes: 1, node: {{preset: dgx-a100, gpus_per_node: {p}}}}}
model: {{preset: gpt3-125m, layers: {layers}}}
training: {{global_batch: {m}, micro_batch: 1}}
parallel: {{tp: 1, pp: {p}, dp: 1, schedule: {sched}, virtual_stages: {v}, overlap_grad_reduce: false{extra}}}
"""


def _scenario(p=4, m=4, layers=8, sched="gpipe", v=1, extra=""):
    return load_scenario_text(TEXT.format(p=p, m=m, layers=layers, sched=sched, v=v, extra=extra), "u.yaml")


def test_plan_units_follow_the_split():
    plan = make_plan(_scenario(extra=", first_chunk_layers: 0, last_chunk_layers: 0"))
    names = {vs: [u.name for u in units] for vs, units in plan.chunk_units.items()}
    # 8 layers, the ends hold none: the middle two chunks hold 4 each
    assert names == {0: ["embed"], 1: [f"layer{i}" for i in range(4)], 2: [f"layer{i}" for i in range(4, 8)],
                     3: ["head"]}


@pytest.mark.parametrize("tied, pp, head", [
    # Llama 3 8B at tp 2: vocab 128,256 (a multiple of 128·2) × 4096 / 2 = 262,668,288, and the final RMSNorm's 4096
    ("false", 1, 262_672_384),  # untied: the output layer's own weight, once
    ("false", 2, 262_672_384),
    ("true", 1, 4_096),  # tied on the embedding's rank: the embedding's weight serves it
    ("true", 2, 262_672_384),  # tied, on another rank: a copy of the word embedding
])
def test_the_head_holds_its_output_layer_once(tied, pp, head):
    sc = load_scenario_text(f"name: h\ncluster: {{nodes: 1, node: {{preset: dgx-h100}}}}\nmodel: {{preset: llama3-8b, "
                            f"tied_embeddings: {tied}}}\ntraining: {{global_batch: 8, micro_batch: 1}}\n"
                            f"parallel: {{tp: 2, pp: {pp}, dp: {4 // pp}}}\n", "h.yaml")
    plan = make_plan(sc)
    units = [u for vs in sorted(plan.chunk_units) for u in plan.chunk_units[vs]]
    assert [u.params for u in units if u.name == "head"] == [head]


def test_scenario_file_error_names_line_and_key():
    with pytest.raises(ScenarioError) as err:
        _scenario(extra=", first_chunk_layers: 3")
    # 8 layers, 3 in the first chunk: 5 left for 3 chunks
    assert str(err.value).startswith("u.yaml:6: parallel.first_chunk_layers: first_chunk_layers 3 leave 5 of 8")


TF, TB = 1.0, 2.0  # forward and backward time of one layer for one micro-batch


def _per_layer_costs(program: Program, split) -> Program:
    """Each (rank, chunk, micro-batch, phase) costs its chunk's layers × TF (or TB), shared by its compute
    ops; embedding, head, optimizer cost nothing; every transfer carries 0 bytes."""
    groups = defaultdict(list)
    for op in program.ops:
        if op.kind == COMPUTE and op.category in ("fwd", "bwd", "recompute"):
            groups[(op.rank, op.stage, op.microbatch, op.category == "fwd")].append(op.id)
    share = {i: split[vs] * (TF if fwd else TB) / len(ids) for (_r, vs, _m, fwd), ids in groups.items() for i in ids}
    ops = [dataclasses.replace(op, duration=share.get(op.id, 0.0)) if op.kind == COMPUTE
           else dataclasses.replace(op, bytes=0.0) for op in program.ops]
    return Program(program.ranks, ops, program.fold, program.meta)



@pytest.mark.parametrize("extra, split, expected", [
    # GPipe with free communication is a flow shop of identical jobs: sum of the stage times + (m - 1) x the
    # slowest, forward then backward. Even 2/2/2/2: 8 + 16 + 3 * (2 + 4) = 42
    ("", (2, 2, 2, 2), 42.0),
    # 1/3/3/1: forward 1 + 3 + 3 + 1 = 8, backward 16, slowest stage 3 (fwd) and 6 (bwd): 8 + 16 + 3 * (3 + 6) = 51
    (", first_chunk_layers: 1, last_chunk_layers: 1", (1, 3, 3, 1), 51.0),
])
def test_gpipe_makespan_of_an_uneven_split(tmp_path, extra, split, expected):
    sc = _scenario(m=4, extra=extra)
    assert make_plan(sc).chunk_layers == split
    result = run_program(_per_layer_costs(build_program(sc, None), split), free_net(tmp_path, 4), record_links=False)
    assert result.iteration_time_s == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("sched, v", [("1f1b", 1), ("interleaved-1f1b", 2)])
def test_uneven_1f1b_and_interleaved_run_to_the_end(tmp_path, sched, v):
    # 14 layers on 4 x v chunks with empty ends: 1f1b 7/7 in the middle, interleaved 14 / 6 middle chunks
    sc = _scenario(layers=14 if v == 1 else 12, sched=sched, v=v, m=8,
                   extra=", first_chunk_layers: 0, last_chunk_layers: 0")
    split = make_plan(sc).chunk_layers
    assert split == ((0, 7, 7, 0) if v == 1 else (0, 2, 2, 2, 2, 2, 2, 0))
    result = run_program(_per_layer_costs(build_program(sc, None), split), free_net(tmp_path, 4), record_links=False)
    # no stall, and at least the busiest stage's own work: stage 1 (1f1b) holds 7 layers x 8 micro-batches x 3
    busiest = max(sum(s) for s in stage_layers(split, 4)) * 8 * (TF + TB)
    assert result.iteration_time_s >= busiest


def test_activations_count_the_layers_in_flight():
    # 1f1b stage 0 of 4 keeps 4 micro-batches in flight: 4 chunks' worth, 4 x 3 layers with 3 layers a chunk
    assert max_in_flight(schedule("1f1b", 0, 4, 8)) == 4
    assert max_in_flight(schedule("1f1b", 0, 4, 8), [3]) == 12
    # interleaved, p 2, m 4, v 2, stage 0: warm-up F(0,c0) F(1,c0) F(0,c1) F(1,c1) F(2,c0), then F(3,c0)
    # after B(0,c1); with chunk 0 empty (the embedding alone) only chunk-1 forwards count, at most 2 at once
    tasks = schedule("interleaved-1f1b", 0, 2, 4, 2)
    assert max_in_flight(tasks, [0, 1]) == 2
    assert max_in_flight(tasks, [1, 1]) == max_in_flight(tasks)


def test_memory_of_the_lighter_end_stages():
    from emulator.workload import models as M
    from emulator.workload.activations import layer_activation_bytes

    sc = _scenario(p=4, layers=8, extra=", first_chunk_layers: 1, last_chunk_layers: 1")
    light = memory_report(sc)
    # 1/3/3/1: the worst GPU is on a middle stage, 3 layers and no embedding or head
    assert light.stage in (1, 2)
    # gpt3-125m layer: 12 h^2 + 13 h = 12 * 768^2 + 13 * 768 = 7 087 872 parameters; 3 layers in bf16:
    # 2 * 3 * 7 087 872 = 42 527 232 bytes
    assert light.breakdown["params"] == 42_527_232
    # GPipe keeps all 4 micro-batches in flight: 4 * 3 layers of activations
    m = M.resolve(sc.model)
    assert light.breakdown["activations"] == 12 * layer_activation_bytes(m, 1, m.seq_len, 1, False, "none", False, 2)
    even = memory_report(_scenario(p=4, layers=8))  # 2 layers a stage: the worst holds 8 micro-batch-layers
    assert even.breakdown["activations"] == 8 * layer_activation_bytes(m, 1, m.seq_len, 1, False, "none", False, 2) \
        + (4 * 2048 * 768 if even.stage == 0 else 0)  # stage 0: the embedding's dropout mask, 1 B a value


def test_folded_equals_unfolded_on_an_uneven_split():
    from emulator.run.simulation import simulate

    text = """
name: fold-uneven
cluster: {nodes: 1, node: dgx-a100}
model: {preset: gpt3-125m, layers: 6}
training: {global_batch: 8, micro_batch: 1}
parallel: {tp: 2, pp: 2, dp: 2, schedule: 1f1b, first_chunk_layers: 2}
"""
    folded = simulate(load_scenario_text(text, "f.yaml"))
    plain = simulate(load_scenario_text(text + "simulation: {fold: off}\n", "f.yaml"))
    # tp and dp fold (2 x 2 copies): 2 ranks, one per stage, stand for 8
    assert (folded.ranks_simulated, plain.ranks_simulated) == (2, 8)
    assert folded.iteration_time_s == pytest.approx(plain.iteration_time_s, rel=1e-9)
