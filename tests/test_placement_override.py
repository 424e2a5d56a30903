"""`parallel.order` overrides Megatron's rank placement; a worse placement is slower."""
from emulator.run.simulation import simulate
from emulator.scenario import load_scenario_text
from emulator.workload.placement import Layout

TEXT = """
name: o
cluster: {nodes: 2, node: dgx-a100, fabric: {kind: fat_tree}}
model: {preset: gpt3-1.3b, layers: 4}
training: {global_batch: 8, micro_batch: 1}
parallel: {tp: 8, pp: 1, dp: 2}
"""


def test_order_changes_the_groups_and_the_time():
    default = load_scenario_text(TEXT, "o.yaml")
    dp_fast = load_scenario_text(TEXT, "o.yaml", ["parallel.order=[pp, tp, cp, dp]"])
    # Megatron: TP fastest, so rank 0's TP group is GPUs 0..7 (one node);
    # with dp fastest it is every other rank: 0, 2, ..., 14 — half on each node
    assert Layout.from_parallel(default.parallel, 16).tp_group(0) == tuple(range(8))
    assert Layout.from_parallel(dp_fast.parallel, 16, dp_fast.parallel.order).tp_group(0) == tuple(range(0, 16, 2))
    a = simulate(default, record_links=False)
    b = simulate(dp_fast, record_links=False)
    assert "parallel.order" in b.notes[0]  # folding turns itself off, and says why
    # the TP all-reduces now cross InfiniBand: 4 rails × 24 GB/s = 96 GB/s for the ring instead of
    # 230 GB/s of NVLink: each transfer ~230/96 = 2.4× longer (a little less: latency is a share)
    def tp_transfer(r):
        return sum(s.end_s - s.xfer_s for s in r.spans if s.stream == "tp" and s.rank == 0)

    assert tp_transfer(b) > 2.0 * tp_transfer(a)
    assert b.iteration_time_s > a.iteration_time_s
