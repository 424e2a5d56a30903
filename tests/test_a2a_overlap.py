"""Megatron-Core's 1F1B all-to-all overlap (parallel.overlap_moe_expert_parallel_comm, delay_wgrad_compute):
its preconditions refused by name, the combined steps of the schedule, the paired layer's order, and a small
MoE layout whose step shortens as its exposed all-to-all time drops."""
import pytest

from emulator.errors import ScenarioError
from emulator.outputs.summary import summarize
from emulator.run.simulation import simulate
from emulator.scenario import load_scenario_text
from emulator.workload.builder import build_program
from emulator.workload.schedules import Task, combined_steps, max_in_flight, schedule

# deepseek-v2-lite cut to 8 layers (its first is dense) on 2 DGX H100: pp 2 x 2 virtual stages, dp 8, ep 8;
# 32 sequences / dp 8 = 4 micro-batches per pipeline (a multiple of pp, as interleaving needs)
TEXT = """
name: a2a
cluster: {nodes: 2, node: dgx-h100}
model: {preset: deepseek-v2-lite, layers: 8}
training: {global_batch: 32, micro_batch: 1, attention: flash}
parallel: {tp: 1, pp: 2, dp: 8, ep: 8, schedule: interleaved-1f1b, virtual_stages: 2}
"""
ON = "parallel.overlap_moe_expert_parallel_comm=true"


def scenario(*sets: str):
    return load_scenario_text(TEXT, "a2a.yaml", sets)


@pytest.mark.parametrize("sets,rule", [
    (["parallel.schedule=1f1b", "parallel.virtual_stages=1"], "with pp > 1 needs virtual pipeline stages"),
    (["parallel.ep=1"], "needs expert parallelism, ep > 1"),
    (["parallel.pp=1", "parallel.dp=16", "parallel.schedule=zb-h1", "parallel.virtual_stages=1",
      "training.global_batch=64"], "runs Megatron's combined 1F1B steps"),
    (["parallel.moe_token_dispatcher_type=allgather"], "needs the alltoall or flex dispatcher"),
    (["parallel.moe_shared_expert_overlap=true"], "refuses moe_shared_expert_overlap"),
    (["parallel.zero=3"], "not modelled with ZeRO-3"),
    (["training.recompute=full"], "refuses full recompute"),
    (["training.precision=fp32"], "needs a bf16 or fp16 model"),
])
def test_each_precondition_is_refused_by_name(sets, rule):
    with pytest.raises(ScenarioError, match="overlap_moe_expert_parallel_comm") as err:
        scenario(ON, *sets)
    assert rule in str(err.value) and err.value.key == "parallel.overlap_moe_expert_parallel_comm"


def test_delay_wgrad_compute_needs_the_overlap():
    with pytest.raises(ScenarioError, match="delay_wgrad_compute needs overlap_moe_expert_parallel_comm") as err:
        scenario("parallel.delay_wgrad_compute=true")
    assert err.value.key == "parallel.delay_wgrad_compute"


def test_one_more_warm_up_forward_and_the_combined_steps():
    # interleaved, p 2, v 2, m 4, stage 0: Megatron's warm-up (2−0−1)·2 + (2−1)·2 = 4, plus 1 with the overlap
    plain, ov = schedule("interleaved-1f1b", 0, 2, 4, 2), schedule("interleaved-1f1b", 0, 2, 4, 2, True)
    assert [t.phase for t in plain[:5]] == ["F", "F", "F", "F", "F"] and plain[5].phase == "B"
    assert [t.phase for t in ov[:6]] == ["F"] * 5 + ["F"] and ov[6].phase == "B"
    assert max_in_flight(ov) == max_in_flight(plain) + 1
    # without pipelining (combined_1f1b_schedule_for_no_pipelining): F0, then F(i+1) with B(i), then B(m−1) alone
    steps = combined_steps(schedule("1f1b", 0, 1, 3, 1, True))
    assert steps == [(Task("F", 0),), (Task("F", 1), Task("B", 0)), (Task("F", 2), Task("B", 1)), (Task("B", 2),)]


def test_the_forward_dispatch_runs_beside_the_backward():
    sc = scenario(ON)
    ops = [o for o in build_program(sc).ops if o.rank == 0]
    byid = {o.id: o for o in ops}
    # a paired layer: the backward's combine_bwd, then the forward's dispatch, which waits only for its own
    # pass's pre-dispatch kernels; the backward's expert kernels come after it on the compute stream and
    # wait for the combine_bwd, so the dispatch runs under them
    for i, o in enumerate(ops):
        if o.name.endswith("fwd.moe.dispatch") and ops[i - 1].stream == "compute" and \
                any(p.name.endswith("bwd.moe.combine_bwd") for p in ops[max(0, i - 6):i]):
            nxt = next(x for x in ops[i + 1:] if x.stream == "compute")
            assert ".bwd." in nxt.name and all(".fwd." in byid[d].name for d in o.deps)
            assert any(byid[d].name.endswith("combine_bwd") for d in nxt.deps)
            break
    else:
        pytest.fail("no paired layer found")


def test_the_overlap_hides_all_to_all_time():
    base = summarize(simulate(scenario(), record_links=False))
    ov = summarize(simulate(scenario(ON), record_links=False))
    assert ov["breakdown_s"]["compute"] == pytest.approx(base["breakdown_s"]["compute"], rel=1e-9)  # same kernels
    assert ov["breakdown_s"]["exposed_comm"] < 0.9 * base["breakdown_s"]["exposed_comm"]
    assert ov["iteration_time_s"] < base["iteration_time_s"]


def test_delay_wgrad_compute_starts_the_backward_dispatch_before_the_experts_wgrad():
    # in a paired layer without it, the backward's dispatch waits for the whole experts' backward (dgrad and
    # wgrad GEMMs); with it, for their dgrad GEMMs only, and the wgrad GEMMs follow it on the compute stream.
    # A backward that runs alone (warm-up, cool-down) keeps Megatron's order: backward_dw before the dispatch.
    # The experts' backward ends with the chunk sort's gradient (layer.chunk_sort), so the op the dispatch
    # waits for is named ..moe.sort_chunks_bwd either way: with the wgrad GEMMs in it, it lasts longer.
    waited_s = {}
    for delay in (False, True):
        sets = [ON] + (["parallel.delay_wgrad_compute=true"] if delay else [])
        ops = [o for o in build_program(scenario(*sets)).ops if o.rank == 0]
        byid = {o.id: o for o in ops}
        dispatch = [i for i, o in enumerate(ops) if o.name.endswith("bwd.moe.dispatch_bwd")]
        early = [i for i in dispatch
                 if next(x for x in ops[i + 1:] if x.stream == "compute").name.endswith("moe.down.wgrad..moe.up.wgrad")]
        assert bool(early) == delay
        for i in early:
            (waited,) = ops[i].deps
            assert byid[waited].name.endswith("moe.sort_chunks_bwd") and "wgrad" not in byid[waited].name
        waited_s[delay] = min(byid[ops[i].deps[0]].duration for i in dispatch)
    assert waited_s[True] < waited_s[False]


def test_a_combined_step_holds_one_layer_more_not_a_chunk():
    # pp 1, 3 micro-batches of one 10-layer chunk: F0 alone holds 10 layers; F1 with B0 interleaves them a layer
    # at a time (Megatron-Core TransformerModelChunkSchedulePlan.run), so 10 + 1 at most, not 10 + 10
    ov = schedule("1f1b", 0, 1, 3, 1, True)
    assert max_in_flight(ov, [10.0]) == 20.0  # taken task by task
    assert max_in_flight(ov, [10.0], combined=True) == 11.0
    # F0 of chunk 1 (2 layers) and F1 of chunk 0 (5): 7 live; then F2 (5 layers) with B0 (2): the 2 overlapped
    # layer pairs hold one more at a time, then F2's other 3 run alone: 7 + max(1, 5 − 2) = 10
    tasks = [Task("F", 0, 1), Task("F", 1, 0), Task("F", 2, 0), Task("B", 0, 1)]
    assert max_in_flight(tasks, [5.0, 2.0], combined=True) == 10.0
    assert max_in_flight(tasks, [5.0, 2.0]) == 12.0  # task by task: 2 + 5 + 5 before B0 frees its 2
