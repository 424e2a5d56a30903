"""Workload builder: op counts, groups, tags, deps, and deadlock freedom on a tiny list engine."""
from collections import Counter, defaultdict

import pytest

from emulator.errors import ScenarioError
from emulator.program import COLLECTIVE, COMPUTE, RECV, SEND, Fold
from emulator.scenario import (
    ClusterSpec,
    GpuSpec,
    ModelSpec,
    NodeSpec,
    ParallelSpec,
    Scenario,
    SimulationSpec,
    TrainingSpec,
)
from emulator.scenario.catalog import model_preset
from emulator.workload.builder import build_program
from emulator.workload.plan import fold_grid

A100 = GpuSpec("A100-SXM4-80GB", 312e12, 2039e9, 80 * 2**30, 4e-6)
TINY = ModelSpec(layers=4, hidden=256, heads=4, seq_len=128, vocab=512, tied_embeddings=True)


def scen(gpus, par, model=TINY, gb=8, mb=1, recompute="none", detail="layer", nodes=1) -> Scenario:
    node = NodeSpec("n", gpus, A100, "nvswitch", 300e9, 0.15e-6, 230 / 300, gpus, 25e9, 0.5e-6, 0.96)
    return Scenario("t", ClusterSpec(nodes, node), model, TrainingSpec(global_batch=gb, micro_batch=mb,
                    recompute=recompute), par, simulation=SimulationSpec(detail=detail))


def run(prog):
    """Uncontended list engine with the IR's semantics: streams in order, deps, collective
    rendezvous of the simulated members (k-th on a group matches k-th), send/recv pairs on
    (src, dst, tag) that start when both are issued. Returns (end times, unfinished ops)."""
    sim = set(prog.simulated_ranks())
    queues = defaultdict(list)
    for o in prog.ops:
        queues[(o.rank, o.stream)].append(o)
    heads = {k: 0 for k in queues}
    end, prev, issued = {}, defaultdict(float), set()
    index, count = {}, defaultdict(int)
    for o in prog.ops:
        if o.kind is COLLECTIVE:
            index[o.id] = (o.group, count[(o.rank, o.group)])
            count[(o.rank, o.group)] += 1
    coll, p2p = defaultdict(dict), defaultdict(dict)
    def cost(o):
        return 1e-6 + o.bytes / 100e9

    progress = True
    while progress:
        progress = False
        for key, q in queues.items():
            while heads[key] < len(q):
                o = q[heads[key]]
                if o.id in end:
                    heads[key] += 1
                    progress = True
                    continue
                if any(d not in end for d in o.deps) or o.id in issued:
                    break
                ready = max([prev[key]] + [end[d] for d in o.deps])
                if o.kind is COMPUTE:
                    end[o.id] = prev[key] = ready + o.duration
                    heads[key] += 1
                    progress = True
                    continue
                issued.add(o.id)
                if o.kind is COLLECTIVE:
                    box, need = coll[index[o.id]], [g for g in o.group if g in sim]
                else:
                    box = p2p[(o.rank, o.peer, o.tag) if o.kind is SEND else (o.peer, o.rank, o.tag)]
                    need = [o.rank, o.peer] if o.peer in sim else [o.rank]
                box[o.rank] = (o, ready, key)
                if len(box) == len(need):
                    start = max(r for _, r, _ in box.values())
                    for oo, _, kk in box.values():
                        end[oo.id] = prev[kk] = start + cost(oo)
                    progress = True
                break
    return end, [o for o in prog.ops if o.id not in end]


def test_layer_mode_counts_per_layer_and_microbatch():
    # tp 2, pp 2, dp 2 on 8 GPUs; 8 samples / (1·2) = 4 micro-batches; 2 layers per stage.
    prog = build_program(scen(8, ParallelSpec(tp=2, pp=2, dp=2)))
    prog.validate()
    assert prog.meta.workload.microbatches == 4 and prog.meta.workload.pp == 2
    ops = [o for o in prog.ops if o.rank == 0 and o.layer == 1 and o.microbatch == 2]
    c = Counter((o.kind, o.category) for o in ops)
    # forward: [ln1..proj] AR [bda1..down] AR [bda2] → 3 compute + 2 all-reduces;
    # backward: [bda2_bwd..up.dgrad] AR‖[up.wgrad] [ln2_bwd..qkv.dgrad] AR‖[qkv.wgrad] [ln1_bwd..] → 5 + 2
    assert c[(COMPUTE, "fwd")] == 3 and c[(COMPUTE, "bwd")] == 5
    assert c[(COLLECTIVE, "comm")] == 4
    assert all(o.group == (0, 1) for o in ops if o.kind is COLLECTIVE)


def test_op_mode_counts():
    prog = build_program(scen(2, ParallelSpec(tp=2), detail="op"))
    fwd = [o.name.split(".", 3)[-1] for o in prog.ops if o.rank == 0 and o.layer == 0 and o.microbatch == 0
           and o.category == "fwd" and o.kind is COMPUTE]
    assert fwd == ["ln1", "qkv", "attn.qk", "attn.softmax", "attn.dropout", "attn.pv", "ctx_copy", "proj",
                   "bda1", "ln2", "mlp.up", "gelu", "mlp.down", "bda2"]


def test_groups_follow_megatron_order():
    prog = build_program(scen(8, ParallelSpec(tp=2, pp=2, dp=2), gb=16))
    for o in prog.ops:
        if o.kind is COLLECTIVE and o.stream == "tp":
            assert o.group == (o.rank // 2 * 2, o.rank // 2 * 2 + 1)
        if o.kind is COLLECTIVE and o.stream == "dp" and o.name.startswith("grad"):
            assert o.group == tuple(sorted({o.rank, o.rank ^ 2}))  # dp stride TP = 2
        if o.kind in (SEND, RECV):
            assert abs(o.peer - o.rank) == 4  # pp stride TP·DP = 4


@pytest.mark.parametrize("par,kw", [
    (ParallelSpec(tp=2, pp=2, dp=2), {}),
    (ParallelSpec(tp=2, pp=2, dp=2, schedule="gpipe"), {}),
    (ParallelSpec(pp=4, dp=2, schedule="interleaved-1f1b", virtual_stages=2), {"gb": 16, "model": ModelSpec(
        layers=8, hidden=256, heads=4, seq_len=128, vocab=512, tied_embeddings=True)}),
    (ParallelSpec(pp=2, schedule="interleaved-1f1b", virtual_stages=2, dp=4, zero=1), {"gb": 16}),
    (ParallelSpec(tp=2, pp=2, dp=2, sequence_parallel=True, zero=1, overlap_grad_reduce=False), {"recompute": "full"}),
    (ParallelSpec(tp=2, cp=2, dp=2), {"recompute": "selective"}),
    (ParallelSpec(dp=4, pp=2, zero=3), {}),
    (ParallelSpec(dp=4, ep=4, pp=2), {"model": ModelSpec(layers=2, hidden=256, heads=4, seq_len=128, vocab=512,
                                                         experts=8, top_k=2, swiglu=True)}),
])
def test_programs_are_consistent_and_run(par, kw):
    prog = build_program(scen(8, par, **kw))
    prog.validate()
    assert prog.simulated_ranks() == list(range(8))
    # every dep is an op of the same rank
    rank = {o.id: o.rank for o in prog.ops}
    assert all(rank[d] == o.rank for o in prog.ops for d in o.deps)
    # tags unique per (src, dst), every send has exactly one recv
    sends = Counter((o.rank, o.peer, o.tag) for o in prog.ops if o.kind is SEND)
    recvs = Counter((o.peer, o.rank, o.tag) for o in prog.ops if o.kind is RECV)
    assert max(sends.values(), default=1) == 1 and sends == recvs
    end, stuck = run(prog)
    assert not stuck, f"deadlock at {stuck[0]}"
    assert max(end.values()) > 0


def test_grad_buckets_and_optimizer():
    # dp 2, one GPU per replica; a bucket of 1 byte puts every unit in its own bucket:
    # embedding, 4 layers, head → 6 all-reduces, then one optimizer op depending on all of them.
    sc = scen(2, ParallelSpec(dp=2, grad_bucket=1))
    prog = build_program(sc)
    ar = [o for o in prog.ops if o.rank == 0 and o.stream == "dp"]
    assert [o.collective for o in ar] == ["all_reduce"] * 6
    opt = [o for o in prog.ops if o.rank == 0 and o.category == "optimizer"]
    assert len(opt) == 1 and set(o.id for o in ar) <= set(opt[0].deps)
    # ZeRO-1: reduce-scatter, then (overlapped) parameter all-gathers before the forward.
    prog = build_program(scen(2, ParallelSpec(dp=2, zero=1)))
    assert {o.collective for o in prog.ops if o.stream == "dp"} == {"reduce_scatter"}
    assert {o.collective for o in prog.ops if o.stream == "zero"} == {"all_gather"}


def test_fold_emits_representatives_only():
    sc = scen(8, ParallelSpec(tp=2, pp=2, dp=2))
    shape, names = fold_grid(sc)
    assert (shape, names) == ((2, 2, 1, 2), ("pp", "dp", "cp", "tp"))
    fold = Fold(shape, tuple(n in ("tp", "dp") for n in names))
    prog = build_program(sc, fold)
    assert prog.simulated_ranks() == [0, 4]
    assert any(o.group == (0, 1) for o in prog.ops if o.kind is COLLECTIVE)  # world numbering
    end, stuck = run(prog)
    assert not stuck


def test_meta():
    prog = build_program(scen(8, ParallelSpec(tp=2, pp=2, dp=2), recompute="full"))
    # tokens 8·128; model FLOPs 72·8·128·4·256²·(1 + 128/1536 + 512/12288)
    facts = prog.meta.workload
    assert facts.tokens == 1024 and facts.samples == 8
    assert facts.model_flops == pytest.approx(72 * 8 * 128 * 4 * 256**2 * (1 + 128 / 1536 + 512 / 12288))
    assert facts.hardware_flops == pytest.approx(96 * 8 * 128 * 4 * 256**2 * (1 + 128 / 1536 + 512 / 16384))


def test_bad_input_is_a_clear_error():
    with pytest.raises(ScenarioError, match="global_batch"):
        build_program(scen(8, ParallelSpec(tp=2, pp=2, dp=2), gb=7))
    with pytest.raises(ScenarioError, match=r"model.layers \(4\) must be divisible by pp\*virtual_stages = 8\*1 = 8"):
        build_program(scen(8, ParallelSpec(pp=8)))


def test_gpt3_175b_builds_folded():
    # its build time is measured in benchmarks/run.py, not here
    sc = scen(8, ParallelSpec(tp=8, pp=8, dp=16, schedule="interleaved-1f1b", virtual_stages=3),
              model=model_preset("gpt3-175b"), gb=1536, nodes=128)
    shape, names = fold_grid(sc)
    prog = build_program(sc, Fold(shape, tuple(n in ("tp", "dp") for n in names)))
    assert prog.simulated_ranks() == list(range(0, 1024, 128))
    assert prog.meta.workload.microbatches == 96


@pytest.mark.parametrize("overlap", [True, False])
def test_overlap_param_gather_places_the_zero1_gathers(overlap):
    """Distributed optimizer (ZeRO-1, dp 4): with overlap_param_gather the parameter all-gathers
    wait for nothing: the first opens the iteration, each other one is written at the forward of the
    bucket before (Megatron-Core's pre-hook issues it there), ahead of its own bucket's first forward
    (Megatron's steady state); without, they follow the optimizer step. Gradient overlap is on in both."""
    from emulator.run.simulation import run_program

    sc = scen(4, ParallelSpec(dp=4, zero=1, overlap_param_gather=overlap, grad_bucket=1e6))
    prog = build_program(sc)
    for rank in range(4):
        mine = [o for o in prog.ops if o.rank == rank]
        gathers = [o for o in mine if o.name.startswith("param_ag.")]
        opt = next(o for o in mine if o.name == "optimizer")
        first_compute = min(o.id for o in mine if o.stream == "compute")
        assert len(gathers) > 1  # 1 MB buckets of the tiny model's bf16 weights
        if overlap:
            assert gathers[0].id < first_compute and all(not o.deps for o in gathers)
            assert all(g.id < min(o.id for o in mine if g.id in o.deps) for g in gathers)
        else:
            assert all(o.deps == (opt.id,) for o in gathers)
    # The same work either way; only where the gathers sit differs. Without overlap all of them
    # run after the optimizer, exposed; with it only the first bucket's gather is exposed, the
    # others run under the forward of the buckets before them.
    t = {ov: run_program(build_program(scen(4, ParallelSpec(dp=4, zero=1, overlap_param_gather=ov, grad_bucket=1e6))),
                         scen(4, ParallelSpec(dp=4, zero=1))).iteration_time_s for ov in (True, False)}
    assert t[False] > t[True]


def test_zero_3_shards_the_experts_over_their_expert_data_parallel_group():
    # Megatron-FSDP puts an expert parameter group on the expert FSDP group (megatron_fsdp param_and_grad_buffer.py,
    # get_fsdp_group(is_expert_parallel=...)): Qwen3-30B-A3B over DP 8 and EP 4, expert-DP 8/4 = 2
    from emulator.scenario import load_scenario_text
    from emulator.workload.builder import build_program

    sc = load_scenario_text("name: q\ncluster: {nodes: 1, node: dgx-h100}\nmodel: {preset: qwen3-30b-a3b}\n"
                            "training: {global_batch: 8, micro_batch: 1}\n"
                            "parallel: {tp: 1, pp: 1, dp: 8, ep: 4, zero: 3}\n", "q.yaml")
    ops = {op.name: op for op in build_program(sc).ops if op.rank == 0 and op.name.startswith("mb0.layer3.")}
    # the layer's dense weights: QKV 2048·(32·128 + 2·4·128) = 10,485,760, the output 4096·2048 = 8,388,608, the
    # router 128·2048 = 262,144, two norms 2·2048: 19,140,608, gathered in bf16 over dp·cp = 8
    for phase in ("F", "B"):
        dense, expert = ops[f"mb0.layer3.{phase}.zero3_ag"], ops[f"mb0.layer3.{phase}.expert_zero3_ag"]
        assert (dense.bytes, len(dense.group)) == (2 * 19_140_608, 8)
        # 128/4 = 32 local experts of 3·2048·768 = 4,718,592: 150,994,944, over the expert-DP group of 2
        assert (expert.bytes, len(expert.group)) == (2 * 150_994_944, 2)
    # the gradients reduce-scattered in fp32 over the same groups
    assert (ops["mb0.layer3.zero3_rs"].bytes, len(ops["mb0.layer3.zero3_rs"].group)) == (4 * 19_140_608, 8)
    assert (ops["mb0.layer3.expert_zero3_rs"].bytes, len(ops["mb0.layer3.expert_zero3_rs"].group)) == \
        (4 * 150_994_944, 2)


HSDP = ("name: h\ncluster: {nodes: 2, node: dgx-h100}\nmodel: {preset: qwen3-30b-a3b}\n"
        "training: {global_batch: 16, micro_batch: 1}\n"
        "parallel: {tp: 1, pp: 1, dp: 16, ep: 4, zero: %d%s}\n")


def test_hsdp_shards_within_an_instance_and_reduces_across_instances_once_a_step():
    # Megatron-FSDP's HSDP: 2 instances of 8 consecutive DP ranks (one node each), outer sharding "optim"
    from emulator.scenario import load_scenario_text
    from emulator.workload.builder import build_program
    from emulator.workload.memory import memory_report

    sc = load_scenario_text(HSDP % (3, ", num_distributed_optimizer_instances: 2, outer_dp_sharding_strategy: optim"),
                            "h.yaml")
    ops = {op.name: op for op in build_program(sc).ops if op.rank == 0}
    # each micro-batch within the instance: the dense weights of layer 3 (19,140,608, bf16) over ranks 0-7; the 32
    # local experts (150,994,944) over the instance's share of the expert-DP group {0, 4, 8, 12}: {0, 4}
    assert (ops["mb0.layer3.F.zero3_ag"].bytes, ops["mb0.layer3.F.zero3_ag"].group) == (2 * 19_140_608,
                                                                                          tuple(range(8)))
    assert ops["mb0.layer3.F.expert_zero3_ag"].group == (0, 4)
    # once a step, across the instances (rank 0 and its peer 8): the gradient shards, fp32, reduce-scattered:
    # 4·19,140,608/8 = 9,570,304 and 4·150,994,944/2 = 301,989,888 B, after the last micro-batch's reduce-scatter
    rs, ers = ops["layer3.hsdp_reduce_scatter"], ops["layer3.expert_hsdp_reduce_scatter"]
    assert (rs.bytes, rs.group, ers.bytes, ers.group) == (9_570_304, (0, 8), 301_989_888, (0, 8))
    assert set(rs.deps) == {ops["mb0.layer3.zero3_rs"].id, ops["mb0.layer3.expert_zero3_rs"].id}  # one micro-batch
    # the step waits for them; the updated shards come back at the unit's first forward of the step, before its
    # gather within the instance (Megatron-FSDP gathers across the instances "at the beginning of a new optimization
    # step cycle"): the dense 2·19,140,608/8 = 4,785,152 B and the experts' 2·150,994,944/2 = 150,994,944 B, issued
    # on what the inner gather would wait for; the inner gather waits for both
    assert rs.id in ops["optimizer"].deps
    ag, eag = ops["mb0.layer3.hsdp_all_gather"], ops["mb0.layer3.expert_hsdp_all_gather"]
    assert (ag.bytes, ag.group, eag.bytes, eag.group) == (4_785_152, (0, 8), 150_994_944, (0, 8))
    inner = ops["mb0.layer3.F.zero3_ag"]
    assert set(ag.deps) == set(inner.deps) - {ag.id, eag.id} and {ag.id, eag.id} <= set(inner.deps)
    assert not any(n.endswith("hsdp_all_gather") and not n.startswith("mb0.") for n in ops)  # once a step
    # memory: weights and gradients over the instance (dense 8, experts 2 ranks: twice plain ZeRO-3's over 16 and
    # 4), the optimizer states over all 16 (and 4) as before
    plain = memory_report(load_scenario_text(HSDP % (3, ""), "h.yaml")).breakdown
    hsdp = memory_report(sc).breakdown
    assert hsdp["params"] == 2 * plain["params"] and hsdp["grads"] == 2 * plain["grads"]
    assert hsdp["optimizer"] == plain["optimizer"]
    # no_shard: the instances replicate the states and all-reduce the gradient shards, and gather nothing back
    ns = load_scenario_text(HSDP % (3, ", num_distributed_optimizer_instances: 2"), "h.yaml")
    names = {op.name for op in build_program(ns).ops if op.rank == 0}
    assert "layer3.hsdp_all_reduce" in names and "layer3.hsdp_all_gather" not in names
    assert memory_report(ns).breakdown["optimizer"] == 2 * plain["optimizer"]


@pytest.mark.parametrize("zero, extra, words", [
    (1, ", num_distributed_optimizer_instances: 2", "Megatron-FSDP's HSDP (parallel.zero 3)"),
    (3, ", outer_dp_sharding_strategy: optim", "needs HSDP"),
    (3, ", num_distributed_optimizer_instances: 3", "must divide dp*cp = 16*1 = 16"),
    (3, ", num_distributed_optimizer_instances: 8", "must divide the expert-data-parallel size (4)"),
])
def test_hsdp_refusals_name_the_key(zero, extra, words):
    from emulator.scenario import load_scenario_text

    with pytest.raises(ScenarioError) as err:
        load_scenario_text(HSDP % (zero, extra), "h.yaml")
    assert words in err.value.message and "parallel." in err.value.key
