"""Per-rank breakdowns: each rank's own compute, exposed comm, bubble and other, expanded over a fold."""
import csv
import dataclasses
import io
import json

import pytest
from helpers import custom_scenario, star

from emulator.cli import main
from emulator.outputs.metrics import rank_totals
from emulator.outputs.ranks import rank_rows, ranks_csv
from emulator.outputs.summary import summarize
from emulator.program import Fold
from emulator.run.simulation import simulate
from emulator.scenario import WorkloadSpec, load_scenario

MS = 1e-3


def two_stage(folder):
    """Rank 0 (stage 0) computes 1 ms and sends 1 byte to rank 1 (stage 1), which then computes 2 ms,
    on a 1 PB/s zero-latency star: the send takes 1e-15 s, so the times are the hand ones."""
    ops = [{"id": 0, "rank": 0, "kind": "compute", "duration": 1 * MS, "stage": 0, "deps": []},
           {"id": 1, "rank": 0, "kind": "send", "peer": 1, "bytes": 1, "tag": 0, "stage": 0, "deps": [0]},
           {"id": 2, "rank": 1, "kind": "recv", "peer": 0, "bytes": 1, "tag": 0, "stage": 1, "deps": []},
           {"id": 3, "rank": 1, "kind": "compute", "duration": 2 * MS, "stage": 1, "deps": [2]}]
    path = folder / "t.json"
    path.write_text(json.dumps({"format": "emulator-trace", "version": 1, "ranks": 2, "ops": ops}))
    sc = custom_scenario(star(folder, 2, bw=1e15, lat=0.0), name="two-stage")
    return dataclasses.replace(sc, workload=WorkloadSpec(trace=str(path)))


def test_each_rank_has_its_own_breakdown_by_hand(tmp_path):
    result = simulate(two_stage(tmp_path))
    T = result.iteration_time_s
    assert T == pytest.approx(3 * MS, abs=1e-12)  # 1 ms, the 1e-15 s send, 2 ms
    rows = {r["rank"]: r for r in summarize(result)["ranks"]}
    # rank 0: computes 1 ms, then idles (bubble) 2 ms while stage 1 works
    assert rows[0]["compute"] == pytest.approx(1 * MS, abs=1e-12)
    assert rows[0]["bubble"] == pytest.approx(2 * MS, abs=1e-12)
    # rank 1: waits 1 ms for the activation (bubble), then computes 2 ms
    assert rows[1]["compute"] == pytest.approx(2 * MS, abs=1e-12)
    assert rows[1]["bubble"] == pytest.approx(1 * MS, abs=1e-12)
    for r in rows.values():  # the four parts of every rank add up to the iteration
        assert r["compute"] + r["exposed_comm"] + r["bubble"] + r["other"] == pytest.approx(T, rel=1e-12)
        assert r["copies"] == 1


def test_ranks_csv_expands_a_fold_over_its_copies():
    # a 2 × 2 grid folded along the slow axis: ranks 0 and 1 are simulated, 2 copies 0 and 3 copies 1
    fold = Fold((2, 2), (True, False))
    rows = [{"rank": 0, "copies": 2, "compute": 1.0, "exposed_comm": 0.5, "bubble": 0.25, "other": 0.25},
            {"rank": 1, "copies": 2, "compute": 1.5, "exposed_comm": 0.0, "bubble": 0.5, "other": 0.0}]
    lines = list(csv.reader(io.StringIO(ranks_csv(rows, 4, fold))))
    assert lines == [["rank", "represented_by", "compute_s", "exposed_comm_s", "bubble_s", "other_s"],
                     ["0", "0", "1.0", "0.5", "0.25", "0.25"], ["1", "1", "1.5", "0.0", "0.5", "0.0"],
                     ["2", "0", "1.0", "0.5", "0.25", "0.25"], ["3", "1", "1.5", "0.0", "0.5", "0.0"]]
    assert [fold.representative(r) for r in range(4)] == [0, 1, 0, 1]


def test_a_folded_scenario_lists_every_gpu(tmp_path):
    out = tmp_path / "o"
    assert main(["run", "scenarios/quickstart.yaml", "--out", str(out), "--no-gantt"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    rows = summary["ranks"]
    # the simulated ranks, each standing for `copies` GPUs, cover the 8 GPUs
    assert len(rows) == summary["sim"]["ranks_simulated"]
    assert sum(r["copies"] for r in rows) == summary["gpus"] == 8
    # the summary's breakdown is the mean of the simulated ranks' rows
    for part in ("compute", "exposed_comm", "bubble", "other"):
        assert summary["breakdown_s"][part] == pytest.approx(sum(r[part] for r in rows) / len(rows), rel=1e-12)
    lines = list(csv.DictReader(io.StringIO((out / "ranks.csv").read_text())))
    assert [int(x["rank"]) for x in lines] == list(range(8))
    simulated = {r["rank"] for r in rows}
    assert {int(x["represented_by"]) for x in lines} == simulated


def test_rank_rows_on_an_unfolded_run_have_one_copy_each():
    sc = load_scenario("scenarios/trace-pipeline-two-nodes.yaml")
    result = simulate(sc)
    rows = rank_rows(rank_totals(result.spans, result.iteration_time_s, True, 1), 1, None)
    assert [r["copies"] for r in rows] == [1] * len(rows) and len(rows) == result.program.ranks
