"""Studies over jobs (issue 29): a sweep of placement policies over every job of a mix (``jobs[*]``),
the per-job slowdown plot against the varied key, and one row's shared links' load by job.

The mix of tests/test_jobs.py: two jobs of one 1 GB all-reduce on 2 one-GPU nodes each, a fat-tree of
2 leaves of 2 nodes at 4:1 (leaf uplink 2 · 100 GB/s / 4 = 50 GB/s). Contiguous: each job in its
leaf, 10 ms at its NIC's 100 GB/s, slowdown 1. Spread: both cross the uplinks, 20 ms alone and
40 ms together, slowdown 2."""

import pytest
from helpers import uplink_mix

from emulator.cli import main
from emulator.scenario import load_scenario
from emulator.studies.jobplot import link_loads
from emulator.studies.store import ResultStore


def _mix(tmp_path) -> str:
    return uplink_mix(tmp_path, "mix", ["{name: a, nodes: 2, workload: {trace: ar.json}}",
                                        "{name: b, nodes: 2, workload: {trace: ar.json}}"])


def test_every_item(tmp_path):
    sc = load_scenario(_mix(tmp_path), ["jobs[*].placement=spread"])
    assert [j.nodes_assigned for j in sc.jobs] == [(0, 2), (1, 3)]


def test_sweep_and_plots_of_placement_policies(tmp_path):
    path, db = _mix(tmp_path), str(tmp_path / "r.sqlite")
    assert main(["sweep", path, "--vary", "jobs[*].placement=contiguous,spread", "--db", db]) == 0
    with ResultStore(db, create=False) as store:
        rows = {r.varied["jobs[*].placement"]: r for r in store.rows()}
    slow = {k: [j["slowdown"] for j in r.summary["jobs"]] for k, r in rows.items()}
    assert slow["contiguous"] == [1.0, 1.0] and slow["spread"] == pytest.approx([2.0, 2.0], rel=1e-12)
    assert rows["spread"].summary["mix"]["slowdown"]["max"] == pytest.approx(2.0, rel=1e-12)
    out = tmp_path / "slow.png"
    assert main(["plot", "--db", db, "--jobs", "--out", str(out)]) == 0
    assert out.stat().st_size > 0 and (tmp_path / "slow.svg").exists()
    # each job moves S = 1 GB over each uplink per 40 ms iteration: 1e9 / (50e9 · 0.040) = 0.5 of it
    links, names, grid = link_loads(rows["spread"], 16)
    assert names == ["a", "b"] and len(links) == 4
    assert [x for row in grid for x in row] == pytest.approx([0.5] * 8, rel=1e-12)
    heat = tmp_path / "links.png"
    assert main(["plot", "--db", db, "--shared-links", "--where", "jobs[*].placement=spread",
                 "--out", str(heat)]) == 0
    assert heat.stat().st_size > 0
    assert main(["plot", "--db", db, "--shared-links", "--out", str(heat)]) == 2  # two rows match


def test_every_item_of_a_missing_list(tmp_path, capsys):
    path = tmp_path / "one.yaml"
    path.write_text("name: x\ncluster: {nodes: 1, node: dgx-a100}\nmodel: {preset: gpt3-1.3b}\n"
                    "training: {global_batch: 8}\n")
    assert main(["run", str(path), "--set", "cluster.overrides[*].at=1 s"]) == 2
    assert capsys.readouterr().err.strip().endswith("cluster.overrides[*]: overrides has no items in the scenario "
                                                    "to set")
