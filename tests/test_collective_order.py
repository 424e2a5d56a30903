"""Collectives of one communicator match in program (issue) order, whatever stream they run on.

NCCL matches the calls of a communicator in the order each rank issues them; ZeRO-3's
all-gathers (stream ``zero``) and reduce-scatters (stream ``dp``) share the data-parallel
group, so a rank that falls behind must not pair its all-gather with another's
reduce-scatter (issue #17: "collective mismatch").
"""
import os

import pytest
from helpers import custom_scenario, star
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emulator.errors import EmulatorError
from emulator.program import COLLECTIVE, COMPUTE, Op, Program
from emulator.run.simulation import run_program, simulate
from emulator.scenario import load_scenario


def _ar(i, rank, nbytes, stream, deps=()):
    return Op(i, rank, COLLECTIVE, stream=stream, deps=deps, collective="all_reduce", group=(0, 1), bytes=nbytes)


def test_calls_on_two_streams_match_in_program_order_not_arrival_order(tmp_path):
    # Both ranks call A (1 GB, stream zero) then B (2 GB, stream dp). Rank 0's B waits for 2 s of
    # compute and rank 1's A for 3 s, so rank 0 issues A first and rank 1 issues B first: by
    # arrival order, A would meet B. Star of 2 GPUs, 100 GB/s, 1 us per link (a hop is 2 us);
    # a 2-GPU ring all-reduce of S is 2·2e-6 + S/100e9:
    #   B starts at 2 s (rank 0's issue): 2 + 4e-6 + 0.02 = 2.020004 s;
    #   A starts at 3 s (rank 1's issue): 3 + 4e-6 + 0.01 = 3.010004 s.
    sc = custom_scenario(star(tmp_path, 2))
    ops = [Op(0, 0, COMPUTE, duration=2.0), _ar(1, 0, 1e9, "zero"), _ar(2, 0, 2e9, "dp", (0,)),
           Op(3, 1, COMPUTE, duration=3.0), _ar(4, 1, 1e9, "zero", (3,)), _ar(5, 1, 2e9, "dp")]
    spans = {s.op_id: s for s in run_program(Program(2, ops), sc).spans}
    assert spans[2].end_s == pytest.approx(2.020004, rel=1e-12) and spans[5].end_s == spans[2].end_s
    assert spans[1].end_s == pytest.approx(3.010004, rel=1e-12) and spans[4].end_s == spans[1].end_s


def test_calls_issued_in_different_orders_are_a_mismatch(tmp_path):
    # NCCL requires every rank to issue a communicator's calls in one order: rank 1 swaps them.
    sc = custom_scenario(star(tmp_path, 2))
    ops = [_ar(0, 0, 1e9, "zero"), _ar(1, 0, 2e9, "dp"), _ar(2, 1, 2e9, "dp"), _ar(3, 1, 1e9, "zero")]
    with pytest.raises(EmulatorError, match=r"collective mismatch on group \[0, 1\] \(call #[01]\)"):
        run_program(Program(2, ops), sc)


ZERO3_ASYMMETRIC = """name: zero3-asymmetric
cluster:
  nodes: 3
  node: {preset: dgx-a100, gpus_per_node: 2}
  fabric: {kind: fat_tree, leaf_size: 4}
model: {preset: gpt3-125m, seq_len: 2048}
training: {global_batch: 6, micro_batch: 1, recompute: selective}
parallel: {tp: 1, pp: 2, dp: 3, schedule: gpipe, zero: 3}
collectives: {algorithm: hierarchical}
"""

ZERO3_DGX = """name: zero3-dgx
cluster:
  nodes: 1
  node: dgx-a100
  fabric: {kind: single_switch}
model: {preset: gpt3-350m}
training: {global_batch: 8, micro_batch: 1}
parallel: {tp: 1, pp: 1, dp: 8, zero: 3}
"""


def _write(folder, text, name="s.yaml"):
    path = os.path.join(str(folder), name)
    with open(path, "w") as fh:
        fh.write(text)
    return path


def _straggler(gpu, factor):
    return f"cluster.overrides=[{{kind: gpu_slowdown, target: 'gpu:{gpu}', factor: {factor}}}]"


def test_issue_17_zero3_asymmetric_layout_runs(tmp_path):
    # 3 nodes of 2 GPUs, pp 2 × dp 3: the dp groups span leaves unevenly (fault-free). It used to
    # end in "collective mismatch on group [0, 1, 2] (call #37)".
    r = simulate(load_scenario(_write(tmp_path, ZERO3_ASYMMETRIC)), record_links=False)
    assert r.iteration_time_s > 0


def test_issue_17_zero3_straggler_runs_and_lengthens_the_iteration(tmp_path):
    # dp 8 ZeRO-3 with gpu:3 ×1.1 used to end in "collective mismatch". Every compute op of rank 3
    # runs on its one compute stream, in sequence, so the iteration lasts at least 1.1 × their sum.
    path = _write(tmp_path, ZERO3_DGX)
    base = simulate(load_scenario(path), record_links=False)
    slow = simulate(load_scenario(path, [_straggler(3, 1.1)]), record_links=False)
    busy = sum(s.end_s - s.start_s for s in base.spans if s.rank == 3 and s.kind == "compute")
    assert slow.iteration_time_s >= 1.1 * busy * (1 - 1e-12)
    assert slow.iteration_time_s > base.iteration_time_s


ZERO3_SMALL = """name: zero3-small
cluster:
  nodes: 1
  node: {preset: dgx-a100, gpus_per_node: 4}
  fabric: {kind: single_switch}
model: {layers: 4, hidden: 512, heads: 8, ffn_hidden: 2048, seq_len: 512, vocab: 32000}
training: {global_batch: 8, micro_batch: 1}
parallel: {tp: 1, pp: 2, dp: 2, zero: 3, schedule: 1f1b}
"""

MOE_SMALL = """name: moe-small
cluster:
  nodes: 2
  node: {preset: dgx-a100, gpus_per_node: 4}
  fabric: {kind: single_switch}
model: {layers: 4, hidden: 512, heads: 8, ffn_hidden: 1024, seq_len: 512, vocab: 32000, experts: 4, top_k: 2}
training: {global_batch: 16, micro_batch: 1}
parallel: {tp: 2, pp: 1, dp: 4, ep: 4, zero: 1}
"""


@pytest.mark.parametrize("text, gpus", [(ZERO3_SMALL, 4), (MOE_SMALL, 8)], ids=["zero3", "moe"])
def test_random_stragglers_never_abort_and_never_shorten_the_busiest_rank(tmp_path, text, gpus):
    path = _write(tmp_path, text)
    busy = {}
    for s in simulate(load_scenario(path), record_links=False).spans:
        if s.kind == "compute" and s.stream != "cpu":  # the GPU's kernels, not the host's issuing (host.py)
            busy[s.rank] = busy.get(s.rank, 0.0) + s.end_s - s.start_s

    @settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.lists(st.tuples(st.integers(0, gpus - 1), st.sampled_from([1.05, 1.1, 1.5, 2.0, 3.0])),
                    min_size=1, max_size=3, unique_by=lambda x: x[0]))
    def run(slow):
        over = "cluster.overrides=[" + ", ".join(
            f"{{kind: gpu_slowdown, target: 'gpu:{g}', factor: {f}}}" for g, f in slow) + "]"
        r = simulate(load_scenario(path, [over]), record_links=False)
        # each compute stream is one lane: a straggler's compute alone takes factor × its busy time
        assert r.iteration_time_s >= max(f * busy[g] for g, f in slow) * (1 - 1e-12)

    run()
