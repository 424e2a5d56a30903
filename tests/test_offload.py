"""Fine-grained activation offloading (Megatron-Core's training.fine_grained_activation_offloading and
offload_modules): what each module sends to the host, the memory it frees, the copies on the d2h and h2d
streams and where their waits land in the breakdown."""
import dataclasses

import pytest

from emulator.errors import ScenarioError
from emulator.run.simulation import simulate
from emulator.scenario import ModelSpec, load_scenario_text
from emulator.workload.activations import layer_activation_bytes
from emulator.workload.memory import stage_memory
from emulator.workload.offload import OFFLOAD_RESIDENT_LAYERS, offloaded_bytes

# GQA, head_dim 128: a·d = 1024 = h, kv·d = 256
GQA = ModelSpec(layers=8, hidden=1024, heads=8, kv_heads=2, head_dim=128, ffn_hidden=4096, seq_len=4096, vocab=1024,
                swiglu=True)


def test_attention_modules_send_their_saved_inputs():
    # per token, bf16, flash, no recompute: core_attn Q 2·1024 + K 2·256 + V 2·256 = 3072 B; attn_proj its input
    # 2·1024 = 2048 B; qkv_linear the fused norm's input 2h and the QKV input 2h = 4096 B. s 4096, b 1, t 1:
    # 4096·3072 = 12 582 912, 4096·2048 = 8 388 608, 4096·4096 = 16 777 216 B
    one = {name: offloaded_bytes(GQA, 1, 4096, flash=True, offload=(name,))
           for name in ("core_attn", "attn_proj", "qkv_linear", "attn_norm", "mlp_norm")}
    assert one == {"core_attn": 12_582_912, "attn_proj": 8_388_608, "qkv_linear": 16_777_216,
                   "attn_norm": 0.0, "mlp_norm": 0.0}  # the norms are fused into TE's linears: nothing of their own
    assert offloaded_bytes(GQA, 1, 4096, flash=True, offload=("core_attn", "attn_proj")) == 20_971_520
    # tensor parallelism with SP shards every term: t 4 → a quarter
    assert offloaded_bytes(GQA, 1, 4096, 4, True, flash=True, offload=("core_attn",)) == 12_582_912 / 4
    # under 1024·1024 elements (2 MiB in bf16) a module's inputs stay: s 512 gives core_attn 512·3072 = 1 572 864 B
    assert offloaded_bytes(GQA, 1, 512, flash=True, offload=("core_attn",)) == 0.0


def test_expert_modules_send_the_routed_copies():
    # top-2 of 8 experts of width 512 (SwiGLU), h 1024, one rank (load 1): expert_fc1 2 copies · 2·1024 = 4096 B a
    # token; moe_act the up outputs 2 copies · 2·2·512 = 4096 B; mlp_norm the MoE layer's own norm input 2h = 2048 B
    moe = dataclasses.replace(GQA, experts=8, top_k=2, expert_ffn_hidden=512)
    got = {name: offloaded_bytes(moe, 1, 4096, flash=True, offload=(name,))
           for name in ("expert_fc1", "moe_act", "mlp_norm")}
    assert got == {"expert_fc1": 4096 * 4096, "moe_act": 4096 * 4096, "mlp_norm": 4096 * 2048}
    # a dense leading layer has none of them
    assert offloaded_bytes(moe, 1, 4096, flash=True, moe=False, offload=("expert_fc1", "moe_act", "mlp_norm")) == 0


SCENARIO = ("name: off\ncluster: {nodes: 1, node: dgx-h100}\n"
            "model: {layers: 8, hidden: 1024, heads: 8, kv_heads: 2, head_dim: 128, ffn_hidden: 4096, seq_len: 4096, "
            "vocab: 1024, swiglu: true}\n"
            "training: {global_batch: 8, micro_batch: 1, attention: flash, "
            "fine_grained_activation_offloading: true, offload_modules: [core_attn, attn_proj]}\n"
            "parallel: {tp: 1, pp: 1, dp: 8}\n")


def test_a_stage_keeps_what_it_does_not_send_and_three_layers_of_what_it_does():
    sc = load_scenario_text(SCENARIO, "off.yaml")
    plain = load_scenario_text(SCENARIO.replace("fine_grained_activation_offloading: true, offload_modules: "
                                                "[core_attn, attn_proj]", "recompute: none"), "off.yaml")
    per_layer = layer_activation_bytes(GQA, 1, 4096, flash=True)
    off = 20_971_520  # the test above
    # pp 1: one micro-batch's 8 layers in flight; 8·A before, 8·(A − O) + 3·O with offloading
    a, b = stage_memory(plain)[0].breakdown["activations"], stage_memory(sc)[0].breakdown["activations"]
    assert OFFLOAD_RESIDENT_LAYERS == 3 and a == 8 * per_layer
    assert b == 8 * (per_layer - off) + 3 * off


def test_copies_run_on_their_own_streams_and_their_waits_are_exposed_communication():
    fast = simulate(load_scenario_text(SCENARIO, "off.yaml"), record_links=False)
    copies = [s for s in fast.spans if s.stream in ("d2h", "h2d")]
    # one copy out and one back per layer and micro-batch, but the last layer's, whose backward follows its forward
    # at once (Megatron-Core keeps it): 7 layers · 1 micro-batch · 2, on the one simulated rank
    assert sorted({s.stream for s in copies}) == ["d2h", "h2d"] and len(copies) == 14
    # each moves 20 971 520 B at the node's 55.06 GB/s: 380.9 us
    assert all(s.end_s - s.start_s == pytest.approx(20_971_520 / 55.06e9, rel=1e-12) for s in copies)
    # at 1 GB/s the copies (21 ms each) outlast the layers: the reloads hold back the backward, as communication
    slow = simulate(load_scenario_text(SCENARIO, "off.yaml", ["cluster.node.host_bandwidth=1 GB/s"]),
                    record_links=False)
    assert slow.iteration_time_s > fast.iteration_time_s + 0.1
    from emulator.outputs.metrics import breakdown
    b_fast, b_slow = (breakdown(r.spans, r.iteration_time_s, False) for r in (fast, slow))
    assert b_slow.compute == pytest.approx(b_fast.compute, rel=1e-9)  # the copies are no compute
    assert b_slow.exposed_comm > 0.1


MODULES = "offload_modules: [core_attn, attn_proj]"


@pytest.mark.parametrize("old, new, key, words", [
    (", " + MODULES, "", "training.offload_modules", "needs at least one module"),
    ("fine_grained_activation_offloading: true, ", "", "training.offload_modules",
     "with training.fine_grained_activation_offloading: true"),
    (MODULES, "offload_modules: [attn_proj]", "training.offload_modules", "only with core_attn"),
    (MODULES, "offload_modules: [expert_fc1]", "training.offload_modules", "needs an MoE model"),
    ("attention: flash, ", "attention: flash, recompute: full, ", "training.fine_grained_activation_offloading",
     "keeps only its input"),
])
def test_megatrons_rules_refuse_by_name(old, new, key, words):
    with pytest.raises(ScenarioError) as info:
        load_scenario_text(SCENARIO.replace(old, new), "off.yaml")
    assert key in str(info.value) and words in str(info.value)


def test_a_node_without_a_measured_host_rate_is_refused():
    with pytest.raises(ScenarioError) as info:  # dgx-a100: PCIe Gen4, no nvbandwidth row on disk
        simulate(load_scenario_text(SCENARIO.replace("dgx-h100", "dgx-a100"), "off.yaml"), record_links=False)
    assert "cluster.node.host_bandwidth" in str(info.value) and "dgx-a100" in str(info.value)


def test_expert_modules_are_refused_under_the_moe_recompute_and_dualpipe():
    moe = (SCENARIO.replace("swiglu: true}", "swiglu: true, experts: 8, top_k: 2}")
           .replace(MODULES, "offload_modules: [expert_fc1]").replace("dp: 8}", "dp: 8, ep: 2}"))
    load_scenario_text(moe, "off.yaml")  # the expert modules of an MoE model: accepted
    with pytest.raises(ScenarioError) as info:
        load_scenario_text(moe.replace("attention: flash, ", "attention: flash, recompute: selective, "
                                                             "recompute_modules: [moe], "), "off.yaml")
    assert "training.offload_modules" in str(info.value) and "recomputes the whole moe layer" in str(info.value)
    with pytest.raises(ScenarioError) as info:
        load_scenario_text(moe.replace("ep: 2}", "ep: 2, schedule: dualpipev}").replace("global_batch: 8",
                                                                                         "global_batch: 16"),
                           "off.yaml")
    assert "not modelled with schedule dualpipev" in str(info.value)


def test_the_1f1b_all_to_all_overlap_copies_each_layer_out_and_back():
    """overlap_moe_expert_parallel_comm pairs a forward layer with a backward one (builder.run_pair): each MoE
    layer's expert_fc1 input still goes out after its forward and back before its backward. pp 1, 8 layers, the
    last kept, 2 micro-batches (16 / (1 · 8)): 14 copies each way on a rank."""
    moe = (SCENARIO.replace("swiglu: true}", "swiglu: true, experts: 8, top_k: 2}")
           .replace(MODULES, "offload_modules: [expert_fc1]").replace("dp: 8}", "dp: 8, ep: 2, "
                                                                              "overlap_moe_expert_parallel_comm: true}")
           .replace("global_batch: 8", "global_batch: 16"))
    run = simulate(load_scenario_text(moe, "off.yaml"), record_links=False)
    streams = [s.stream for s in run.spans if s.stream in ("d2h", "h2d") and s.rank == 0]
    assert streams.count("d2h") == 14 and streams.count("h2d") == 14


def test_a_profiled_script_is_refused():
    import os

    from emulator.scenario import load_scenario
    path = os.path.join(os.path.dirname(__file__), "..", "scenarios", "profile-gpt-1.3b-1xh200.yaml")
    sc = load_scenario(path, ["training.fine_grained_activation_offloading=true", "training.offload_modules=[core_attn]"])
    with pytest.raises(ScenarioError) as info:
        simulate(sc, record_links=False)
    assert "training.fine_grained_activation_offloading" in str(info.value) and "leave it out" in str(info.value)


def test_the_closed_form_bounds_a_micro_batch_by_its_copies():
    """The search's closed form: at 1 GB/s one micro-batch's 8 layers take 8 · 20 971 520 B / 1 GB/s = 0.168 s on
    each copy stream, more than their compute; the stage's micro-batch takes that (one micro-batch: 8 / (1 · 8))."""
    from emulator.studies.rank import estimate_iteration

    fast = estimate_iteration(load_scenario_text(SCENARIO, "off.yaml"))
    slow = estimate_iteration(load_scenario_text(SCENARIO, "off.yaml", ["cluster.node.host_bandwidth=1 GB/s"]))
    assert fast.compute_s < 0.168 and slow.compute_s == pytest.approx(8 * 20_971_520 / 1e9, rel=1e-12)


def test_a_fraction_sends_the_first_groups_of_each_chunk():
    """activation_offload_fraction: of a chunk's eligible groups in forward order, the last int(n·(1 − f)) stay.
    Here 8 layers of 2 groups (core_attn 12 582 912 B, attn_proj 8 388 608 B): n = 16; f 0.3 keeps int(11.2) = 11
    and sends 5: layers 0 and 1 whole and layer 2's core_attn."""
    from emulator.workload import models as M
    from emulator.workload.offload import chunk_offload

    sc = load_scenario_text(SCENARIO.replace("attn_proj]", "attn_proj], activation_offload_fraction: 0.3"), "off.yaml")
    m = M.resolve(sc.model)
    assert chunk_offload(sc, m, list(range(8))) == [20_971_520, 20_971_520, 12_582_912, 0, 0, 0, 0, 0]
    # memory: the stage sends 54 525 952 of 8 · 20 971 520 = 167 772 160 B, a share of 0.325 of every layer's
    per_layer, off = layer_activation_bytes(GQA, 1, 4096, flash=True), 0.325 * 20_971_520
    assert stage_memory(sc)[0].breakdown["activations"] == pytest.approx(8 * (per_layer - off) + 3 * off, rel=1e-12)
    # the run copies those three layers only, each its bytes
    copies = sorted((s.name, s.end_s - s.start_s) for s in simulate(sc, record_links=False).spans
                    if s.stream == "d2h" and s.rank == 0)
    assert [name for name, _ in copies] == ["mb0.layer0.offload", "mb0.layer1.offload", "mb0.layer2.offload"]
    assert copies[2][1] == pytest.approx(12_582_912 / 55.06e9, rel=1e-12)
    with pytest.raises(ScenarioError) as info:  # a fraction without the switch
        load_scenario_text(SCENARIO.replace("fine_grained_activation_offloading: true, offload_modules: "
                                            "[core_attn, attn_proj]", "activation_offload_fraction: 0.5"), "off.yaml")
    assert "training.activation_offload_fraction" in str(info.value)
