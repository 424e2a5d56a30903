"""HybridEP's static budget (model.moe_expert_rank_capacity_factor) and Megatron-Core's paged stash
(model.moe_paged_stash): the load they cap, the rows a layer keeps, the host sync they remove, the rules they
follow, and the memory and summary they change."""
import json

import pytest

from emulator.errors import ScenarioError
from emulator.scenario import load_scenario_text
from emulator.scenario.spec import ModelSpec
from emulator.workload import models as M
from emulator.workload.memory import memory_report, stash_summary
from emulator.workload.routing import capped_load, stash_spill, stashed_load
from emulator.workload.steps import LayerShape
from emulator.workload.token_dispatch import dispatch_steps

BASE = """name: stash
cluster: {nodes: 2, node: dgx-h100}
model:
  preset: deepseek-v2-lite
  moe_permute_fusion: true
training: {global_batch: 32, micro_batch: 1, attention: flash}
parallel:
  tp: 1
  pp: 1
  dp: 16
  ep: 8
  zero: 1
  moe_token_dispatcher_type: flex
  moe_flex_dispatcher_backend: hybridep
"""


def scenario(*model: str, training: str = "", backend: str = "hybridep"):
    text = BASE.replace("backend: hybridep", f"backend: {backend}").replace("  moe_permute_fusion: true\n", "  moe_permute_fusion: true\n" + "".join(
        f"  {line}\n" for line in model))
    text = text.replace("attention: flash}", f"attention: flash{training}}}")
    return load_scenario_text(text, "stash.yaml")


def test_the_budget_caps_the_busiest_rank():
    f = ModelSpec(experts=8, top_k=2, moe_expert_rank_capacity_factor=1.2)
    assert capped_load(1.5, f) == 1.2  # HybridEP drops the copies past tokens x top_k x 1.2
    assert capped_load(1.1, f) == 1.1  # under the budget: as routed
    both = ModelSpec(experts=8, top_k=2, moe_expert_capacity_factor=1.3, moe_pad_expert_input_to_capacity=True,
                     moe_expert_rank_capacity_factor=1.2)
    assert capped_load(1.0, both) == 1.2  # padded to 1.3 per expert, then the rank's budget 1.2


def test_the_rows_a_layer_keeps():
    assert stashed_load(ModelSpec(experts=8, top_k=2), 1.1) == 1.1  # dropless: the load
    f = ModelSpec(experts=8, top_k=2, moe_expert_rank_capacity_factor=1.2)
    assert stashed_load(f, 1.1) == 1.2  # the static buffer's rows, whatever the routing
    stash = ModelSpec(experts=8, top_k=2, moe_expert_rank_capacity_factor=1.2, moe_paged_stash=True)
    assert stashed_load(stash, 1.1) == 1.1  # the default GPU buffer: 1.10 of the mean
    actual = ModelSpec(experts=8, top_k=2, moe_expert_rank_capacity_factor=1.2, moe_paged_stash=True,
                       moe_paged_stash_buffer_size_factor_cuda=-1.05)
    assert stashed_load(actual, 1.1) == pytest.approx(1.155)  # negative: 1.05 of the actual 1.1


def test_what_spills_to_the_host_and_what_overflows():
    kw = dict(experts=8, top_k=2, moe_expert_rank_capacity_factor=1.2, moe_paged_stash=True,
              moe_paged_stash_buffer_size_factor_cuda=1.0)
    # load 1.3 in a GPU buffer of 1.0: 0.3 past it; a host buffer of 0.2 takes 0.2, and 0.1 overflows
    assert stash_spill(ModelSpec(**kw, moe_paged_stash_buffer_size_factor_cpu=0.2), 1.3) == pytest.approx((0.2, 0.1))
    assert stash_spill(ModelSpec(**kw, moe_paged_stash_buffer_size_factor_cpu=0.8), 1.3) == pytest.approx((0.3, 0.0))
    assert stash_spill(ModelSpec(**kw), 0.9) == (0.0, 0.0)  # within the GPU buffer


def _flex(static: bool) -> LayerShape:
    return LayerShape(b=1, s=4096, s_kv=4096, h=2048, heads=16, kv_heads=16, ffn=1408, swiglu=True, biases=False,
                      dropout=False, experts=64, top_k=6, ep=8, dispatcher="flex", backend="hybridep",
                      static_ep=static)


def test_a_static_budget_has_no_host_sync():
    # HybridEP sizes its buffers from the received count on the host unless the budget fixes them
    kinds = [[getattr(st, "kind", "comm") for st in dispatch_steps(_flex(s), 4096, 0.0, "fwd", [])]
             for s in (False, True)]
    assert kinds == [["host", "comm"], ["comm"]]


@pytest.mark.parametrize("lines, backend, key, words", [
    (["moe_expert_rank_capacity_factor: 1.2"], "deepep", "model.moe_expert_rank_capacity_factor",
     "requires the flex dispatcher's hybridep backend"),
    (["moe_paged_stash: true"], "hybridep", "model.moe_paged_stash", "requires model.moe_expert_rank_capacity_factor"),
])
def test_megatron_cores_rules_refuse_by_key(lines, backend, key, words):
    with pytest.raises(ScenarioError, match=words) as err:
        scenario(*lines, backend=backend)
    assert err.value.key == key


def test_the_stash_and_offloading_the_experts_exclude_each_other():
    with pytest.raises(ScenarioError, match="the paged stash covers those") as err:
        scenario("moe_expert_rank_capacity_factor: 1.2", "moe_paged_stash: true",
                 training=", fine_grained_activation_offloading: true, offload_modules: [moe_act]")
    assert err.value.key == "training.offload_modules"


def test_a_static_budget_lets_a_graph_capture_the_whole_iteration():
    with pytest.raises(ScenarioError, match="a dropless MoE layer cannot be captured whole"):
        scenario(training=", cuda_graph_impl: full_iteration")
    sc = scenario("moe_expert_rank_capacity_factor: 1.2", training=", cuda_graph_impl: full_iteration")
    assert sc.training.cuda_graph_impl == "full_iteration"


def test_memory_keeps_the_budgets_rows_or_the_stashs_pages():
    m = M.resolve(scenario().model)
    s, h, fe, k = m.seq_len, m.hidden, M.expert_ffn(m), m.top_k
    # one layer's routed rows at the mean, bf16 (2-byte saves), tp 1, micro-batch 1: per token, top_k copies of
    # the SwiGLU up outputs (2 x fe x 2 B), the activation's output (fe x 2 B) and the fc1 input (h x 2 B)
    R = s * k * (4 * fe + 2 * fe + 2 * h)  # 4096 x 6 x (5632 + 2816 + 4096) = 308,281,344 B
    assert R == 4096 * 6 * 12544
    layers = 27  # pp 1, 1F1B: one micro-batch of all 27 layers in flight
    budget = memory_report(scenario("moe_expert_rank_capacity_factor: 1.2"))
    stash = memory_report(scenario("moe_expert_rank_capacity_factor: 1.2", "moe_paged_stash: true",
                                   "moe_paged_stash_buffer_size_factor_cuda: 1.0",
                                   "moe_paged_stash_buffer_size_factor_cpu: 0.5"))
    # the static buffers keep 1.2 R a layer; the stash keeps R a layer in pages, plus the last layer's 1.2 R
    assert budget.breakdown["activations"] - stash.breakdown["activations"] == pytest.approx(
        layers * 0.2 * R - 1.2 * R)
    assert stash.stash_bytes == pytest.approx(layers * R) and stash.host_bytes == pytest.approx(layers * 0.5 * R)
    assert budget.stash_bytes == 0.0 and budget.host_bytes == 0.0


def test_the_summary_says_what_the_busiest_rank_spills(capsys):
    from emulator.cli import main

    sets = ["--set", "model.moe_expert_rank_capacity_factor=1.5", "--set", "model.moe_paged_stash=true",
            "--set", "model.moe_paged_stash_buffer_size_factor_cuda=1.0", "--set", "model.moe_imbalance=1.4"]
    base = ["run", "scenarios/deepseek-v2-lite-moe-16-h100.yaml", "--set", "parallel.moe_token_dispatcher_type=flex",
            "--set", "parallel.moe_flex_dispatcher_backend=hybridep", *sets]
    assert main([*base, "--json"]) == 0
    stash = json.loads(capsys.readouterr().out)["memory"]["paged_stash"]
    # moe_imbalance 1.4 over 8 local experts: the busiest rank (1.4 + 7)/8 = 1.05, under the budget 1.5; its
    # 0.05 past the GPU buffer of 1.0 has no host buffer to go to
    assert stash["busiest_load"] == pytest.approx(1.05) and stash["spill_to_host"] == 0.0 and stash["overflow"]
    assert main([*base, "--set", "model.moe_paged_stash_buffer_size_factor_cpu=0.1"]) == 0
    out = capsys.readouterr().out
    assert "busiest rank 1.050x the mean, 0.050x of it to the host" in out and "OVERFLOWS" not in out


def test_stash_summary_is_absent_without_the_stash():
    sc = scenario("moe_expert_rank_capacity_factor: 1.2")
    assert stash_summary(sc, memory_report(sc)) is None
