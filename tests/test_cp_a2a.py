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


# --- cp_comm_type a2a+p2p (hierarchical: an all-to-all level, the K/V ring over the other) ---

def hier(sizes=(2, 2)) -> Ly.LayerShape:
    par = ParallelSpec(cp=4, cp_comm_type="a2a+p2p", hierarchical_context_parallel_sizes=sizes)
    return Ly.layer_shape(GPT, 1, cp=4, flash=True, parallel=par)


def test_a2a_p2p_runs_the_ring_between_two_all_to_alls():
    L = hier()
    fwd = Ly.attention_core_forward(L)
    # cp 4 = a2a 2 × ring 2. This rank's s = 2048/4 = 512 tokens of 64 heads (d 96, K and V 192): Q, K, V
    # 512·(64·96 + 64·192)·2 B = 18 874 368 B, the output 512·64·96·2 = 6 291 456 B, over the a2a level; then the
    # ring of 2 on 1024 tokens of 32 heads: one K/V block of 1024·32·192·2 = 12 582 912 B (this rank's own K and V)
    assert [(st.name, st.collective, st.group, st.bytes) for st in fwd if isinstance(st, Ly.Comm)] == [
        ("attn.a2a_qkv", "all_to_all", "cp_a2a", 18_874_368), ("attn.kv_ring0", "ring", "cp", 12_582_912),
        ("attn.a2a_out", "all_to_all", "cp_a2a", 6_291_456)]
    ks = Ly.kernels(fwd)
    assert [(k.m, k.n, k.batch) for k in ks] == [(1024, 1024, 32)] * 2
    # 2 steps of 4·32·1024²·96·½ = 6 442 450 944 FLOPs: 12 884 901 888, the plain ring's 4 steps of 64 heads and
    # 512 queries and keys (4·4·64·512²·96·½) and Ulysses' one of 16 heads over 2048 (4·16·2048²·96·½)
    total = sum(k.flops for k in ks)
    assert total == 12_884_901_888
    ring = Ly.layer_shape(GPT, 1, cp=4, flash=True, parallel=ParallelSpec(cp=4))
    assert total == sum(k.flops for k in Ly.kernels(Ly.attention_core_forward(ring)))
    bwd = Ly.attention_core_backward(L)
    assert [(st.name, st.group) for st in bwd if isinstance(st, Ly.Comm)] == [
        ("attn.a2a_dout", "cp_a2a"), ("attn.kv_ring0_bwd", "cp"), ("attn.a2a_dqkv", "cp_a2a")]


def test_a2a_p2p_groups_and_ring_in_the_builder():
    """cp 4 as [2, 2] on one node (dp 2): the all-to-all over CP ranks {0, 1} and {2, 3} of each CP group
    (Megatron's level-1 groups, consecutive), the ring's sends to the rank 2 along CP (level 2: ranks a apart)."""
    from emulator.program import SEND
    from emulator.workload.builder import build_program
    from emulator.workload.placement import Layout

    sc = load_scenario_text("name: x\ncluster: {nodes: 1, node: dgx-h100}\n"
                            "model: {layers: 2, hidden: 512, heads: 8, seq_len: 1024, vocab: 512}\n"
                            "training: {global_batch: 2, micro_batch: 1, attention: flash}\n"
                            "parallel: {cp: 4, dp: 2, cp_comm_type: a2a+p2p, "
                            "hierarchical_context_parallel_sizes: [2, 2]}\n", "x.yaml")
    prog = build_program(sc)
    lo = Layout.from_parallel(sc.parallel, 8)
    a2a = [o for o in prog.ops if ".attn.a2a_" in o.name]
    assert a2a
    for o in a2a:
        cp = lo.cp_group(o.rank)
        i = cp.index(o.rank) // 2 * 2
        assert o.group == cp[i:i + 2]
    sends = [o for o in prog.ops if o.kind is SEND and ".attn.kv_ring" in o.name]
    assert sends and all(o.peer == lo.neighbour(o.rank, "cp", 2) for o in sends)


@pytest.mark.parametrize("sets, says", [
    ("cp_comm_type: a2a+p2p, hierarchical_context_parallel_sizes: [2, 4]", "product is cp (4); got [2, 4]"),
    ("cp_comm_type: a2a+p2p", "product is cp (4); got none"),
    ("cp_comm_type: p2p, hierarchical_context_parallel_sizes: [2, 2]", "is for cp_comm_type a2a+p2p (got p2p)"),
    # 8 kv heads over tp 8: one a rank, which an a2a level of 2 cannot split
    ("tp: 8, cp_comm_type: a2a+p2p, hierarchical_context_parallel_sizes: [2, 2]", "kv heads 8 over tp 8"),
])
def test_a2a_p2p_sizes_are_checked(sets, says):
    text = ("name: x\ncluster: {nodes: 8, node: dgx-h100}\nmodel: {preset: llama3-70b}\n"
            "training: {global_batch: 64, micro_batch: 1}\n"
            f"parallel: {{tp: 4, pp: 4, cp: 4, sequence_parallel: true, {sets}}}\n")
    if "tp: 8" in sets:
        text = text.replace("tp: 4, pp: 4, ", "pp: 2, ")
    with pytest.raises(ScenarioError) as info:
        load_scenario_text(text, "x.yaml")
    assert "parallel.hierarchical_context_parallel_sizes" in str(info.value) and says in str(info.value)


def test_a2a_p2p_folds_by_its_groups():
    """Folding rotates cp as [ring b, a2a a] digits under a2a+p2p (run/folding.py ``_cp_digits``): a rotation by
    one CP rank would carry an all-to-all group's last rank into the next group. Folded, the run is the
    unfolded one: cp 4 = [2, 2] and dp 2 on one node, 8 ranks simulated unfolded, 1 folded."""
    from emulator.run.folding import choose_fold
    from emulator.run.simulation import simulate

    text = ("name: x\ncluster: {nodes: 1, node: dgx-h100}\n"
            "model: {layers: 2, hidden: 512, heads: 8, seq_len: 1024, vocab: 512}\n"
            "training: {global_batch: 2, micro_batch: 1, attention: flash}\n"
            "parallel: {cp: 4, dp: 2, cp_comm_type: a2a+p2p, hierarchical_context_parallel_sizes: [2, 2]}\n")
    sc = load_scenario_text(text, "x.yaml")
    fold, _note = choose_fold(sc)
    assert fold is not None and fold.shape == (1, 2, 2, 2, 1) and fold.copies == 8
    folded = simulate(sc, record_links=False)
    unfolded = simulate(load_scenario_text(text.replace("name: x", "name: x\nsimulation: {fold: off}"), "x.yaml"),
                        record_links=False)
    assert folded.iteration_time_s == pytest.approx(unfolded.iteration_time_s, rel=1e-12)


# --- cp_comm_type all_gather (the K/V all-gathered, exposed; the Llama 3 paper's CP) ---

def test_all_gather_cp_gathers_kv_and_runs_two_query_chunks():
    L = shape("all_gather")
    fwd = Ly.attention_core_forward(L)
    # cp 2: this rank's K and V are 1024 tokens of 64 heads of 192 dims, 25 165 824 B; all-gathered (output)
    # 2 · 25 165 824 = 50 331 648 B
    assert [(st.name, st.collective, st.group, st.bytes) for st in fwd if isinstance(st, Ly.Comm)] == [
        ("attn.kv_ag", "all_gather", "cp", 50_331_648)]
    ks = Ly.kernels(fwd)
    # rank 0's query chunks of c = 512: chunk 0 against its own 512 keys (causal), chunk 3 against chunks 0-2 whole
    # (1536 keys) and its own (causal): 4·64·512²·96·½ = 3 221 225 472 twice and 4·64·512·1536·96 =
    # 19 327 352 832, 25 769 803 776 in all: the ring's two steps of 1024 × 1024, causal
    assert [(k.m, k.n, k.causal) for k in ks] == [(512, 512, True), (512, 1536, False), (512, 512, True)]
    assert [k.flops for k in ks] == [3_221_225_472, 19_327_352_832, 3_221_225_472]
    assert sum(k.flops for k in ks) == sum(k.flops for k in Ly.kernels(Ly.attention_core_forward(shape("p2p"))))
    bwd = Ly.attention_core_backward(L)
    # backward: K and V gathered again, the chunks' backward, dK and dV reduce-scattered (its input: 50 331 648)
    assert [(st.name, st.collective, st.bytes) for st in bwd if isinstance(st, Ly.Comm)] == [
        ("attn.kv_ag_bwd", "all_gather", 50_331_648), ("attn.dkv_rs", "reduce_scatter", 50_331_648)]
    assert all(st.overlap == 0 for st in fwd + bwd if isinstance(st, Ly.Comm))  # exposed, as TE says


def test_all_gather_cp_needs_an_even_share():
    text = ("name: x\ncluster: {nodes: 1, node: dgx-h100}\n"
            "model: {layers: 2, hidden: 512, heads: 8, seq_len: 1032, vocab: 512}\n"
            "training: {global_batch: 2, micro_batch: 1, attention: flash}\n"
            "parallel: {cp: 8, cp_comm_type: all_gather}\n")
    with pytest.raises(ScenarioError) as info:  # 1032 / 8 = 129 tokens a rank
        load_scenario_text(text, "x.yaml")
    assert "parallel.cp_comm_type" in str(info.value) and "129 tokens" in str(info.value)
    # 1024 / 8 = 128: runs, and folded (cp rotated: the all-gather's group maps onto itself) as unfolded
    from emulator.run.simulation import simulate
    ok = text.replace("1032", "1024")
    folded = simulate(load_scenario_text(ok, "x.yaml"), record_links=False)
    unfolded = simulate(load_scenario_text(ok.replace("name: x", "name: x\nsimulation: {fold: off}"), "x.yaml"),
                        record_links=False)
    assert folded.iteration_time_s == pytest.approx(unfolded.iteration_time_s, rel=1e-12)


def test_all_gather_cp_holds_the_gathered_kv_and_their_gradients_in_its_backward():
    """Transformer Engine's all-gather CP backward holds the whole sequence's K and V and its dK and dV (bf16)
    at once: hidden 512, 8 heads of 64 dims, 2 KV heads (GQA), 8192 tokens, cp 8, tp 1: 2 (gathered, gradients) ·
    8192 · 2 heads · (64 + 64) · 2 B = 8 388 608 B in the workspace, beside the p2p ring's."""
    from emulator.workload.memory import stage_memory

    text = ("name: x\ncluster: {nodes: 1, node: dgx-h100}\n"
            "model: {layers: 2, hidden: 512, heads: 8, kv_heads: 2, seq_len: 8192, vocab: 512}\n"
            "training: {global_batch: 1, micro_batch: 1, attention: flash}\n"
            "parallel: {cp: 8, dp: 1, cp_comm_type: TYPE}\n")
    ring, gather = (stage_memory(load_scenario_text(text.replace("TYPE", t), "x.yaml"))[0] for t in ("p2p", "all_gather"))
    assert gather.breakdown["workspace"] - ring.breakdown["workspace"] == 8_388_608
    assert gather.breakdown["activations"] == ring.breakdown["activations"]  # it saves the local K and V, as the ring
