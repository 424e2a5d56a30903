"""Megatron-Core's recompute_method and recompute_num_layers under a full recompute (training.recompute_method,
training.recompute_num_layers): which layers rerun their forward (emulator/workload/plan.py _block_recompute) and
what each keeps (emulator/workload/memory.py _grouped_recompute_mean)."""
from __future__ import annotations

import pytest

from emulator.errors import ScenarioError
from emulator.scenario import load_scenario
from emulator.workload import layer as Ly
from emulator.workload.memory import stage_memory
from emulator.workload.plan import make_plan

# Llama 3 70B on 64 H100: TP 8, PP 4, 5 virtual stages: 80 layers in 20 chunks of 4
PATH = "scenarios/llama3-70b-64-h100.yaml"
BLOCK = ["training.recompute=full", "training.recompute_method=block", "training.recompute_num_layers=2"]
MiB = 2**20


def _stage0_activations(sets: list[str]) -> float:
    return stage_memory(load_scenario(PATH, sets))[0].breakdown["activations"]


def test_block_reruns_only_each_chunk_s_first_layers():
    plan = make_plan(load_scenario(PATH, BLOCK))
    for vs in (0, 7):  # the first chunk (with the embedding) and a middle one: its first 2 layers of 4 rerun
        layers = [u for u in plan.chunk_units[vs] if u.name.startswith("layer")]
        reruns = [any(st.category == Ly.RECOMPUTE for st in u.bwd) for u in layers]
        assert reruns == [True, True, False, False]


def test_what_the_first_stage_keeps_under_each_method():
    # stage 0 holds 92 layers in flight (5 chunks of 4, interleaved 1F1B): without recompute 268 MiB each (24,656 MiB),
    # under full each its input, s·b·h·2 / TP = 8192·8192·2 / 8 = 16 MiB (1472 MiB)
    assert _stage0_activations(["training.recompute=none"]) == 92 * 268 * MiB
    assert _stage0_activations(["training.recompute=full"]) == 92 * 16 * MiB
    # block, 2 of each chunk's 4: the mean layer keeps (2·16 + 2·268)/4 = 142 MiB
    assert _stage0_activations(BLOCK) == 92 * 142 * MiB
    # uniform groups of 2: one input per group, ceil(4/2) = 2 a chunk, 8 MiB a layer on average
    assert _stage0_activations(["training.recompute=full", "training.recompute_num_layers=2"]) == 92 * 8 * MiB


def test_block_s_time_lies_between_none_and_full():
    from emulator.run.simulation import simulate

    times = [simulate(load_scenario(PATH, sets)).iteration_time_s
             for sets in (["training.recompute=none"], BLOCK, ["training.recompute=full"])]
    assert times[0] < times[1] < times[2]


@pytest.mark.parametrize("sets, key", [
    (["training.recompute_method=block"], "training.recompute_method"),
    (["training.recompute=selective", "training.recompute_num_layers=2"], "training.recompute_num_layers"),
])
def test_they_need_a_full_recompute(sets: list[str], key: str):
    with pytest.raises(ScenarioError, match="shape a full recompute") as err:
        load_scenario(PATH, sets)
    assert err.value.key == key


def test_block_leaves_the_mtp_module_unrecomputed():
    # DeepSeek-V3 on 1,024 H100: the last stage holds one layer and the MTP module ("...,tmL"), one micro-batch in
    # flight under 1F1B; block 1 reruns the layer, which keeps its input, and not the MTP module (Megatron-Core skips
    # it under block), which keeps what it keeps without recompute
    from dataclasses import replace

    from emulator.workload import models as M
    from emulator.workload.activations import scenario_layer_bytes

    sets = ["training.recompute=full", "training.recompute_modules=null", "training.recompute_method=block",
            "training.recompute_num_layers=1"]
    sc = load_scenario("scenarios/deepseek-v3-1024-h100.yaml", sets)
    m = replace(M.resolve(sc.model), vocab=M.padded_vocab(M.resolve(sc.model).vocab, sc.parallel.tp))
    full = scenario_layer_bytes(sc, m)
    assert full == 4096 * 7168 * 2 / 2  # its input, s·h·2 B over TP 2 with sequence parallelism: 29,360,128 B
    none = scenario_layer_bytes(replace(sc, training=replace(sc.training, recompute="none")), m)
    assert stage_memory(sc)[-1].breakdown["activations"] == pytest.approx(full + none)
