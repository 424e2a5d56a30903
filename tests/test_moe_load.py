"""MoE token imbalance: the default, moe_imbalance, and a measured per-expert distribution (moe_expert_load)."""
import dataclasses

import pytest

from emulator.errors import ScenarioError
from emulator.program import parse_dispatch_op
from emulator.scenario import load_scenario_text
from emulator.scenario.catalog import model_preset
from emulator.workload import layer as Ly
from emulator.workload import models as M
from emulator.workload.activations import layer_activation_bytes

MIXTRAL = model_preset("mixtral-8x7b")  # 8 experts, top-2, hidden 4096


def test_rank_load_from_a_distribution():
    # 8 experts over ep 4 (2 each, contiguous as Megatron-Core's local_expert_indices): per rank
    # [4+1, 1+1, 1+1, 1+2] = [5, 2, 2, 3] of 12, the mean rank 3 → the busiest carries 5/3
    m = dataclasses.replace(MIXTRAL, moe_expert_load=((4, 1, 1, 1, 1, 1, 1, 2),))
    assert M.moe_rank_load(m, 4) == pytest.approx(5 / 3)
    assert M.moe_rank_load(m, 8) == pytest.approx(4 / 1.5)  # one expert each: 4 over the mean 12/8
    assert M.moe_rank_load(m, 1) == 1.0  # every rank holds every expert


def test_default_and_imbalance():
    assert MIXTRAL.moe_imbalance == 1.0 and M.moe_rank_load(MIXTRAL, 4) == 1.0
    # DeepSeek-V2-Lite's scenario: f 1.2, 64 experts over ep 8 (8 each): (1.2 + 7)/8 = 1.025
    lite = dataclasses.replace(model_preset("deepseek-v2-lite"), moe_imbalance=1.2)
    assert M.moe_rank_load(lite, 8) == pytest.approx(1.025)


def test_distribution_scales_the_all_to_all_and_the_experts():
    # b 1, s 4096, ep 4: 4096·2 = 8192 routed copies; all-to-all S = 8192·4096·2 = 67 108 864 B (the dispatch
    # with the copies' fp32 probabilities, 8192·4 B more); the busiest rank at 5/3 receives 5/3 of the mean
    # (the plan's load), and its 2 local experts get 8192·5/3 = 13 653 tokens (rounded), 6826 each
    m = dataclasses.replace(MIXTRAL, moe_expert_load=((4, 1, 1, 1, 1, 1, 1, 2),))
    L = Ly.layer_shape(m, 1, ep=4, flash=True)
    steps = Ly.forward_steps(L)
    a2a = [c for c in Ly.comms(steps) if c.group == "ep" and c.collective != "all_gather"]
    assert [c.bytes for c in a2a] == [67_108_864 + 8192 * 4, 67_108_864]
    assert [parse_dispatch_op(c.collective)[2]["load"] for c in a2a] == [pytest.approx(5 / 3)] * 2
    up = next(k for k in Ly.kernels(steps) if k.name == "moe.up")
    assert (up.m, up.batch) == (13_653 // 2, 2)
    # memory: the experts' stored tokens grow by the same 5/3 (top-2 copies × load)
    balanced = layer_activation_bytes(MIXTRAL, 1, 4096, ep=4, flash=True)
    skewed = layer_activation_bytes(m, 1, 4096, ep=4, flash=True)
    # SwiGLU experts keep 2·2·14 336 + 2·14 336 = 86 016 B a routed copy, and its fc1 input 2·4096 = 8192:
    # 94 208; 2 copies × (5/3 − 1) × 4096 tokens
    assert skewed - balanced == pytest.approx(4096 * 2 * 94_208 * (5 / 3 - 1))


SCENARIO = """
name: m
cluster: {nodes: 1, node: dgx-h100}
model: {preset: mixtral-8x7b, moe_expert_load: %s}
training: {global_batch: 8, micro_batch: 1}
parallel: {dp: 8, ep: 4}
"""


def test_read_from_a_scenario():
    sc = load_scenario_text(SCENARIO % "[4, 1, 1, 1, 1, 1, 1, 2]", "m.yaml")
    assert sc.model.moe_expert_load == ((4.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 2.0),)  # one row: every MoE layer


@pytest.mark.parametrize("value, needle", [
    ("[1, 2, 3]", "moe_expert_load has 3 numbers; expected one per expert (8)"),
    ("[0, 0, 0, 0, 0, 0, 0, 0]", "must not be all zero"),
    ("[9, 0, 0, 0, 0, 0, 0, 0]", "gets more than every token: at most experts/top_k = 4 times the mean"),
    ("[1, -1, 1, 1, 1, 1, 1, 1]", "model.moe_expert_load[1]"),
    ("3", "expected a list of numbers"),
])
def test_bad_distributions(value, needle):
    with pytest.raises(ScenarioError) as info:
        load_scenario_text(SCENARIO % value, "m.yaml")
    assert needle in str(info.value)
