"""DeepEP's buffers in the memory report (scenario/deepep_buffers.py) and its EP sizes and SM count refused by the
rule book, as DeepEP asserts them."""
import pytest

from emulator.errors import ScenarioError
from emulator.scenario import load_scenario_text
from emulator.scenario.deepep_buffers import buffer_bytes, nvl_bytes, rdma_bytes


def test_deepseek_v3s_buffer_as_deepep_hints_it():
    # h 7168 in bf16: 14 336 B rows; 64 EP ranks (8 NVLink peers, 8 RDMA peers), 20 SMs: 10 channels.
    # NVL (dispatch and combine both receive 288 tokens): 10·8·(2·8 + 3)·4 = 6 080, plus 10·8·288 tokens of
    # 14 336 + 8 (source meta) + 128·(8 + 4) (top-k indices, weights) + 128·4 (scales) = 16 392 B:
    # 377 671 680; 377 677 760 rounded up to 128 B: 377 677 824
    assert nvl_bytes(14_336, 64, 20, 288) == 377_677_824
    # RDMA: 128 receive tokens (a multiple of 8): 10·8·(8·2 + 2)·2·4 = 11 520, plus 10·8·128·2 halves of
    # 16 392 + 16 (an int4) = 16 408 B: 336 035 840; 336 047 360 (a multiple of 128)
    assert rdma_bytes(14_336, 64, 20, 8, 128) == 336_047_360
    # with the 32 MiB workspace: 377 677 824 + 336 047 360 + 33 554 432 = 747 279 616
    assert buffer_bytes(14_336, 64, 20) == 747_279_616
    # within one NVLink group there is no RDMA buffer: 8 ranks, 256 tokens: 10·8·(2·1 + 3)·4 = 1 600, plus
    # 10·8·256·16 392 = 335 708 160: 335 709 760, rounded up to 128 B: 335 709 824; plus the workspace
    assert buffer_bytes(14_336, 8, 20) == 335_709_824 + 33_554_432


MOE = ("name: x\ncluster: {nodes: 2, node: dgx-h100}\n"
       "model: {layers: 2, hidden: 1024, heads: 8, seq_len: 1024, vocab: 1024, experts: 16, top_k: 2}\n"
       "training: {global_batch: 16, micro_batch: 1}\n"
       "parallel: {tp: 1, dp: 16, ep: 16, moe_token_dispatcher_type: flex, moe_flex_dispatcher_backend: deepep}\n")


def test_the_memory_report_holds_the_buffer():
    from emulator.workload.memory import stage_memory
    flex = stage_memory(load_scenario_text(MOE, "x.yaml"))[0].breakdown["workspace"]
    a2a = stage_memory(load_scenario_text(MOE.replace(", moe_flex_dispatcher_backend: deepep", "").replace(
        "flex", "alltoall"), "x.yaml"))[0].breakdown["workspace"]
    assert flex - a2a == buffer_bytes(1024 * 2, 16, 20)


@pytest.mark.parametrize("old, new, key, words", [
    ("nodes: 2,", "nodes: 3,", "parallel.ep", "no configuration for 12 EP ranks"),
    ("deepep}", "deepep, moe_flex_dispatcher_num_sms: 21}", "parallel.moe_flex_dispatcher_num_sms", "even SM count"),
])
def test_deepeps_own_limits_are_refused(old, new, key, words):
    text = MOE.replace(old, new)
    if new == "nodes: 3,":  # 24 GPUs, 24 experts over 12 EP ranks
        text = text.replace("experts: 16", "experts: 24").replace("dp: 16, ep: 16", "dp: 24, ep: 12").replace(
            "global_batch: 16", "global_batch: 24")
    with pytest.raises(ScenarioError) as info:
        load_scenario_text(text, "x.yaml")
    assert key in str(info.value) and words in str(info.value)
