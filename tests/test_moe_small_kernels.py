"""What a small-expert MoE layer costs beyond its grouped GEMMs: the router's softmax, top-k, routing-map and
aux-loss kernels, the alltoall dispatcher's counts, Transformer Engine's row-id map and chunk sort (token_dispatch.py,
"the router's and the permutation's small kernels"), the token copies at the measured copy bandwidth, and an
NCCL all-to-all's latency per peer (network/collectives.py ALLTOALL_PEER_S)."""
import pytest

from emulator.devices import compute
from emulator.scenario import GpuSpec, ModelSpec, load_scenario_text
from emulator.tools.collective_bench import collective_table
from emulator.workload import kernel_cost as KC
from emulator.workload import layer as Ly

# One MoE layer: h 1024, 16 experts of width 512, top-2, s 512, micro-batch 1 (T = 512 tokens), bf16, with TE's
# fused permutation (model.moe_permute_fusion; test_unfused_permutation has Megatron's default, off).
MOE = ModelSpec(layers=2, hidden=1024, heads=8, seq_len=512, vocab=1000, ffn_hidden=2048, swiglu=True,
                experts=16, top_k=2, expert_ffn_hidden=512, moe_permute_fusion=True)
# A GPU of round figures: 1 TB/s HBM at the model's E_MEM 0.9, 4 us a launch.
GPU = GpuSpec("round", 1e15, 1e12, 80 * 2**30, 4e-6)

ROUTING = ["moe.router.topk", "moe.router.softmax", "moe.router.probs_cast", "moe.router.probs_zeros",
           "moe.router.probs_scatter", "moe.router.map_zeros", "moe.router.map_int", "moe.router.map_scatter",
           "moe.router.map_bool"]
AUX = ["moe.aux.softmax", "moe.aux.topk", "moe.aux.map_zeros", "moe.aux.map_int", "moe.aux.map_scatter",
       "moe.aux.map_bool", "moe.aux.tokens_per_expert", "moe.aux.probs_sum", "moe.aux.loss_mul", "moe.aux.loss_sum",
       "moe.aux.loss_scale", "moe.aux.log_div", "moe.aux.log_add"]
COUNTS = ["moe.counts", "moe.counts.splits", "moe.counts.local", "moe.counts.per_rank", "moe.counts.per_tp",
          "moe.counts.per_expert"]


def _moe_part(steps):
    return [st for st in steps if st.name.startswith("moe.")]


def test_forward_kernels_of_one_moe_layer_in_megatron_order():
    # EP 4 (4 local experts), TP 1, the alltoall dispatcher: the router GEMM, 9 routing kernels (bf16 logits:
    # the probabilities' cast back is one), 13 of the aux loss (no TP: no all-reduce), 6 counts, TE's 3
    # row-id-map passes, the permute; then the counts' all-gather, the host sync and the dispatch; the chunk
    # sort (map and copy), the experts, the unsort (map and copy), the combine and the unpermute
    L = Ly.layer_shape(MOE, 1, ep=4, flash=True)
    names = [st.name for st in _moe_part(Ly.forward_steps(L))]
    assert names == ["moe.router", *ROUTING, *AUX, *COUNTS, "moe.permute.map1", "moe.permute.map2",
                     "moe.permute.map3", "moe.permute", "moe.token_counts", "moe.host_sync", "moe.dispatch",
                     "moe.sort_chunks_map", "moe.sort_chunks", "moe.up", "moe.down", "moe.unsort_chunks_map",
                     "moe.unsort_chunks", "moe.combine", "moe.unpermute"]
    # 9 + 13 + 6 + 3 + 2 = 33 small kernels and 4 token copies beside the router GEMM and the experts' GEMMs
    kinds = [st.kind for st in _moe_part(Ly.forward_steps(L)) if isinstance(st, Ly.Kernel)]
    assert (kinds.count("elementwise"), kinds.count("copy")) == (33, 4)


def test_fp32_router_and_group_limited_routing_and_tp():
    # moe_router_dtype fp32: the probabilities are already the logits' dtype, no cast; group-limited routing:
    # ten kernels for the one topk; TP 2: the aux loss all-reduces the 16 tokens-per-expert int64 (128 B)
    m = ModelSpec(**{**MOE.__dict__, "moe_router_dtype": "fp32", "moe_router_num_groups": 4,
                     "moe_router_group_topk": 2})
    L = Ly.layer_shape(m, 1, t=2, ep=4, flash=True)
    steps = _moe_part(Ly.forward_steps(L))
    names = [st.name for st in steps]
    assert "moe.router.probs_cast" not in names
    assert names.count("moe.router.topk") == 1 and names.count("moe.router.group_topk") == 1
    route = names[names.index("moe.router") + 1:names.index("moe.aux.softmax")]
    assert len(route) == 8 - 1 + 10  # 8 kernels without the cast, the topk replaced by 10
    (aux,) = [st for st in steps if st.name == "moe.aux_counts"]
    assert (aux.group, aux.collective, aux.bytes) == ("tp", "all_reduce", 16 * 8)


def test_no_chunk_sort_with_one_local_expert_or_without_ep():
    # EP 16 of 16 experts: one local expert, nothing to sort; EP 1: no dispatch, only routing_map.sum counts
    for ep, counts in ((16, 6), (1, 1)):
        L = Ly.layer_shape(MOE, 1, ep=ep, flash=True)
        names = [st.name for st in Ly.forward_steps(L) + Ly.backward_steps(L)]
        assert not [n for n in names if "sort_chunks" in n]
        assert len([n for n in names if n.startswith("moe.counts")]) == counts


def test_backward_kernels_of_one_moe_layer():
    # the unpermute's gradient, the combine's, the unsort's gradient (a copy), the experts' GEMMs, the sort's
    # gradient, the dispatch's, the permute's gradient; the aux loss's 7 and the routing's 5 (with the
    # cast) gradient kernels, then the router GEMM's dgrad and wgrad
    L = Ly.layer_shape(MOE, 1, ep=4, flash=True)
    names = [st.name for st in _moe_part(Ly.backward_steps(L))]
    assert names == ["moe.unpermute_bwd", "moe.combine_bwd", "moe.unsort_chunks_bwd", "moe.down.dgrad",
                     "moe.down.wgrad", "moe.up.dgrad", "moe.up.wgrad", "moe.sort_chunks_bwd", "moe.dispatch_bwd",
                     "moe.permute_bwd", "moe.aux.scaler_bwd", "moe.aux.scale_bwd", "moe.aux.loss_scale_bwd",
                     "moe.aux.loss_mul_bwd", "moe.aux.grad_contiguous", "moe.aux.softmax_bwd",
                     "moe.router.probs_gather_bwd", "moe.router.probs_cast_bwd", "moe.router.softmax_bwd",
                     "moe.router.topk_zeros_bwd", "moe.router.topk_scatter_bwd", "moe.router.grad_add",
                     "moe.router.dgrad", "moe.router.wgrad"]


def test_routing_kernels_time_by_hand():
    # N = 512 tokens, E = 16, k = 2, bf16 logits (r = 2): N·E = 8192, N·k = 1024. Bytes:
    #   topk 8192·2 + 1024·(2 + 8) = 26 624; softmax 1024·(2 + 4) = 6144; cast 6144; probs zeros 8192·2 = 16 384;
    #   probs scatter 2·8192·2 + 1024·(8 + 2) = 43 008; map zeros 16 384; int 8192·6 = 49 152;
    #   scatter 2·8192·4 + 1024·8 = 73 728; bool 8192·5 = 40 960: 278 528 B in all
    # 9 launches of 4 us + 278 528 B / (1 TB/s · 0.9) = 36 + 0.309 us
    L = Ly.layer_shape(MOE, 1, ep=4, flash=True)
    kernels = {st.name: st for st in Ly.forward_steps(L) if isinstance(st, Ly.Kernel)}
    assert sum(kernels[n].bytes for n in ROUTING) == 278_528
    t = sum(KC.kernel_time(kernels[n], GPU) for n in ROUTING)
    assert t == pytest.approx(9 * 4e-6 + 278_528 / 0.9e12, rel=1e-12)


def test_token_copies_at_the_measured_copy_bandwidth():
    # h200/elementwise.csv copy_bf16 [16384, 4096]: 3570 GB/s of 4800, 0.744
    assert compute.COPY_MEM_EFFICIENCY == pytest.approx(0.74375)
    L = Ly.layer_shape(MOE, 1, ep=4, flash=True)
    k = {st.name: st for st in Ly.forward_steps(L) if isinstance(st, Ly.Kernel)}
    # permute (TE's _permute_kernel): the 512 tokens read once, their 512·2 = 1024 copies written, × 1024 × 2 B:
    # (512 + 1024) · 2048 = 3 145 728 B at 0.744 TB/s + 4 us; the unpermute the same the other way
    assert k["moe.permute"].bytes == 3_145_728 == k["moe.unpermute"].bytes
    assert KC.kernel_time(k["moe.permute"], GPU) == pytest.approx(3_145_728 / 0.74375e12 + 4e-6, rel=1e-12)
    # chunk sort: the 4 local experts' 4·256 = 1024 received tokens with their fp32 probabilities,
    # 1024·(2048 + 4)·2 = 4 202 496 B: 5.650 + 4 us
    assert k["moe.sort_chunks"].bytes == 4_202_496
    assert KC.kernel_time(k["moe.sort_chunks"], GPU) == pytest.approx(4_202_496 / 0.74375e12 + 4e-6, rel=1e-12)


def test_unfused_permutation():
    """Megatron-Core's default, moe_permute_fusion off (moe_utils.py ``permute``/``unpermute`` with fused=False):
    N = 512 tokens, E = 16, R = N·k = 1024 routed copies, h 1024, bf16.
    - before the permute's copy, for TE's three row-id-map passes: the map's transpose 2·N·E = 16 384 B, its
      argsort 27·N·E = 221 184 B, the indices' modulo 2·8·R = 16 384 B, the probabilities' transpose
      2·4·N·E = 65 536 B and their gather R·(8 + 2·4) = 16 384 B;
    - the unpermute: a zeroed N×h output (512·1024·2 = 1 048 576 B) and the scatter_add of the copies,
      R·h·2 + 2·N·h·2 + 8·R = 2 097 152 + 2 097 152 + 8192 = 4 202 496 B (the fused kernel: (R + N)·h·2 =
      3 145 728); the permute's copy is index_select's, a row read per copy: 2·R·h·2 = 4 194 304 B;
    - backward the permute's gradient the same pair (index_select's backward: zeros and index_add_), the
      unpermute's a gather of a row per copy (2·R·h·2)."""
    from dataclasses import replace

    L = Ly.layer_shape(replace(MOE, moe_permute_fusion=False), 1, ep=4, flash=True)
    fwd = {st.name: st for st in Ly.forward_steps(L) if isinstance(st, Ly.Kernel)}
    assert "moe.permute.map1" not in fwd
    assert [fwd[n].bytes for n in ("moe.permute.map_t", "moe.permute.argsort", "moe.permute.index",
                                   "moe.permute.probs_t", "moe.permute.probs")] == [16_384, 221_184, 16_384, 65_536,
                                                                                   16_384]
    assert fwd["moe.permute"].bytes == 4_194_304  # index_select: the copy the fused kernel makes
    assert (fwd["moe.unpermute.zeros"].bytes, fwd["moe.unpermute"].bytes) == (1_048_576, 4_202_496)
    bwd = {st.name: st for st in Ly.backward_steps(L) if isinstance(st, Ly.Kernel)}
    assert (bwd["moe.permute_bwd.zeros"].bytes, bwd["moe.permute_bwd"].bytes) == (1_048_576, 4_202_496)
    assert bwd["moe.unpermute_bwd"].bytes == 4_194_304
    # on the round GPU: the unpermute's two kernels, 2 launches + 1 048 576 B at 0.9 TB/s + 4 202 496 B at the
    # copy's 0.744 TB/s, against the fused kernel's 1 launch + 3 145 728 B at 0.744 TB/s
    unfused = KC.kernel_time(fwd["moe.unpermute.zeros"], GPU) + KC.kernel_time(fwd["moe.unpermute"], GPU)
    assert unfused == pytest.approx(8e-6 + 1_048_576 / 0.9e12 + 4_202_496 / 0.74375e12, rel=1e-12)


def test_small_all_to_all_pays_per_peer():
    # One DGX H100, all-to-all of S = 256 KiB over 8 GPUs: launch 6.05 us, one step α = 2·0.15 + 1.675 =
    # 1.975 us, 6 more peers at (28.20 − 11.75)/24 = 0.685 us (NCCL's baseline, 8 and 32 GB200), and 7/8 of
    # S over each GPU's 370 GB/s port: 6.05 + 1.975 + 4.112 + 0.620 = 12.76 us (8.65 us without the peers)
    sc = load_scenario_text("name: t\ncluster: {nodes: 1, node: dgx-h100}\n", "t.yaml")
    (row,) = collective_table(sc, "all_to_all", [262_144])
    peer = (28.20e-6 - 11.75e-6) / 24
    assert row["time_s"] == pytest.approx(6.05e-6 + 1.975e-6 + 6 * peer + 7 / 8 * 262_144 / 370e9, rel=1e-9)


def test_an_fp32_router_runs_its_forward_at_the_bf16_rate_and_its_backward_in_fp32():
    # moe_router_dtype fp32 through TE's general_gemm (Megatron-Core RouterGatingLinearFunction): forward on the
    # bf16 input (512 × 1024) and weight (1024 × 16), fp32 logits (512 × 16): (524 288 + 16 384)·2 + 8192·4
    # = 1 114 112 B at the bf16 rate (the kernel's dtype 2); backward both GEMMs on fp32 copies (dtype 4), the
    # weight cast before them (1024·16·(2 + 4) = 98 304 B), the dgrad cast back and the saved input's cast to
    # fp32 (512·1024·6 = 3 145 728 B each)
    m = ModelSpec(**{**MOE.__dict__, "moe_router_dtype": "fp32"})
    L = Ly.layer_shape(m, 1, ep=4, flash=True)
    (router,) = [k for k in Ly.kernels(Ly.forward_steps(L)) if k.name == "moe.router"]
    assert (router.dtype, router.bytes) == (2, 1_114_112)
    back = [k for k in Ly.kernels(Ly.backward_steps(L)) if k.name.startswith(("moe.router.dgrad", "moe.router.wgrad",
                                                                                "moe.router.weight_cast",
                                                                                "moe.router.input_cast"))]
    assert [(k.name, k.bytes if "cast" in k.name else k.dtype) for k in back] == [
        ("moe.router.weight_cast_bwd", 98_304), ("moe.router.dgrad", 4), ("moe.router.dgrad_cast_bwd", 3_145_728),
        ("moe.router.input_cast_bwd", 3_145_728), ("moe.router.wgrad", 4)]


def test_router_fusion_runs_the_routing_and_the_aux_loss_as_te_kernels():
    # moe_router_fusion: TE's fused_topk_with_score_function, fused_compute_score_for_moe_aux_loss and
    # fused_moe_aux_loss, one kernel each way. N 512 tokens × E 16 experts = 8192 logits in bf16 (2 B):
    # the fused top-k reads them and writes the probabilities (2 B) and the bool map (1 B): 8192·5 = 40 960 B;
    # the aux scores read them and write fp32 scores and the map: 8192·(2 + 4 + 1) = 57 344 B
    m = ModelSpec(**{**MOE.__dict__, "moe_router_fusion": True})
    L = Ly.layer_shape(m, 1, ep=4, flash=True)
    fwd = _moe_part(Ly.forward_steps(L))
    names = [st.name for st in fwd]
    route = names[names.index("moe.router") + 1:names.index("moe.counts")]
    assert route == ["moe.router.fused_topk", "moe.aux.fused_scores", "moe.aux.tokens_per_expert",
                     "moe.aux.fused_loss", "moe.aux.log_div", "moe.aux.log_add"]
    size = {st.name: st.bytes for st in fwd}
    assert (size["moe.router.fused_topk"], size["moe.aux.fused_scores"]) == (40_960, 57_344)
    bwd = [st.name for st in Ly.backward_steps(L) if st.name.startswith(("moe.aux", "moe.router."))]
    assert bwd == ["moe.aux.scaler_bwd", "moe.aux.scale_bwd", "moe.aux.fused_loss_bwd", "moe.aux.fused_scores_bwd",
                   "moe.router.fused_topk_bwd", "moe.router.grad_add", "moe.router.dgrad", "moe.router.wgrad"]
    # 9 + 13 = 22 small kernels forward and 12 backward unfused, 6 and 6 fused
    plain = Ly.layer_shape(MOE, 1, ep=4, flash=True)
    count = [len([n for n in (st.name for st in steps) if n.startswith(("moe.aux", "moe.router."))])
             for steps in (Ly.forward_steps(plain), Ly.backward_steps(plain), Ly.forward_steps(L))]
    assert count == [22, 14, 6]  # backward unfused: 12 small and the router GEMM's dgrad and wgrad


def test_hybridep_permutes_in_its_dispatch_with_the_fusion_key():
    """model.moe_permute_fusion_into_hybridep with the flex dispatcher's hybridep backend: hybrid_ep_dispatch and
    hybrid_ep_combine (fused=True) write and read the experts' order themselves: no row-id map, permute or
    unpermute kernels, forward or backward. DeepEP (the key is HybridEP's) keeps them."""
    from dataclasses import replace

    from emulator.scenario import ParallelSpec

    def names(backend: str, into: bool) -> set[str]:
        par = ParallelSpec(dp=4, ep=4, moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend=backend)
        L = Ly.layer_shape(replace(MOE, moe_permute_fusion_into_hybridep=into), 1, ep=4, flash=True, parallel=par)
        return {st.name for st in Ly.forward_steps(L) + Ly.backward_steps(L)}

    permutes = {"moe.permute.map1", "moe.permute", "moe.unpermute", "moe.permute_bwd", "moe.unpermute_bwd"}
    assert permutes <= names("hybridep", False)
    assert not permutes & names("hybridep", True)
    assert permutes <= names("deepep", True)


@pytest.mark.parametrize("ep, pad, syncs, count_exchanges", [
    (4, False, 1, 1),  # EP: the counts' all-gather, then the sync before the all-to-all ("before_ep_alltoall")
    (1, False, 1, 0),  # no EP: no all-gather, but the counts still go to the host for the grouped GEMM ("before_finish")
    (4, True, 0, 0),  # drop and pad: every split is the capacity, known ahead (preprocess returns early)
    (1, True, 0, 0),
])
def test_where_the_alltoall_dispatcher_syncs_with_the_host(ep, pad, syncs, count_exchanges):
    import dataclasses

    m = dataclasses.replace(MOE, moe_expert_capacity_factor=1.0 if pad else None,
                            moe_pad_expert_input_to_capacity=pad)
    steps = Ly.forward_steps(Ly.layer_shape(m, 1, ep=ep, flash=True))
    names = [st.name for st in steps]
    assert names.count("moe.host_sync") == syncs and names.count("moe.token_counts") == count_exchanges
    # under drop and pad the counts are one fill of the E received counts, not the six kernels of the sums
    assert [n for n in names if n.startswith("moe.counts")] == (["moe.counts"] if pad or ep == 1 else COUNTS)


def test_token_dropping_syncs_before_the_permutation():
    # Megatron-Core's preprocess with a capacity factor and no padding (or router padding): the output's size is
    # dynamic, so the counts' all-gather and the host sync come before the first permutation ("before_permutation_1"),
    # not before the all-to-all; without EP the sync alone, and no "before_finish" sync after
    from dataclasses import replace

    L = Ly.layer_shape(replace(MOE, moe_expert_capacity_factor=1.25), 1, ep=4, flash=True)
    assert L.early_sync
    names = [st.name for st in _moe_part(Ly.forward_steps(L))]
    assert names[names.index("moe.counts.per_expert") + 1:names.index("moe.dispatch") + 1] == [
        "moe.token_counts", "moe.host_sync", "moe.permute.map1", "moe.permute.map2", "moe.permute.map3",
        "moe.permute", "moe.dispatch"]
    one = [st.name for st in _moe_part(Ly.forward_steps(Ly.layer_shape(replace(MOE, moe_expert_capacity_factor=1.25),
                                                                      1, ep=1, flash=True)))]
    assert one.count("moe.host_sync") == 1 and one.index("moe.host_sync") < one.index("moe.permute")
    assert "moe.token_counts" not in one
    # padded to capacity: no exchange and no sync at all
    pad = Ly.layer_shape(replace(MOE, moe_expert_capacity_factor=1.25, moe_pad_expert_input_to_capacity=True), 1,
                         ep=4, flash=True)
    assert not pad.early_sync and "moe.host_sync" not in [st.name for st in Ly.forward_steps(pad)]
