"""MoE token dispatch and routing: binomial force balance, DeepEP's dispatch time, the dispatchers differ."""
import json

import pytest

from emulator.network.collectives import CollectiveModel
from emulator.network.fabric import alone
from emulator.network.raw_plan import StepCosts
from emulator.network.routing import Router
from emulator.network.topology import build_topology
from emulator.scenario import load_scenario_text
from emulator.scenario.spec import ModelSpec, ParallelSpec
from emulator.workload import layer as Ly
from emulator.workload.routing import binomial_max_mean, capped_load, force_balance_load


def test_binomial_max_of_two():
    # X1, X2 iid Binomial(2, 1/2): F(0) = 1/4, F(1) = 3/4; E[max] = Σ_{x=0}^{1} (1 − F(x)²)
    # = (1 − 1/16) + (1 − 9/16) = 22/16 = 1.375
    assert binomial_max_mean(2, 0.5, 2) == pytest.approx(1.375, rel=1e-12)


def test_force_balance_busiest_rank_is_the_binomial_maximum():
    # 4 tokens, top-1, 4 experts on 2 EP ranks: each rank's count ~ Binomial(4, 1/2), F(0..3) = 1/16, 5/16,
    # 11/16, 15/16; E[max of 2] = 4 − (1 + 25 + 121 + 225)/256 = 4 − 372/256 = 2.546875; mean 2:
    # the busiest rank carries 2.546875/2 = 1.2734375 times the mean, not moe_imbalance 1
    assert force_balance_load(4, 1, 4, 2) == pytest.approx(1.2734375, rel=1e-12)
    # a bigger step evens it out: 4096 tokens x top-8 over 64 ranks of 4 experts stays above the mean
    big = force_balance_load(4096 * 64, 8, 256, 64)
    assert 1.0 < big < 1.02


def test_capacity_caps_or_pads_the_load():
    m = ModelSpec(experts=8, top_k=2, moe_expert_capacity_factor=1.25)
    assert capped_load(1.6, m) == 1.25  # dropped down to capacity
    assert capped_load(1.1, m) == 1.1  # under capacity: as routed
    pad = ModelSpec(experts=8, top_k=2, moe_expert_capacity_factor=1.25, moe_pad_expert_input_to_capacity=True)
    assert capped_load(1.1, pad) == 1.25  # padded: every expert runs its capacity


def test_one_layer_deepep_dispatch_time():
    # One MoE layer's DeepEP dispatch on 2 DGX H100 (EP 16, one switch): 16 experts, one per GPU, top-2,
    # 4096 tokens of hidden 7168 in bf16 per rank: S = 4096 · 7168 · 2 = 58,720,256 B.
    # P(a token uses a GPU) = 1 − C(15,2)/C(16,2) = 1 − 105/120 = 1/8; P(it uses a node of 8 experts) =
    # 1 − C(8,2)/C(16,2) = 1 − 28/120 = 92/120. DeepEP fractions: NVLink 153/160, RDMA (EP 16) 43/50.
    # Each GPU's flow: RDMA to its counterpart 92/120 · 50/43 = 0.891473 per byte of S over its NIC port
    # (47 GB/s); NVLink 7 · (1/8)/(153/160) = 140/153 out of its own port, and the same again forwarding for
    # its counterpart: 280/153 = 1.830 per byte on a 370 GB/s port (NVLink is not the bottleneck:
    # 370e9 · 153/280 = 202 GB/s > 47e9/0.891473 = 52.72 GB/s). So r = 47e9 · 43 · 120/(50 · 92) B/s and
    # t = S/r + α, α = the forwarded leg's 1 us (GPU→NIC→switch→NIC→GPU) + 0.3 us (NVLink).
    model = ModelSpec(layers=2, hidden=7168, heads=56, seq_len=4096, vocab=1000, experts=16, top_k=2, swiglu=True,
                      expert_ffn_hidden=2048)
    L = Ly.layer_shape(model, 1, ep=16, parallel=ParallelSpec(moe_token_dispatcher_type="flex"), sm_count=132)
    dispatch = next(st for st in Ly.forward_steps(L) if isinstance(st, Ly.Comm) and st.name == "moe.dispatch")
    assert dispatch.bytes == 4096 * 7168 * 2
    sc = load_scenario_text("name: f\ncluster: {nodes: 2, node: dgx-h100}\n", "f.yaml")
    topo = build_topology(sc.cluster)
    cm = CollectiveModel(Router(topo), topo.node_of, StepCosts())
    plan = cm.collective(dispatch.collective, tuple(range(16)))
    rate = 47e9 * 43 * 120 / (50 * 92)
    expected = 58720256 / rate + 1.3e-6
    assert alone(plan, dispatch.bytes, topo.capacity).duration == pytest.approx(expected, rel=1e-9)


def test_force_balance_excludes_a_given_imbalance(tmp_path):
    from emulator.cli import main

    path = tmp_path / "s.yaml"
    path.write_text("name: s\ncluster: {nodes: 2, node: dgx-h100}\nmodel: {preset: deepseek-v2-lite, "
                    "moe_imbalance: 1.2, moe_router_force_load_balancing: true}\ntraining: {global_batch: 16}\n"
                    "parallel: {dp: 16, ep: 8}\n")
    assert main(["run", str(path)]) == 2


def test_deepep_and_alltoall_differ_on_the_qwen3_layout(capsys):
    # the Qwen3-235B layout (EP 32 over 4 nodes), a short step: DeepEP sends a token once per node
    from emulator.cli import main

    times = {}
    for kind in ("alltoall", "flex"):  # DeepEP does not pad to capacity (Megatron-Core refuses it)
        assert main(["run", "scenarios/qwen3-235b-256-h100.yaml", "--json", "--set", "training.global_batch=128",
                     "--set", f"parallel.moe_token_dispatcher_type={kind}", "--set",
                     f"model.moe_pad_expert_input_to_capacity={'true' if kind == 'alltoall' else 'false'}"]) == 0
        times[kind] = json.loads(capsys.readouterr().out)["iteration_time_s"]
    assert times["flex"] != times["alltoall"]


def test_small_grouped_gemms_lose_what_deepgemm_measured():
    from emulator.workload.kernel_cost import small_m_efficiency

    # DeepGEMM masked grouped GEMMs on H800 over the emulator's roofline of the same shapes: M 256:
    # (932/1130 + 815/918)/2 = (0.8248 + 0.8878)/2 = 0.8563; M 512: (1040/1130 + 916/918)/2 = 0.9591; M 1024: 1
    assert small_m_efficiency(256) == pytest.approx(0.85629, rel=1e-4)
    assert small_m_efficiency(512) == pytest.approx(0.95909, rel=1e-4)
    assert small_m_efficiency(1024) == small_m_efficiency(8192) == 1.0
    # halfway in log M between 256 and 512 (M = 362.04): the mean of the two
    assert small_m_efficiency(362) == pytest.approx((0.85629 + 0.95909) / 2, rel=2e-3)


def test_hybridep_runs_and_takes_padding_that_deepep_refuses(capsys):
    # DeepSeek-V2-Lite, EP 16 over 2 DGX H100 (the EP group crosses the NICs): the flex dispatcher with each
    # backend. Megatron-Core refuses padding to capacity with deepep only (transformer_config.py).
    from emulator.cli import main

    base = ["run", "scenarios/deepseek-v2-lite-moe-16-h100.yaml", "--json", "--set", "parallel.ep=16",
            "--set", "parallel.moe_token_dispatcher_type=flex"]
    dispatch = {}
    for backend in ("deepep", "hybridep"):
        assert main([*base, "--set", f"parallel.moe_flex_dispatcher_backend={backend}"]) == 0
        dispatch[backend] = json.loads(capsys.readouterr().out)["moe"]["dispatch_s"]
    assert 0 < dispatch["hybridep"] != dispatch["deepep"] > 0
    pad = ["--set", "model.moe_expert_capacity_factor=1.5", "--set", "model.moe_pad_expert_input_to_capacity=true"]
    assert main([*base, *pad, "--set", "parallel.moe_flex_dispatcher_backend=hybridep"]) == 0
    capsys.readouterr()
    assert main([*base, *pad, "--set", "parallel.moe_flex_dispatcher_backend=deepep"]) == 2
    assert "does not support model.moe_pad_expert_input_to_capacity" in capsys.readouterr().err


def test_a_skewed_load_grows_the_busiest_node_rdma_share():
    from emulator.network import dispatch as D

    class TwoNodes:  # 4 ranks, 2 a node
        def node_of(self, r):
            return r // 2

        def by_node(self, group):
            return [[0, 1], [2, 3]]

    params = {"experts": 8, "top_k": 2, "load": 1.5}
    nodes, _node_of, p_gpu, p_node, local = D._routing(TwoNodes(), params, (0, 1, 2, 3))
    assert nodes == [[0, 1], [2, 3]] and local == 2
    # balanced: P(use rank 0's experts {0, 1}) = 1 − C(6,2)/C(8,2) = 13/28; P(use node {0..3}) = 1 − C(4,2)/C(8,2) = 22/28
    # the busiest rank at load 1.5: 13/28 · 1.5 = 39/56; its node: 1 − (6/28)·(1 − 39/56)/(1 − 13/28) = 369/420
    assert p_gpu[0] == pytest.approx(39 / 56, rel=1e-12) and p_gpu[1] == pytest.approx(13 / 28, rel=1e-12)
    assert p_node == pytest.approx([369 / 420, 22 / 28], rel=1e-12)
    assert D._routing(TwoNodes(), dict(params, load=1.0), (0, 1, 2, 3))[3] == pytest.approx([22 / 28] * 2, rel=1e-12)
    # a GPU that takes every token: its node too
    assert D.busiest_node_use(22 / 28, 13 / 28, 1.0) == 1.0
