"""`emulator run --estimate` counts the events before running, close to what the run does."""
import os
import re

from emulator.cli import main
from emulator.scenario import load_scenario
from emulator.simulation import simulate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_estimate_is_near_the_actual_event_count(capsys):
    path = os.path.join(ROOT, "scenarios", "quickstart.yaml")
    assert main(["run", path, "--estimate"]) == 0
    text = capsys.readouterr().out
    estimated = int(re.search(r"events\s+~([\d,]+)", text).group(1).replace(",", ""))
    actual = simulate(load_scenario(path), record_links=False).events
    # an estimate, not a count: within 30 % on this case
    assert 0.7 * actual <= estimated <= 1.3 * actual
    assert "8 (2 simulated)" in text


def test_estimate_of_a_jobs_scenario_says_why_it_cannot(capsys):
    from emulator.cli import main

    assert main(["run", "scenarios/jobs-two-disjoint-leaves.yaml", "--estimate"]) == 2
    assert "--estimate covers one workload; this scenario has 2 jobs" in capsys.readouterr().err
