"""Context parallelism by all-to-all (parallel.cp_comm_type a2a: DeepSpeed-Ulysses as Transformer Engine runs it)."""
import pytest

from emulator.errors import ScenarioError
from emulator.scenario import ModelSpec, ParallelSpec, load_scenario_text
from emulator.workload import layer as Ly

GPT = ModelSpec(layers=48, hidden=6144, heads=64, seq_len=2048, vocab=51200)


def shape(kind: str) -> Ly.LayerShape:
    return Ly.layer_shape(GPT, 1, cp=2, flash=True, parallel=ParallelSpec(cp=2, cp_comm_type=kind))


def test_the_core_between_two_all_to_alls():
    L = shape("a2a")
    fwd = Ly.attention_core_forward(L)
    # this rank's s = 2048/2 = 1024 tokens; Q, K, V of 64 heads of d 96: 1024·(64·96 + 64·192) = 18 874 368
    # elements, 37 748 736 B; the output 1024·64·96·2 = 12 582 912 B
    assert [(st.name, st.collective, st.group, st.bytes) for st in fwd if isinstance(st, Ly.Comm)] == [
        ("attn.a2a_qkv", "all_to_all", "cp", 37_748_736), ("attn.a2a_out", "all_to_all", "cp", 12_582_912)]
    (k,) = [st for st in fwd if isinstance(st, Ly.Kernel)]
    # the whole sequence (2048) of 64/2 = 32 heads: 4·32·2048²·96·½ = 25 769 803 776 FLOPs, as the ring's two
    # steps of 64 heads, 1024 queries and 1024 keys: 2·4·64·1024²·96·½
    assert (k.m, k.n, k.batch) == (2048, 2048, 32)
    assert k.flops == 25_769_803_776 == sum(x.flops for x in Ly.kernels(Ly.attention_core_forward(shape("p2p"))))
    bwd = Ly.attention_core_backward(L)
    assert [(st.name, st.bytes) for st in bwd if isinstance(st, Ly.Comm)] == [
        ("attn.a2a_dout", 12_582_912), ("attn.a2a_dqkv", 37_748_736)]
    assert all(st.overlap == 0 for st in fwd + bwd if isinstance(st, Ly.Comm))  # blocking, unlike the ring's steps


def test_the_builder_sends_them_over_the_cp_group():
    from emulator.workload.builder import build_program
    from emulator.workload.placement import Layout

    sc = load_scenario_text("name: x\ncluster: {nodes: 1, node: dgx-h100}\n"
                            "model: {layers: 2, hidden: 512, heads: 8, seq_len: 1024, vocab: 512}\n"
                            "training: {global_batch: 2, micro_batch: 1, attention: flash}\n"
                            "parallel: {tp: 2, cp: 2, dp: 2, cp_comm_type: a2a}\n", "x.yaml")
    prog = build_program(sc)
    lo = Layout.from_parallel(sc.parallel, 8)
    a2a = [o for o in prog.ops if ".attn.a2a_" in o.name]
    assert a2a and all(o.collective == "all_to_all" and o.group == lo.cp_group(o.rank) for o in a2a)
    assert {len(o.group) for o in a2a} == {2}
    # each simulated rank: 2 layers x (2 forward + 2 backward) x 1 micro-batch (global 2 / (1 x dp 2)) = 8
    per_rank = {r: sum(o.rank == r for o in a2a) for r in {o.rank for o in a2a}}
    assert set(per_rank.values()) == {8}


def test_heads_must_split_over_cp():
    text = ("name: x\ncluster: {nodes: 8, node: dgx-h100}\nmodel: {preset: llama3-70b}\n"
            "training: {global_batch: 64, micro_batch: 1}\n"
            "parallel: {tp: 8, pp: 4, cp: 2, sequence_parallel: true, cp_comm_type: a2a}\n")
    with pytest.raises(ScenarioError) as info:
        load_scenario_text(text, "x.yaml")
    # 8 kv heads over tp 8 leave one a rank, which cp 2 cannot split (TE: num_heads % cp_size == 0)
    assert "parallel.cp_comm_type" in str(info.value) and "kv heads 8 over tp 8" in str(info.value)
    assert load_scenario_text(text.replace("tp: 8, pp: 4", "tp: 4, pp: 8"), "x.yaml").parallel.cp_comm_type == "a2a"
