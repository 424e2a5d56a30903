"""`emulator run --estimate` counts the events before running, close to what the run does.

Its wall time is measured against the run's in benchmarks/estimate_check.py (no timed test here):
what is tested is the event count, which is deterministic, and the formula, by hand."""
import glob
import os
import re

import pytest

from emulator.cli import main
from emulator.run.simulation import simulate
from emulator.scenario import load_scenario

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the scenarios `emulator run` runs in under ~10 s (live and collective ones run elsewhere); the two
# slow ones (Qwen3 235B, DeepSeek-V3: ~6 and ~9 s, twice over with the estimate) are in
# benchmarks/estimate_check.py
SLOW = {"qwen3-235b-256-h100.yaml", "deepseek-v3-1024-h100.yaml"}


def _runnable() -> list[str]:
    out = []
    for path in sorted(glob.glob(os.path.join(ROOT, "scenarios", "*.yaml"))):
        name = os.path.basename(path)
        if name.startswith("live-") or name in SLOW:
            continue
        sc = load_scenario(path)
        if sc.model is not None or sc.workload.trace or sc.jobs:
            out.append(name)
    return out


@pytest.mark.parametrize("name", _runnable())
def test_the_estimated_events_are_within_2x_of_the_run(name):
    """Every quick scenario: the events --estimate counts are within 2x of the run's (a run of fewer
    than 20 events, which cost nothing, within 20). Both are deterministic."""
    from emulator.studies.estimate import count

    sc = load_scenario(os.path.join(ROOT, "scenarios", name))
    estimated = count(sc).events
    actual = simulate(sc, record_links=False).events
    if actual < 20:
        assert abs(estimated - actual) <= 20, (estimated, actual)
    else:
        assert actual / 2 <= estimated <= 2 * actual, (estimated, actual)


def test_the_estimate_formula_by_hand(monkeypatch):
    """A 2-stage GPipe trace, one stage per node: 16 kernels, each on a GPU it has alone (timed:
    no event), and 8 sends (the recvs are their other ends), each one instance of one phase of one
    flow: its start and its end, 2 events: 16 events, 8 instances, 2 ranks simulated, no phase of
    several flows. On the reference machine (machine_factor 1): 16 × 5.7 µs + 8 × log2(2 × 2) × 3.5 µs
    = 91.2 + 56 = 147.2 µs on the clock, plus 0.30 s of start-up and the build and preparation timed."""
    import emulator.studies.estimate as est

    monkeypatch.setattr(est, "machine_factor", lambda: 1.0)
    sc = load_scenario(os.path.join(ROOT, "scenarios", "trace-pipeline-two-nodes.yaml"))
    e = est.count(sc)
    assert (e.events, e.simulated, e.gpus) == (16, 2, 2)
    assert e.wall_s - e.build_s - e.prepare_s == pytest.approx(0.30 + 147.2e-6, rel=1e-9)
    assert simulate(sc, record_links=False).events == 16
    # with --out every load change is seen at its time: no flow runs ahead of its latency, each send
    # has a latency timer too, 3 events: 24, as the run with its links recorded
    assert est.count(sc, out=True).events == 24 == simulate(sc, record_links=True).events


def test_a_dispatch_issued_under_another_collective_is_counted_on_the_clock():
    """``_met``: a rank's token exchange issued while another of its collectives is in flight (from its
    place to that of the first op of the rank on another stream that waits for it) runs on the clock.
    Rank 0: fwd (0), a gradient reduce-scatter on "dp" after it (1), a dispatch on "ep" (2: issued with
    the reduce-scatter in flight, met), a kernel after it (3), the optimizer waiting for the
    reduce-scatter (4: the reduce-scatter's flight ends here), a dispatch after it (5: not met). A
    private reduce-scatter (on no fabric link) puts none on the clock."""
    from types import SimpleNamespace

    from emulator.program import COLLECTIVE, COMPUTE, Op
    from emulator.run.wiring import wire
    from emulator.studies.estimate import _met

    a2a = "all_to_all"
    ops = [Op(0, 0, COMPUTE, duration=1e-3), Op(1, 0, COLLECTIVE, "dp", (0,), collective="reduce_scatter",
                                                group=(0, 8)),
           Op(2, 0, COLLECTIVE, "ep", (0,), collective=a2a, group=(0, 1)), Op(3, 0, COMPUTE, deps=(2,)),
           Op(4, 0, COMPUTE, deps=(1,)), Op(5, 0, COLLECTIVE, "ep", (4,), collective=a2a, group=(0, 1))]
    off, to, _ = wire(ops)
    succ = [tuple(to[a:b]) for a, b in zip(off, off[1:])]
    alone = {"reduce_scatter": 1e-3, a2a: 1e-4}  # each collective's seconds run alone
    runs = SimpleNamespace(alone_run=lambda c, g, r, b: SimpleNamespace(duration=alone[c]))
    engine = SimpleNamespace(tops=ops, succ=succ, private=[False] * 6, timed=[False] * 6, runs=runs)
    assert _met(engine) == {2}  # type: ignore[arg-type]
    engine.private[1] = True
    assert _met(engine) == set()  # type: ignore[arg-type]


def test_a_collective_the_kernels_outlast_meets_no_dispatch():
    """``_met`` in time: a kernel of 2 ms between the reduce-scatter (1 ms alone, issued at 1 ms) and the dispatch
    outlasts it, so the dispatch (issued at 3 ms) meets nothing; a reduce-scatter of 3 ms (to 4 ms) it meets."""
    from types import SimpleNamespace

    from emulator.program import COLLECTIVE, COMPUTE, Op
    from emulator.run.wiring import wire
    from emulator.studies.estimate import _met

    a2a = "all_to_all"
    ops = [Op(0, 0, COMPUTE, duration=1e-3), Op(1, 0, COLLECTIVE, "dp", (0,), collective="reduce_scatter",
                                                group=(0, 8)),
           Op(2, 0, COMPUTE, duration=2e-3, deps=(0,)), Op(3, 0, COLLECTIVE, "ep", (2,), collective=a2a, group=(0, 1)),
           Op(4, 0, COMPUTE, deps=(1, 3), duration=1e-3)]
    off, to, _ = wire(ops)
    succ = [tuple(to[a:b]) for a, b in zip(off, off[1:])]
    for rs, met in ((1e-3, set()), (3e-3, {3})):
        alone = {"reduce_scatter": rs, a2a: 1e-4}
        runs = SimpleNamespace(alone_run=lambda c, g, r, b, alone=alone: SimpleNamespace(duration=alone[c]))
        engine = SimpleNamespace(tops=ops, succ=succ, private=[False] * 5, timed=[False] * 5, runs=runs)
        assert _met(engine) == met  # type: ignore[arg-type]


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
    # 96 layers / pp 8 = 12 per rank: 1024 × 96 × 12 = 1,179,648 rank-layer-microbatches × 1.4 events
    # = 1,651,507 events, and as many instances; 0.30 s + 1,179,648 × 2.1 µs (2.477 s) + 1,651,507.2 ×
    # 5.7 µs (9.414 s) + 1,651,507.2 × log2(2 × 1024) = 11 × 3.5 µs (63.583 s) = 75.774 s, over the 30 s
    assert (pre.ranks, pre.simulated) == (1024, 1024)
    assert int(pre.events) == 1_651_507
    assert round(pre.wall_s, 3) == 75.774
    # --out: × 18.4 ops × 60 B = 1.302 GB
    assert round(pre.out_bytes / 1e9, 3) == 1.302
    text = slow_warning(sc, out=True)
    assert "all 1,024 GPUs are simulated (folding off: overrides" in text
    assert "~1,651,507 events, ~75.8 s" in text and "--out would write" in text and "leave out --out" in text
    # the speed guide quotes its start
    with open(os.path.join(ROOT, "docs", "guides", "speed.md"), encoding="utf-8") as fh:
        quoted = next(line for line in fh if line.startswith("emulator: warning: this run may be slow"))
    assert f"emulator: {text}".startswith(quoted.rstrip().removesuffix("..."))
    # folded, the same layout simulates 8 ranks (one per stage): 8 × 96 × 12 = 9,216 units × 1.4 = 12,902
    # events (the run: 12,296): 0.30 + 9,216 × 2.1 µs (0.019) + 12,902.4 × 5.7 µs (0.074) + 12,902.4 ×
    # log2(2 × 8) = 4 × 3.5 µs (0.181) = 0.574 s: quiet
    quiet = load_scenario(os.path.join(ROOT, "scenarios", "gpt3-175b-1024-a100.yaml"), [])
    assert pre_estimate(quiet).simulated == 8 and slow_warning(quiet, out=True) is None
    assert round(pre_estimate(quiet).wall_s, 3) == 0.574


def test_the_warning_goes_to_stderr_and_json_stdout_stays_one_object(capsys, monkeypatch):
    import emulator.run.simulation as simulation

    def stop(*args, **kwargs):  # the pre-estimate comes before the run: stop there, the big run is not the test
        raise KeyboardInterrupt

    monkeypatch.setattr(simulation, "simulate", stop)
    assert main(["run", os.path.join(ROOT, "scenarios", "gpt3-175b-1024-a100.yaml"), "--json", "--set", FAULT]) == 130
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("emulator: warning: this run may be slow (~1,651,507 events")
    assert main(["run", os.path.join(ROOT, "scenarios", "quickstart.yaml"), "--json"]) == 130  # quick: no warning
    assert capsys.readouterr().err == "emulator: interrupted\n"


def test_the_faq_quotes_what_the_measured_table_holds():
    """docs/faq.md says the wall time is within 0.7-1.4x of the run's CPU time on every scenario: the
    table benchmarks/estimate_check.py --save wrote (benchmarks/results/estimate.json) holds a row for
    every scenario `emulator run` runs, each within that."""
    import json

    with open(os.path.join(ROOT, "docs", "faq.md"), encoding="utf-8") as fh:
        faq = " ".join(fh.read().split())
    assert "within 0.7-1.4x of the run's CPU time on every scenario in `scenarios/`" in faq
    with open(os.path.join(ROOT, "benchmarks", "results", "estimate.json"), encoding="utf-8") as fh:
        cases = json.load(fh)["cases"]
    for name in _runnable() + sorted(SLOW):
        row = cases[name[:-len(".yaml")]]
        assert 0.7 <= row["estimated_wall_s"] / row["cpu_s"] <= 1.4, (name, row)
