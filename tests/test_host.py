"""The host's issuing (cluster.node.host_launch) and CUDA graphs (training.cuda_graph_impl, cuda_graph_modules):
what the host costs a step list, where the GPU waits for it, and Megatron-Core's capture rules."""
import pytest

from emulator.errors import ScenarioError
from emulator.outputs.summary import human_table, summarize
from emulator.run.simulation import simulate
from emulator.scenario import load_scenario_text
from emulator.workload import host as H
from emulator.workload.steps import Comm, Kernel

MS = 1e-3


def _k(name: str, kind: str = "elementwise") -> Kernel:
    return Kernel(name, kind, 0.0, 0.0, "fwd", seconds=1e-6 if kind == "host" else 0.0)


def test_a_step_is_a_launch_and_the_host_sync_splits_the_list():
    # router (2 kernels), the token-count all-gather, the sync, the dispatch and one expert GEMM: 3 launches before
    # the sync, 2 after, at 10 us: 30 us and 20 us
    steps = [_k("moe.router"), _k("moe.router.topk"), Comm("moe.token_counts", "ep", "all_gather", 64.0, 0, "fwd"),
             _k("moe.host_sync", "host"), Comm("moe.dispatch", "ep", "all_to_all", 1e6, 1, "fwd"), _k("moe.up", "gemm")]
    got = H.issue_time(steps, 10e-6, frozenset(), moe_layer=True)
    assert got == H.Issue(pytest.approx(30e-6), pytest.approx(20e-6), True)
    # with the router and the preprocess captured, the three before the sync are one replay: 10 us
    captured = H.captured_modules("transformer_engine", ("attn", "moe_router", "moe_preprocess"))
    assert H.issue_time(steps, 10e-6, captured, moe_layer=True).before == pytest.approx(10e-6)
    assert H.issue_time(steps, 0.0, frozenset(), moe_layer=True) == H.Issue(0.0, 0.0, False)  # no host modelled


def test_steps_belong_to_megatron_cores_modules():
    assert [H.module_of(n, False) for n in ("ln1", "qkv.dgrad", "attn.flash_bwd", "bda1_bwd", "ln2_residual_grad",
                                            "mlp.up.wgrad", "bda2", "lm_head", "embed.lookup")] == \
        ["attn", "attn", "attn", "attn", "mlp", "mlp", "mlp", None, None]
    assert [H.module_of(n, True) for n in ("ln2", "moe.router.topk", "moe.aux.loss_mul", "shared.up",
                                           "moe.permute.map1", "moe.token_counts", "moe.sort_chunks", "swiglu",
                                           "bda2")] == \
        ["moe_router", "moe_router", "moe_router", "moe_router", "moe_preprocess", "moe_preprocess", "moe", "moe",
         "moe"]
    # shared experts that overlap the dispatch run beside the all-to-all, outside the router's graph
    assert H.module_of("shared.up", True, shared_overlap=True) == "moe" == H.module_of("shared_bwd.rs", True, True)
    # a hybrid model's Mamba layer is its own module; squared ReLU is the MLP's (Nemotron) or the experts'
    assert [H.module_of(n, False) for n in ("mamba.ln", "mamba.ssd_bwd", "mamba.out_proj.rs", "squared_relu_bwd")] \
        == ["mamba", "mamba", "mamba", "mlp"]
    assert H.module_of("squared_relu", True) == "moe"
    # an empty list is the whole layer; local takes the router and the preprocess together; moe holds both
    assert H.captured_modules("transformer_engine", ()) == {"attn", "mlp", "moe", "moe_router", "moe_preprocess",
                                                            "mamba"}
    assert H.captured_modules("local", ("moe_router",)) == {"moe_router", "moe_preprocess"}
    assert H.captured_modules("none", ("attn",)) == frozenset() == H.captured_modules("full_iteration", ())


# One GPU, one small layer, the host at 1 ms a launch: every list is issued far slower than it runs. The lists
# (layer.py): embedding forward 3 (lookup, pos_add, dropout), layer forward 11 (ln1, qkv, attn.flash, ctx_copy, proj,
# bda1, ln2, mlp.up, gelu, mlp.down, bda2), head forward 3 (final_norm, lm_head, loss), head backward 4, layer
# backward 18 (8 of the MLP's, 10 of the attention's), embedding backward 2: 41 launches.
TINY = ("name: host\ncluster: {nodes: 1, node: {preset: dgx-h100, gpus_per_node: 1, host_launch: 1 ms}}\n"
        "model: {layers: 1, hidden: 256, heads: 4, ffn_hidden: 1024, seq_len: 128, vocab: 1024}\n"
        "training: {global_batch: 1, micro_batch: 1, attention: flash}\n"
        "parallel: {tp: 1, pp: 1, dp: 1}\n")


def _run(*sets: str):
    r = simulate(load_scenario_text(TINY, "host.yaml", list(sets)), record_links=False)
    opt = [s for s in r.spans if s.name == "optimizer"]
    busy = sum(s.end_s - s.start_s for s in r.spans if s.stream == "compute" and s.name != "optimizer")
    return r, opt[0].end_s - opt[0].start_s, busy


@pytest.mark.parametrize("sets, launches", [
    ((), 41),
    # the whole layer in one graph a pass: 3 + 1 + 3 + 4 + 1 + 2 = 14
    (("training.cuda_graph_impl=transformer_engine",), 14),
    # the attention alone: forward 1 + 5 (ln2 .. bda2), backward 8 + 1; 3 + 6 + 3 + 4 + 9 + 2 = 27
    (("training.cuda_graph_impl=local", "training.cuda_graph_modules=[attn]"), 27),
])
def test_a_host_bound_step_is_the_hosts_launches_then_the_optimizer(sets, launches):
    r, t_opt, busy = _run(*sets)
    # each list starts once the host has issued the one before it; the optimizer once it has issued the last:
    # T = launches · 1 ms + the optimizer's own time
    assert r.iteration_time_s == pytest.approx(launches * MS + t_opt, rel=1e-9)
    out = summarize(r)
    host = out["host"]
    # the host issues without a break from 0: launches · 1 ms; the GPU waited for it all that time but while it ran
    # the lists (busy)
    assert host["issue_s"] == pytest.approx(launches * MS, rel=1e-9)
    assert host["gpu_waits_s"] == pytest.approx(launches * MS - busy, rel=1e-9)
    assert "host launches" in human_table(out)


def test_no_host_and_a_whole_iteration_graph_leave_the_gpu_alone():
    plain, _t, _b = _run("cluster.node.host_launch=0 us")
    graph, _t2, _b2 = _run("training.cuda_graph_impl=full_iteration")
    assert graph.iteration_time_s == plain.iteration_time_s < 5 * MS
    assert not [s for s in graph.spans if s.stream == "cpu"]


def test_a_gpu_bound_step_is_byte_identical_without_host_ops():
    # 11.3 us a launch against a layer of 4096 tokens: every list runs longer than it takes to issue, no cpu op
    big = TINY.replace("host_launch: 1 ms", "host_launch: 11.3 us").replace("hidden: 256", "hidden: 2048") \
        .replace("seq_len: 128", "seq_len: 4096").replace("ffn_hidden: 1024", "ffn_hidden: 8192") \
        .replace("heads: 4", "heads: 16")
    on = simulate(load_scenario_text(big, "h.yaml"), record_links=False)
    off = simulate(load_scenario_text(big, "h.yaml", ["cluster.node.host_launch=0 us"]), record_links=False)
    assert on.iteration_time_s == off.iteration_time_s
    assert not [s for s in on.spans if s.stream == "cpu"]


MOE = ("name: g\ncluster: {nodes: 1, node: dgx-h100}\n"
       "model: {layers: 2, hidden: 1024, heads: 8, ffn_hidden: 4096, seq_len: 1024, vocab: 1024, experts: 8, top_k: 2, "
       "first_dense_layers: 1}\n"
       "training: {global_batch: 8, micro_batch: 1}\n"
       "parallel: {tp: 1, pp: 1, dp: 8, ep: 8}\n")


@pytest.mark.parametrize("sets, key, words", [
    (("training.cuda_graph_modules=[attn]",), "training.cuda_graph_modules", "cuda_graph_impl local or"),
    (("training.cuda_graph_impl=full_iteration", "training.cuda_graph_modules=[attn]"),
     "training.cuda_graph_modules", "must be empty"),
    (("training.cuda_graph_impl=local", "training.cuda_graph_modules=[moe,moe_router]"),
     "training.cuda_graph_modules", "both moe and moe_router"),
    (("training.cuda_graph_impl=transformer_engine", "training.cuda_graph_modules=[moe_preprocess]"),
     "training.cuda_graph_modules", "only with moe_router"),
    (("training.cuda_graph_impl=transformer_engine",), "training.cuda_graph_modules", "cannot be captured whole"),
    (("training.cuda_graph_impl=full_iteration",), "training.cuda_graph_impl", "per layer instead"),
    (("training.cuda_graph_impl=local", "training.cuda_graph_modules=[attn]", "training.recompute=full"),
     "training.recompute", "full_iteration"),
])
def test_megatron_cores_capture_rules_refuse_by_key(sets, key, words):
    with pytest.raises(ScenarioError) as e:
        load_scenario_text(MOE, "g.yaml", list(sets))
    assert e.value.key == key and words in str(e.value)


def test_the_router_and_preprocess_graphs_of_a_dropless_moe_are_accepted():
    sc = load_scenario_text(MOE, "g.yaml", ["training.cuda_graph_impl=transformer_engine",
                                            "training.cuda_graph_modules=[attn,moe_router,moe_preprocess]"])
    assert sc.training.cuda_graph_modules == ("attn", "moe_router", "moe_preprocess")
    with pytest.raises(ScenarioError, match="needs an MoE model"):
        load_scenario_text(TINY, "h.yaml", ["training.cuda_graph_impl=local", "training.cuda_graph_modules=[moe]"])


@pytest.mark.parametrize("sets, launches", [((), 41), (("training.cuda_graph_impl=transformer_engine",), 14)])
def test_the_closed_form_takes_a_pass_at_least_as_long_as_its_issuing(sets, launches):
    from emulator.studies.rank import estimate_iteration

    # one micro-batch, one stage: its passes, each the host's launches (the kernels run in microseconds): 41 ms,
    # or 14 with the layer graphed (as the run above)
    est = estimate_iteration(load_scenario_text(TINY, "host.yaml", list(sets)))
    assert est.compute_s == pytest.approx(launches * MS, rel=1e-12)


def test_one_f_one_b_stops_the_host_at_each_pipeline_exchange():
    # pp 2, 1F1B, 4 micro-batches, host-bound: Megatron-Core synchronises the device after each batched send and
    # receive (batch_p2p_sync). Stage 0 runs F0 F1 B0 F2 B1 F3 B2 B3: a stop before F1 (F0's send), B0 (its receive
    # and F1's send), B1, B2 (receive and the forward's send before) and B3 (receive): 5. Stage 1 runs F0 B0 F1 B1
    # F2 B2 F3 B3: a stop before each forward (its receive, and from F1 on the backward's send before): 4. 9 in all
    text = TINY.replace("layers: 1,", "layers: 2,").replace("gpus_per_node: 1", "gpus_per_node: 2") \
        .replace("global_batch: 1,", "global_batch: 4,").replace("pp: 1", "pp: 2")
    r = simulate(load_scenario_text(text, "pp.yaml"), record_links=False)
    stops = [s for s in r.spans if s.name.endswith("host.p2p_sync")]
    assert len(stops) == 9 and all(s.end_s == s.start_s for s in stops)
    # each stop waits for its receive: a backward's on stage 0, a forward's on stage 1
    recvs = {(s.rank, s.microbatch): s.end_s for s in r.spans if s.kind == "recv"}
    waiting = [s for s in stops if (".bwd." in s.name) == (s.rank == 0)]  # stage 0's backwards, stage 1's forwards
    assert len(waiting) == 8 and all(s.start_s >= recvs[(s.rank, s.microbatch)] for s in waiting)
    # 1F1B without the host modelled has no stop
    plain = simulate(load_scenario_text(text, "pp.yaml", ["cluster.node.host_launch=0 us"]), record_links=False)
    assert not [s for s in plain.spans if s.stream == "cpu"] and plain.iteration_time_s < r.iteration_time_s


def test_a_job_waiting_for_its_start_is_not_the_hosts_issuing():
    # two copies of the one-GPU job above, the second starting 100 ms later: each host issues 41 ms (41 launches
    # at 1 ms), the second's wait for its start (a cpu span too) is not issuing: the mean is 41 ms
    job = ("{name: %s, nodes: 1, start: %s, model: {layers: 1, hidden: 256, heads: 4, ffn_hidden: 1024, seq_len: 128, "
           "vocab: 1024}, training: {global_batch: 1, micro_batch: 1, attention: flash}, parallel: {tp: 1}}")
    text = ("name: two\ncluster: {nodes: 2, node: {preset: dgx-h100, gpus_per_node: 1, host_launch: 1 ms}}\n"
            f"jobs:\n  - {job % ('a', '0 ms')}\n  - {job % ('b', '100 ms')}\n")
    r = simulate(load_scenario_text(text, "two.yaml"), record_links=False)
    assert [s.name for s in r.spans if s.stream == "cpu" and s.category != "host"] == ["waiting for job start"]
    assert summarize(r)["host"]["issue_s"] == pytest.approx(41 * MS, rel=1e-9)
