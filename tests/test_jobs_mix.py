"""Job mixes (issue 29): ``count`` copies NAME-0..NAME-(N-1) placed by the job's policy, ``stagger``
between their starts, and the summary's ``mix``: slowdown quantiles per mix and per entry, and the
cluster's goodput. The 1 GB all-reduce on one-GPU nodes of tests/test_jobs.py: alone over a 4:1
uplink S / 50 GB/s = 20 ms, two at once 40 ms."""
import dataclasses

import pytest
from helpers import uplink_mix

from emulator.errors import ScenarioError
from emulator.outputs.jobs import quantile
from emulator.outputs.summary import summarize
from emulator.run.simulation import simulate
from emulator.scenario import load_scenario, load_scenario_text


def _mix(tmp_path, entry: str):
    return load_scenario(uplink_mix(tmp_path, "mix", [f"{{name: ar, nodes: 2, placement: spread, "
                                                       f"workload: {{trace: ar.json}}, {entry}}}"]))


def test_copies_are_named_placed_and_staggered(tmp_path):
    sc = _mix(tmp_path, "count: 2, start: 1 ms, stagger: 25 ms")
    assert [(j.name, j.entry, j.nodes_assigned, j.start) for j in sc.jobs] == [
        ("ar-0", "ar", (0, 2), 0.001), ("ar-1", "ar", (1, 3), 0.001 + 0.025)]  # spread: one node per leaf in turn


def test_staggered_copies_apart_in_time(tmp_path):
    # ar-0 runs 1..21 ms, ar-1 from 26 ms: never at once, slowdown 1 each, goodput 1
    s = summarize(simulate(_mix(tmp_path, "count: 2, start: 1 ms, stagger: 25 ms")))
    assert s["mix"]["slowdown"] == {"p50": 1.0, "p90": 1.0, "max": 1.0}
    assert s["mix"]["slowdown_by_job"] == {"ar": {"p50": 1.0, "p90": 1.0, "max": 1.0, "count": 2}}
    assert s["mix"]["goodput"] is None  # traces carry no tokens


def test_copies_at_once_share_the_uplink(tmp_path):
    s = summarize(simulate(_mix(tmp_path, "count: 2")))
    for q in ("p50", "p90", "max"):
        assert s["mix"]["slowdown"][q] == pytest.approx(2.0, rel=1e-12)  # 40 ms / 20 ms


def test_goodput_of_a_model_mix(tmp_path):
    # the two copies as GPT-3 125M jobs (DP 2): goodput = Σ tokens/T shared over Σ tokens/T alone,
    # from the rows' own figures (tokens/T_alone = tokens/T · T/T_alone = tokens_per_s · slowdown)
    sc = _mix(tmp_path, "count: 2")
    model = load_scenario_text("name: m\ncluster: {nodes: 2, node: {gpu: A100-SXM4-80GB, gpus_per_node: 1, "
                               "nics: 1, nic_bandwidth: 100 GB/s, intra_bandwidth: 1000 GB/s}}\nmodel: {preset: gpt3-125m, "
                               "layers: 2}\ntraining: {global_batch: 2}\n", "m.yaml")
    jobs = tuple(dataclasses.replace(j, workload=model.workload, model=model.model, training=model.training,
                                     parallel=model.parallel) for j in sc.jobs)
    s = summarize(simulate(dataclasses.replace(sc, jobs=jobs)))
    rows = s["jobs"]
    shared = sum(r["tokens_per_s"] for r in rows)
    alone = sum(r["tokens_per_s"] * r["slowdown"] for r in rows)
    assert shared > 0 and s["mix"]["goodput"] == pytest.approx(shared / alone, rel=1e-12)
    assert 0 < s["mix"]["goodput"] <= 1.0


def test_quantiles():
    # [1, 2, 3, 4]: p50 h = 1.5 -> 2 + 0.5·1 = 2.5; p90 h = 2.7 -> 3 + 0.7·1 = 3.7
    assert quantile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert quantile([4.0, 1.0, 3.0, 2.0], 0.9) == pytest.approx(3.7, rel=1e-15)
    assert quantile([7.0], 0.9) == 7.0


def test_stagger_needs_count(tmp_path):
    with pytest.raises(ScenarioError) as info:
        _mix(tmp_path, "stagger: 5 ms")
    assert str(info.value).endswith("jobs[0].stagger: stagger is read only with count (copy i starts at start + "
                                    "i x stagger)")


def test_a_copy_that_does_not_fit_names_its_entry_line(tmp_path):
    with pytest.raises(ScenarioError) as info:
        _mix(tmp_path, "count: 3")
    assert str(info.value).endswith(":8: jobs[2].nodes: job 'ar-2' needs 2 nodes but only 0 of the cluster's 4 are "
                                    "free (the other jobs hold the rest)")
