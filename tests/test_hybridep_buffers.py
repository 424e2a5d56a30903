"""HybridEP's buffers in the memory report (emulator/scenario/hybridep_buffers.py, DeepEP hybrid-ep @ 94a9f8f):
within an NVLink domain and across domains, hand-computed, and the EP group that holds the most."""
from emulator.scenario import load_scenario
from emulator.scenario.hybridep_buffers import buffer_bytes, internode_bytes, intranode_bytes
from emulator.workload.memory import memory_report


def test_one_domain():
    # Qwen3-235B, EP 64 in one domain, 4096 tokens a rank, h 4096, 2 local experts: M = 4096 x 64 = 262,144 rows of
    # bf16 tokens (8192 B), fp32 probabilities of the domain's 128 experts (512 B), fp32 scales per 128 (128 B)
    assert buffer_bytes(4096, 4096, 2, 64, 64) == 262_144 * (8192 + 512 + 128) == 2_315_255_808
    assert internode_bytes(4096, 4096, 2, 64, 1) == 0


def test_two_domains():
    # T 8, h 256, 1 local expert, 2 ranks a domain, 2 domains: M = 8 x 2 x 2 = 32 rows of 512 + 2·4 + 2·4 = 528 B
    assert intranode_bytes(8, 256, 1, 2, 2) == 32 * 528
    # across: the attention side 8 x (512 + 1·2·2·4 + 8) = 4,288; the dispatch group 8 x 1 x (512 + 8 + 8) = 4,224;
    # the combine's two 8 x 1 x (512 + 8) each = 8,320
    assert internode_bytes(8, 256, 1, 2, 2) == 4_288 + 4_224 + 8_320
    assert buffer_bytes(8, 256, 1, 2, 4) == 16_896 + 16_832


def test_the_group_that_straddles_two_racks_holds_the_most():
    # Qwen3-30B-A3B (h 2048, 128 experts, EP 16: 8 local), 4096 tokens a rank, on two GB200 racks of 72: eight
    # groups in one domain (R 16: 65,536 rows of 4096 + 8·16·4 + 64 = 4,672 B = 306,184,192 B) and ranks 64-79,
    # 8 + 8 (R 8, N 2: 65,536 rows of 4096 + 256 + 64 = 4,416 B = 289,406,976 B, and across 4096 x (4096 + 512 + 64)
    # + 4096 x (4096 + 256 + 64) + 2 x 4096 x (4096 + 256) = 72,876,032 B): 362,283,008 B
    sets = ["cluster.node=gb200-nvl72", "cluster.nodes=36", "parallel.moe_token_dispatcher_type=flex"]
    path = "scenarios/buyer-qwen3-30b-144gpu.yaml"
    hybrid = memory_report(load_scenario(path, [*sets, "parallel.moe_flex_dispatcher_backend=hybridep"]))
    plain = memory_report(load_scenario(path, ["cluster.node=gb200-nvl72", "cluster.nodes=36"]))
    assert hybrid.breakdown["workspace"] - plain.breakdown["workspace"] == 362_283_008
