"""Transformer Engine's Userbuffers overlap of TP communication with GEMMs (parallel.tp_comm_overlap)."""
import textwrap

import pytest

from emulator.errors import ScenarioError
from emulator.scenario import GpuSpec, ModelSpec, ParallelSpec, load_scenario_text
from emulator.scenario.catalog import model_preset
from emulator.workload import flops as F
from emulator.workload import kernel_cost as KC
from emulator.workload import layer as Ly
from emulator.workload import userbuffers as Ub
from emulator.workload.recompute import backward_with_modules

GPT = ModelSpec(layers=48, hidden=6144, heads=64, seq_len=2048, vocab=51200)
H100 = GpuSpec("H100-SXM5-80GB", 989e12, 3350e9, 80 * 2**30, 4e-6, sm_count=132)
UB = ParallelSpec(tp=8, sequence_parallel=True, tp_comm_overlap=True)
SLOW = 132 / (132 - 16)  # the pipelined and bulk GEMMs run on 116 of the H100's 132 SMs


def shape(par=UB, model=GPT, t=8, sp=True):
    return Ly.layer_shape(model, 4, t=t, sp=sp, parallel=par, sm_count=132)


def test_forward_steps_as_userbuffers_run_them():
    L = shape()
    assert L.ub_slow == pytest.approx(SLOW)
    fwd = Ly.forward_steps(L)
    # ring exchange before qkv and mlp.up (t − 1 = 7 chunk GEMMs under it); the 4-way pipeline after proj
    # and mlp.down: three quarters of the reduce-scatter under three chunks, the last quarter after
    assert [(c.collective, c.overlap) for c in Ly.comms(fwd)] == \
        [("all_gather", 7), ("reduce_scatter", 3), ("reduce_scatter", 0)] * 2
    # T·h·2 = 4·2048·6144·2 = 100 663 296 B gathered; the reduce-scatter's 3/4 = 75 497 472 and 1/4 = 25 165 824
    assert [c.bytes for c in Ly.comms(fwd)][:3] == [100_663_296, 75_497_472, 25_165_824]
    qkv = [k for k in Ly.kernels(fwd) if k.name == "qkv"]
    proj = [k for k in Ly.kernels(fwd) if k.name == "proj"]
    # 8 chunks of T/t = 8192/8 = 1024 tokens at full SMs; 4 of 8192/4 = 2048 on 116 SMs
    assert [(k.m, k.slow) for k in qkv] == [(1024, 1.0)] * 8
    assert [k.m for k in proj] == [2048] * 4 and proj[0].slow == pytest.approx(SLOW)
    # the work is the layer's: 4·(24·2048·6144² + 4·2048²·6144)/8 FLOPs, as without the overlap
    gemms = sum(k.flops for k in Ly.kernels(fwd) if k.kind in ("gemm", "flash"))
    assert gemms == pytest.approx(4 * F.layer_forward_flops(GPT) / 8, rel=1e-12)
    # the all-gather follows ln1 at once and qkv's first chunk follows it: nothing else sits in its window
    names = [st.name for st in fwd]
    i = names.index("ln1.ag")
    assert names[i - 1:i + 9] == ["ln1", "ln1.ag"] + ["qkv"] * 8


def test_backward_steps_as_userbuffers_run_them():
    L = shape()
    bwd = Ly.backward_steps(L)
    # ring exchange of dy under proj's and mlp.down's dgrad; bulk around qkv and mlp.up (as without)
    assert [(c.name, c.overlap) for c in Ly.comms(bwd)] == [
        ("mlp.down.ag_grad", 7), ("mlp.up.ag_input", 1), ("mlp.up.rs_dgrad", 1),
        ("proj.ag_grad", 7), ("qkv.ag_input", 1), ("qkv.rs_dgrad", 1)]
    slow = {k.name: k.slow for k in Ly.kernels(bwd) if k.kind == "gemm"}
    assert slow["qkv.dgrad"] == slow["qkv.wgrad"] == slow["mlp.up.wgrad"] == pytest.approx(SLOW)
    assert slow["proj.dgrad"] == slow["proj.wgrad"] == slow["mlp.down.dgrad"] == 1.0
    assert sum(k.name == "proj.dgrad" for k in Ly.kernels(bwd)) == 8
    # a full recompute reruns the forward as Userbuffers run it, once: 4 reduce-scatters there, 2 after
    full = Ly.backward_steps(L, "full")
    assert [c.collective for c in Ly.comms(full)].count("reduce_scatter") == 4 + 2
    assert full[:len(Ly.forward_steps(L))] == Ly.forward_steps(L, "recompute")


def test_ring_and_pipeline_times_by_hand():
    L = shape()
    fwd = Ly.forward_steps(L)
    g_qkv = KC.kernel_time(next(k for k in fwd if k.name == "qkv"), H100)  # one chunk
    g_proj = KC.kernel_time(next(k for k in fwd if k.name == "proj"), H100)  # one chunk, on 116 SMs
    i, j = fwd.index(next(c for c in fwd if c.name == "ln1.ag")), len(fwd)
    ring = fwd[i:i + 9]  # the all-gather and its 8 chunks
    at = [st.name for st in fwd].index("proj")
    pipe = fwd[at:at + 6]  # chunk, 3/4 reduce-scatter, three chunks, 1/4 reduce-scatter
    assert j > at
    for c in (1e-5, 1e-3):  # the comm under the GEMM, then the GEMM waiting for it
        # ring: max(C, 7·g) + g
        assert KC.pass_time(ring, H100, lambda _c, c=c: c) == pytest.approx(max(c, 7 * g_qkv) + g_qkv, rel=1e-12)
        # pipeline (a reduce-scatter of b bytes takes c·b/S): g + max(3C/4, 3g) + C/4
        S = pipe[-1].bytes * 4
        t = KC.pass_time(pipe, H100, lambda x, c=c: c * x.bytes / S)
        assert t == pytest.approx(g_proj + max(0.75 * c, 3 * g_proj) + 0.25 * c, rel=1e-12)
    # the chunk on 116 SMs: 132/116 of its time on all of them
    plain = next(k for k in Ly.forward_steps(shape(par=ParallelSpec(tp=8, sequence_parallel=True))) if k.name == "proj")
    chunk = next(k for k in fwd if k.name == "proj")
    assert g_proj == pytest.approx(SLOW * KC.kernel_time(Ub._chunk(plain, L, 4, 1.0), H100), rel=1e-12)
    assert chunk.m * 4 == plain.m


def test_off_where_megatron_has_no_overlap():
    off = ParallelSpec(tp=8, sequence_parallel=True)
    assert shape(par=off).ub_slow == 0.0
    assert Ly.forward_steps(shape(par=off)) == Ly.forward_steps(shape(par=None))
    assert shape(t=1, sp=False).ub_slow == 0.0  # nothing to overlap at tp 1
    assert shape(model=model_preset("deepseek-v3")).ub_slow == 0.0  # Megatron's TELinear turns it off for MLA's down-projections
    # the experts get none: an MoE layer's SP gather before its router stays blocking
    moe = ModelSpec(layers=4, hidden=2048, heads=16, seq_len=2048, vocab=51200, experts=8, top_k=2, ffn_hidden=4096)
    L = shape(model=moe)
    ag = next(c for c in Ly.comms(Ly.forward_steps(L)) if c.name == "ln2.ag")
    assert ag.overlap == 0 and L.ub_slow > 0


def test_mlp_recompute_keeps_the_overlap():
    L = shape()
    rec = [st for st in backward_with_modules(L, ("mlp",)) if st.category == "recompute"]
    assert [(c.name, c.overlap) for c in Ly.comms(rec)] == [("ln2.ag", 7), ("mlp.rs", 3), ("mlp.rs", 0)]


def test_needs_sequence_parallel():
    text = textwrap.dedent("""\
        name: x
        cluster:
          nodes: 1
          node: dgx-h100
        model:
          preset: gpt3-1.3b
        training:
          global_batch: 8
          micro_batch: 1
        parallel:
          tp: 2
          tp_comm_overlap: true
        """)
    with pytest.raises(ScenarioError) as info:
        load_scenario_text(text, "x.yaml")
    assert "parallel.tp_comm_overlap" in str(info.value)
    assert "needs sequence_parallel: true" in str(info.value)
    ok = load_scenario_text(text.replace("tp: 2\n", "tp: 2\n  sequence_parallel: true\n"), "x.yaml")
    assert ok.parallel.tp_comm_overlap


def test_userbuffers_memory():
    from emulator.scenario import TrainingSpec
    from emulator.workload.memory import userbuffers_bytes
    par = ParallelSpec(tp=2, sequence_parallel=True, tp_comm_overlap=True)
    # 12 buffers of b·s·h = 1·4096·4096 = 16 777 216 elements in bf16: 12·2·16 777 216 = 402 653 184 B
    assert userbuffers_bytes(par, TrainingSpec(micro_batch=1), 4096 * 4096) == 402_653_184
    # FP8: the 8 all-gather buffers in one byte, the other 4 in two: (8 + 8)·16 777 216 = 268 435 456 B
    assert userbuffers_bytes(par, TrainingSpec(micro_batch=1, precision="fp8"), 4096 * 4096) == 268_435_456
    # with BF16 first/last layers the BF16 set as well: 268 435 456 + 402 653 184
    both = TrainingSpec(micro_batch=1, precision="fp8", first_last_layers_bf16=True)
    assert userbuffers_bytes(par, both, 4096 * 4096) == 671_088_640
    assert userbuffers_bytes(ParallelSpec(tp=2, sequence_parallel=True), TrainingSpec(), 4096 * 4096) == 0.0


def test_a_run_with_userbuffers(capsys):
    import json

    from emulator.cli import main

    base = ["run", "scenarios/quickstart.yaml", "--json", "--set", "cluster.node=dgx-h100", "--set",
            "parallel.tp=2", "--set", "parallel.sequence_parallel=true"]
    out = {}
    for on in ("false", "true"):
        assert main(base + ["--set", f"parallel.tp_comm_overlap={on}"]) == 0
        out[on] = json.loads(capsys.readouterr().out)
    off, ub = out["false"], out["true"]
    # the workspace holds the 12 bf16 buffers of b·s·h = 4·2048·2048: 12·2·16 777 216 = 402 653 184 B more
    work = [d["memory"]["breakdown_bytes"]["workspace"] for d in (off, ub)]
    assert work[1] - work[0] == 402_653_184
    # the TP collectives hide under their GEMMs: less exposed, the GEMMs on 116 SMs take longer
    assert ub["breakdown_s"]["exposed_comm"] < off["breakdown_s"]["exposed_comm"]
    assert ub["breakdown_s"]["compute"] > off["breakdown_s"]["compute"]


def test_a_note_where_the_overlap_changes_nothing():
    from emulator.run.simulation import _overlap_notes

    head = "name: x\ncluster: {nodes: 1, node: dgx-h100}\ntraining: {global_batch: 8, micro_batch: 1}\n"
    one = load_scenario_text(head + "model: {preset: gpt3-1.3b}\nparallel: {tp: 1, tp_comm_overlap: true}\n", "x.yaml")
    assert _overlap_notes(one) == ["parallel.tp_comm_overlap: no effect at tp 1 (no TP communication to overlap)"]
    mla = load_scenario_text(head + "model: {preset: deepseek-v2-lite}\nparallel: {tp: 2, sequence_parallel: true, "
                             "tp_comm_overlap: true}\n", "x.yaml")
    (note,) = _overlap_notes(mla)
    assert note.startswith("parallel.tp_comm_overlap: no overlap in the steps (Megatron-Core's TELinear")
    dense = load_scenario_text(head + "model: {preset: gpt3-1.3b}\nparallel: {tp: 2, sequence_parallel: true, "
                               "tp_comm_overlap: true}\n", "x.yaml")
    assert _overlap_notes(dense) == []


def test_a_nemo_configuration_sets_each_gemms_sms_and_method():
    """parallel.tp_comm_overlap_cfg: NeMo's userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192 (its Llama-3 70B
    recipe's): proj_fprop pipelined on 132 − 24 SMs (132/108 = 1.2222 longer), fc2_fprop on 132 − 16 (132/116),
    the four bulk GEMMs with no SM margin (full speed, where TE's default gives them 132/116), the ring exchanges
    as by default."""
    import dataclasses

    par = dataclasses.replace(UB, tp_comm_overlap_cfg="userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192")
    L = shape(par)
    assert Ub.ub_setting(L, "proj") == pytest.approx(("pipeline", 132 / 108, 4))
    assert Ub.ub_setting(L, "mlp.down") == pytest.approx(("pipeline", 132 / 116, 4))
    assert Ub.ub_setting(L, "qkv.wgrad") == ("bulk", 1.0, 4)
    assert Ub.ub_setting(L, "qkv") == ("ring_exchange", 1.0, 8)
    fwd, bwd = Ly.forward_steps(L), Ly.backward_steps(L)
    proj = [k for k in Ly.kernels(fwd) if k.name == "proj"]
    assert [k.m for k in proj] == [2048] * 4 and proj[0].slow == pytest.approx(132 / 108)
    assert all(k.slow == 1.0 for k in Ly.kernels(bwd) if k.name in ("qkv.dgrad", "qkv.wgrad", "mlp.up.wgrad"))
    # TE's defaults (no configuration): the bulk GEMMs on 116 SMs
    assert all(k.slow == pytest.approx(SLOW) for k in Ly.kernels(Ly.backward_steps(shape()))
               if k.name in ("qkv.dgrad", "qkv.wgrad", "mlp.up.wgrad"))


def test_an_fp8_configuration_reduce_scatters_by_ring_exchange():
    """userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192: proj_fprop and fc2_fprop by ring exchange (num_sm 1,
    set_sm_margin): t = 8 chunks of 8192/8 = 1024 tokens, 132/131 longer, seven eighths of the reduce-scatter
    under the last seven (100 663 296 · 7/8 = 88 080 384 B), the last eighth after (12 582 912 B)."""
    import dataclasses

    par = dataclasses.replace(UB, tp_comm_overlap_cfg="userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192")
    fwd = Ly.forward_steps(shape(par))
    proj = [k for k in Ly.kernels(fwd) if k.name == "proj"]
    assert [k.m for k in proj] == [1024] * 8 and proj[0].slow == pytest.approx(132 / 131)
    rs = [c for c in Ly.comms(fwd) if c.name == "proj.rs"]
    assert [(c.bytes, c.overlap) for c in rs] == [(88_080_384, 7), (12_582_912, 0)]


@pytest.mark.parametrize("value, says", [
    ("userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen819", "did you mean userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192"),
    ("nothing_like_it", "is not one of NeMo's Userbuffers configurations"),
])
def test_an_unknown_configuration_is_refused(value, says):
    text = ("name: x\ncluster: {nodes: 1, node: dgx-h100}\nmodel: {preset: llama3-8b}\n"
            "training: {global_batch: 8, micro_batch: 1}\n"
            f"parallel: {{tp: 8, sequence_parallel: true, tp_comm_overlap: true, tp_comm_overlap_cfg: {value}}}\n")
    with pytest.raises(ScenarioError) as info:
        load_scenario_text(text, "x.yaml")
    assert "parallel.tp_comm_overlap_cfg" in str(info.value) and says in str(info.value)
    no_overlap = text.replace("tp_comm_overlap: true, ", "").replace(value, "userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192")
    with pytest.raises(ScenarioError) as info:
        load_scenario_text(no_overlap, "x.yaml")
    assert "is read with tp_comm_overlap: true" in str(info.value)
