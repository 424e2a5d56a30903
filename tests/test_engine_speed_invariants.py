"""The engine's fast paths change no result: a Stamped program (templates + copies) runs
exactly like its materialised ops, and the SpanTable reads back exactly those spans."""
import pytest
from helpers import custom_scenario, star

from emulator.program import RECV, Fold, Op, Program
from emulator.run.engine import DeadlockError
from emulator.run.folding import Stamped, program_fold, unfold
from emulator.run.simulation import run_program
from emulator.scenario import load_scenario_text
from emulator.workload.builder import build_program

TEXT = """
name: s
cluster: {nodes: 2, node: dgx-a100}
model: {preset: gpt3-125m, layers: 4}
training: {global_batch: 16, micro_batch: 1}
parallel: {tp: 2, pp: 2, dp: 4, schedule: interleaved-1f1b, virtual_stages: 2}
"""


def test_stamped_runs_exactly_like_its_materialised_ops():
    sc = load_scenario_text(TEXT, "s.yaml")
    fold = program_fold(sc)
    stamped = unfold(build_program(sc, fold), fold)
    flat = Program(stamped.ranks, list(stamped.ops), None, stamped.meta)  # the plain (one-copy) path
    a, b = run_program(stamped, sc, record_links=False), run_program(flat, sc, record_links=False)
    # 16 ranks = 2 (pp) × 8 copies; bit-identical times, spans in the same order
    assert a.iteration_time_s == b.iteration_time_s and a.events == b.events
    assert list(a.spans) == list(b.spans) and len(a.spans) == len(stamped.ops)
    assert a.ranks_simulated == b.ranks_simulated == 16


def test_span_table_indexing_matches_iteration():
    sc = load_scenario_text(TEXT, "s.yaml")
    fold = program_fold(sc)
    r = run_program(unfold(build_program(sc, fold), fold), sc, record_links=False)
    spans = list(r.spans)
    n = len(spans)
    for i in (0, 1, n // 3, n // 2 + 7, n - 1, -1, -n):
        assert r.spans[i] == spans[i]
    assert r.spans[5:9] == spans[5:9]
    with pytest.raises(IndexError):
        r.spans[n]


def test_stamped_deadlock_names_the_copy(tmp_path):
    # the template: rank 0 waits for a recv from rank 1; its copy (rank 1) waits for rank 0
    sc = custom_scenario(star(tmp_path, 2))
    stamped = Stamped(Program(2, [Op(0, 0, RECV, peer=1, bytes=10, tag=3)]), Fold((2,), (True,)))
    with pytest.raises(DeadlockError) as err:
        run_program(stamped, sc)
    msg = str(err.value)
    assert "2 of 2 ops" in msg and "rank 1 stream compute: op 1 (recv from rank 0 tag 3" in msg
