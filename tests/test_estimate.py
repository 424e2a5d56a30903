"""`emulator run --estimate` counts the events before running, close to what the run does."""
import os
import re

import pytest

from emulator.cli import main
from emulator.run.simulation import simulate
from emulator.scenario import load_scenario

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("name, sets, gpus", [
    # one node, TP 2 and DP 2 on the same NVLink ports: no collective is private, each call ~3 events
    ("quickstart.yaml", [], "8 (2 simulated)"),
    # TP 8 fills each node: its collectives are private (no event), the pipeline's transfers are not
    ("gpt3-175b-1024-a100.yaml", ["training.global_batch=256"], "1024 (8 simulated)"),
])
def test_estimate_is_near_the_actual_event_count(capsys, name, sets, gpus):
    path = os.path.join(ROOT, "scenarios", name)
    assert main(["run", path, "--estimate", *[x for kv in sets for x in ("--set", kv)]]) == 0
    text = capsys.readouterr().out
    estimated = int(re.search(r"events\s+~([\d,]+)", text).group(1).replace(",", ""))
    actual = simulate(load_scenario(path, sets), record_links=False).events
    # an estimate, not a count: within 30 % on these cases
    assert 0.7 * actual <= estimated <= 1.3 * actual
    assert gpus in text


def test_estimate_of_a_jobs_scenario(capsys):
    """Jobs (issue 29): each job's folded program counted alone and in the shared run, summed; the
    run's sim.events counts both too. Two 16-GPU jobs interleaved on a 4:1 tree: TP 8 private in each
    node, each job's DP-2 all-reduces are the events."""
    path = os.path.join(ROOT, "scenarios", "jobs-interleaved-4to1.yaml")
    assert main(["run", path, "--estimate"]) == 0
    text = capsys.readouterr().out
    estimated = int(re.search(r"events\s+~([\d,]+)", text).group(1).replace(",", ""))
    actual = simulate(load_scenario(path), record_links=False).events
    assert 0.7 * actual <= estimated <= 1.3 * actual
    # each job (TP 8 x DP 2, its two nodes on the two leaves) folds whole: a DP step swaps the leaves
    assert re.search(r"jobs\s+2 on 32 GPUs \(2 simulated", text)
    assert re.search(r"memory\s+~\d+\.\d\d GB", text) and "wall time" in text


def test_estimate_gives_the_closed_form_iteration_near_the_run(capsys):
    # quickstart: the closed form of studies/rank.py (what `emulator search` ranks by), within 10 % of the run
    path = os.path.join(ROOT, "scenarios", "quickstart.yaml")
    assert main(["run", path, "--estimate"]) == 0
    text = capsys.readouterr().out
    from emulator.studies.rank import estimate_iteration

    sc = load_scenario(path)
    closed = estimate_iteration(sc).iteration_s
    actual = simulate(sc, record_links=False).iteration_time_s
    assert abs(closed - actual) <= 0.1 * actual
    assert re.search(r"iteration\s+~\S+ \S+ \(closed form, no contention: studies/rank.py\)", text)


def test_estimate_sees_a_fold_the_run_will_refuse(capsys):
    """DP 3 × PP 5 × TP 8 on leaves of 4 nodes (tests/test_folding_effect.py): the fold in effect
    (5 ranks, one per stage) is refused by the run, as a replica's transfer crosses a leaf where its
    representative's does not; the run simulates 3 × 5 = 15 ranks, and the estimate must say so,
    with the run's refusal, and about 3 times the folded program's events."""
    from test_folding_effect import scenario

    from emulator.run.simulation import simulate
    from emulator.studies.estimate import estimate

    sc = scenario(3, 5, 8, 4)
    text = estimate(sc)
    assert re.search(r"GPUs\s+120 \(15 simulated\)", text)
    assert "replicas across leaves not folded: p2p on (8, 32) has latency 1.205e-05 s" in text
    estimated = int(re.search(r"events\s+~([\d,]+)", text).group(1).replace(",", ""))
    actual = simulate(sc, record_links=False).events
    assert 0.7 * actual <= estimated <= 1.3 * actual


FAULT = "cluster.overrides=[{kind: gpu_slowdown, target: 'gpu:3', factor: 2}]"


def test_a_slow_run_is_announced_from_its_keys_without_building_it():
    from emulator.studies.estimate import pre_estimate, slow_warning

    sc = load_scenario(os.path.join(ROOT, "scenarios", "gpt3-175b-1024-a100.yaml"), [FAULT])
    pre = pre_estimate(sc)
    # an override turns folding off: all 1,024 GPUs simulated; 1536 / (1 × dp 16) = 96 microbatches;
    # 96 layers / pp 8 = 12 per rank: 1024 × 96 × 12 = 1,179,648 rank-layer-microbatches × 2.8 events
    # = 3,303,014 events; at 100,000 events/s 33.0 s, over the 30 s that is announced
    assert (pre.ranks, pre.simulated) == (1024, 1024)
    assert int(pre.events) == 3_303_014
    # --out: × 18.4 ops × 60 B = 1.302 GB
    assert round(pre.out_bytes / 1e9, 3) == 1.302
    text = slow_warning(sc, out=True)
    assert "all 1,024 GPUs are simulated (folding off: overrides" in text
    assert "~3,303,014 events" in text and "--out would write" in text and "leave out --out" in text
    # folded, the same layout simulates 8 ranks (one per stage): 8 × 96 × 12 × 2.8 = 25,804 events, quiet
    quiet = load_scenario(os.path.join(ROOT, "scenarios", "gpt3-175b-1024-a100.yaml"), [])
    assert pre_estimate(quiet).simulated == 8 and slow_warning(quiet, out=True) is None


def test_the_warning_goes_to_stderr_and_json_stdout_stays_one_object(capsys, monkeypatch):
    import emulator.run.simulation as simulation

    def stop(*args, **kwargs):  # the pre-estimate comes before the run: stop there, the big run is not the test
        raise KeyboardInterrupt

    monkeypatch.setattr(simulation, "simulate", stop)
    assert main(["run", os.path.join(ROOT, "scenarios", "gpt3-175b-1024-a100.yaml"), "--json", "--set", FAULT]) == 130
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("emulator: warning: this run may be slow (~3,303,014 events")
    assert main(["run", os.path.join(ROOT, "scenarios", "quickstart.yaml"), "--json"]) == 130  # quick: no warning
    assert capsys.readouterr().err == "emulator: interrupted\n"
