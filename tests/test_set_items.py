"""``--set`` and ``--vary`` on items of a list of sections (issue 29): ``jobs[1].start``,
``jobs.1.start``, ``jobs[name=b].placement``, ``cluster.overrides[0].at``, and their messages;
a job's start past the old 1 s cap."""
import os

import pytest

from emulator.errors import ScenarioError
from emulator.scenario import load_scenario
from emulator.studies.sweep import parse_vary

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOBS = os.path.join(ROOT, "scenarios", "jobs-two-disjoint-leaves.yaml")  # jobs a, b of 2 nodes on 4
FAULT = os.path.join(ROOT, "scenarios", "spine-link-failure.yaml")  # overrides[0]: link_fail at 0.2 s


def _error(path: str, override: str) -> str:
    with pytest.raises(ScenarioError) as info:
        load_scenario(path, [override])
    return str(info.value)


@pytest.mark.parametrize("override", ["jobs[1].start=0.5 s", "jobs.1.start=500 ms", "jobs[name=b].start=0.5 s",
                                      "jobs[ name = b ].start=0.5 s"])
def test_one_jobs_start(override):
    a, b = load_scenario(JOBS, [override]).jobs
    assert (a.start, b.start) == (0.0, 0.5)


def test_one_jobs_placement_by_name():
    a, b = load_scenario(JOBS, ["jobs[name=b].placement=[3, 2]"]).jobs
    assert a.nodes_assigned == (0, 1) and b.nodes_assigned == (3, 2)


def test_a_whole_item_and_its_removal():
    sc = load_scenario(JOBS, ["jobs[0]={name: c, nodes: 1, model: {preset: gpt3-1.3b, layers: 2}, "
                              "training: {global_batch: 8}, parallel: {tp: 8}}"])
    assert [j.name for j in sc.jobs] == ["c", "b"] and sc.jobs[0].nodes_assigned == (0,)
    assert [j.name for j in load_scenario(JOBS, ["jobs[name=a]="]).jobs] == ["b"]


def test_an_overrides_time():
    (fault,) = load_scenario(FAULT, ["cluster.overrides[0].at=0.3 s"]).cluster.overrides
    assert (fault.at, fault.until) == (0.3, 0.5)


def test_a_start_past_one_second():
    # one GPT-3 175B iteration takes seconds: a job may start after another's first iterations
    assert load_scenario(JOBS, ["jobs[1].start=90 s"]).jobs[1].start == 90.0


@pytest.mark.parametrize("value", ["2e7 s", "1e9 s"])
def test_a_start_too_far_has_one_message(value):
    # both past the unit parser's 1e7 s: the same message, whatever the magnitude
    assert _error(JOBS, f"jobs[1].start={value}") == (
        f'--set jobs[1].start={value}: jobs[1].start: expected a duration with a unit such as "2 us" or "1.5 ms", '
        f'got "{value}": more than 1e+07 s is not plausible')


@pytest.mark.parametrize("override, message", [
    ("jobs[5].start=1 s", "jobs[5]: jobs has 2 items (0 to 1), no item 5"),
    ("jobs[name=zz].start=1 s", "jobs[name=zz]: no item of jobs has name 'zz' (theirs: 'a', 'b')"),
    ("jobs[nam=b].start=1 s", 'jobs[nam=b]: an item of jobs has no key "nam"; did you mean "name"?'),
    ("jobs.start=1 s", "jobs: jobs is a list: name one item, e.g. --set 'jobs[0].start=...', or set it whole, "
                       "--set 'jobs=[...]'"),
    ("parallel[0].tp=1", "parallel[0]: parallel is not a list: give it without [...]"),
    ("cluster.overrides[0].at=1 s", "cluster.overrides[0]: cluster.overrides is not a list in the scenario, so it "
                                    "has no item to change: set it whole"),
    ("jobs[x].start=1 s", "expected an index such as jobs[0], an item by key such as jobs[name=a], or jobs[*] "
                          "(every item)"),
    ("jobs[1=2 s", 'expected key.path=value, e.g. "parallel.tp=4"'),
])
def test_bad_item_paths(override, message):
    # none suggests an unrelated example (the old message offered a gpu_slowdown override for jobs)
    text = _error(JOBS, override)
    assert text.startswith(f"--set {override}: ") and text.endswith(message), text
    assert "gpu_slowdown" not in text


def test_vary_splits_at_the_first_equals_outside_brackets():
    assert parse_vary("jobs[name=b].placement=contiguous,spread") == ("jobs[name=b].placement",
                                                                      ["contiguous", "spread"])
    assert parse_vary("jobs[1].start=0 s,0.5 s") == ("jobs[1].start", ["0 s", "0.5 s"])
