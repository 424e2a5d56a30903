"""emulator report: one self-contained HTML page of a run, from a scenario or a saved run folder.

The page is checked as HTML (tags balanced, every picture a PNG data URI, nothing loaded from
elsewhere), against summary.json (every marked number equal to the file's), and for its parts:
exposed communication per kind (outputs/exposure.py), memory per stage, the topology's tiers.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from htmlcheck import check_html

from emulator.cli import main
from emulator.outputs.exposure import exposure_by_lane, rank_exposure
from emulator.outputs.html import at, esc
from emulator.outputs.report_figures import tiers
from emulator.spans import Span

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = str(ROOT / "scenarios" / "quickstart.yaml")


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    monkeypatch.setenv("EMULATOR_PROGRESS", "0")


def span(rank, stream, kind, start, end, xfer=None, category=""):
    return Span(0, rank, stream, kind, "x", start, end, 0.0, 0.0, 0, 0, category, start if xfer is None else xfer)


def test_exposed_comm_is_split_by_lane_with_overlaps_shared_equally():
    # compute [0, 4); tp transfers [3, 6); dp [5, 8): [4, 5) tp alone (1 s), [5, 6) shared (0.5 each),
    # [6, 8) dp alone (2 s): tp 1.5, dp 2.5; together |[3, 8)| − |[3, 4)| = 4, the rank's exposed comm
    spans = [span(0, "compute", "compute", 0, 4), span(0, "tp", "collective", 3, 6),
             span(0, "dp", "collective", 1, 8, xfer=5)]  # issued at 1, transferring from 5: waiting is not comm
    assert rank_exposure(spans) == {"dp": 2.5, "tp": 1.5}


def test_the_optimizer_does_not_hide_communication_and_pipeline_streams_share_a_lane():
    # the optimizer [0, 2) is not compute: the dp transfer [1, 2) is exposed (1 s); pp_send_fwd [2, 3) and
    # pp_recv_bwd [2.5, 3.5) are one lane "pp": |[2, 3.5)| = 1.5 s. Two ranks, the second without comm: the
    # mean over ranks halves them
    spans = [span(0, "compute", "compute", 0, 2, category="optimizer"), span(0, "dp", "collective", 1, 2),
             span(0, "pp_send_fwd", "send", 2, 3), span(0, "pp_recv_bwd", "recv", 2.5, 3.5),
             span(1, "compute", "compute", 0, 3)]
    assert exposure_by_lane(spans) == {"pp": 0.75, "dp": 0.5}


def test_tiers_are_hops_from_the_nearest_gpu():
    nodes = {"g0": "gpu", "g1": "gpu", "n0": "nic", "leaf": "switch", "spine": "switch", "lone": "switch"}
    edges = [("g0", "n0"), ("n0", "leaf"), ("leaf", "spine"), ("spine", "leaf"), ("g1", "leaf")]
    # g1 → leaf is one hop, so leaf is tier 1 (not 2 through n0); spine 2; lone is reached by none: 3
    assert tiers(nodes, edges) == {"g0": 0, "g1": 0, "n0": 1, "leaf": 1, "spine": 2, "lone": 3}


def test_memory_per_stage_peaks_where_the_summary_says():
    from emulator.scenario.reader import load_scenario
    from emulator.workload.memory import memory_report, stage_memory

    sc = load_scenario(QUICKSTART)
    stages = stage_memory(sc)
    assert [m.stage for m in stages] == [0, 1]  # pp 2
    worst = memory_report(sc)
    assert worst.peak_bytes_per_gpu == max(m.peak_bytes_per_gpu for m in stages)
    for m in stages:
        assert m.peak_bytes_per_gpu == sum(m.breakdown.values())
    # 1F1B: stage 0 holds p − 0 = 2 micro-batches in flight, stage 1 one: twice the layers' activations,
    # plus stage 0's embedding dropout mask of each in-flight micro-batch, s·b·h·2 = 2048·4·2048·2 bytes
    assert stages[0].breakdown["activations"] == 2 * stages[1].breakdown["activations"] + 2048 * 4 * 2048 * 2


def _saved_run(tmp_path, *extra):
    out = tmp_path / "run"
    assert main(["run", QUICKSTART, "--out", str(out), *extra]) == 0
    return out


def _marked_values_equal_the_summary(page: str, summary: dict) -> int:
    c = check_html(page)
    for a in c.values:
        assert json.loads(a["data-value"]) == at(summary, a["data-key"]), a["data-key"]
    return len(c.values)


def test_report_of_a_saved_run_shows_summary_json_numbers_and_every_picture(tmp_path, capsys):
    run = _saved_run(tmp_path)
    capsys.readouterr()
    assert (run / "scenario.yaml").read_text().splitlines()[0].startswith("# run by emulator ")
    assert main(["report", str(run)]) == 0
    assert capsys.readouterr().out.strip() == str(run / "report.html")  # it prints the path it wrote
    page = (run / "report.html").read_text(encoding="utf-8")
    summary = json.loads((run / "summary.json").read_text())
    marked = _marked_values_equal_the_summary(page, summary)
    assert marked >= 20  # the cards, the summary table, the breakdown, the busiest links
    c = check_html(page)
    alts = " | ".join(alt for _, alt in c.images)
    assert len(c.images) == 4, alts  # breakdown, Gantt, memory per stage, links over the topology
    assert any(png == (run / "gantt.png").read_bytes() for png, _ in c.images)  # the run's own gantt.png
    assert "No picture" not in page
    assert "of it tp" in page and "of it pp" in page and "of it dp" in page
    assert "name: quickstart" in page and "run by emulator" in page


def test_the_lanes_add_up_to_the_summary_exposed_comm_before_any_scaling(tmp_path):
    from emulator.tools.run_folder import read_run

    run = read_run(str(_saved_run(tmp_path)))
    lanes = exposure_by_lane(run.spans)  # from trace.json's spans, times rounded to the picosecond
    assert set(lanes) == {"tp", "pp", "dp"}
    assert sum(lanes.values()) == pytest.approx(run.summary["breakdown_s"]["exposed_comm"], rel=1e-9)


def test_report_of_the_scenario_equals_the_report_of_its_saved_run(tmp_path, capsys):
    run = _saved_run(tmp_path)
    out = tmp_path / "direct.html"
    assert main(["report", QUICKSTART, "--out", str(out)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    _marked_values_equal_the_summary(out.read_text(encoding="utf-8"), summary)  # deterministic: the same numbers
    assert len(check_html(out.read_text(encoding="utf-8")).images) == 4
    again = tmp_path / "again.html"  # no clock, no host time (sim.wall_s is not shown): the same bytes
    assert main(["report", QUICKSTART, "--out", str(again)]) == 0
    assert again.read_bytes() == out.read_bytes()


def test_the_link_utilisation_read_back_from_trace_json_matches_the_summary(tmp_path):
    from emulator.network.topology import build_topology
    from emulator.scenario.reader import load_scenario
    from emulator.tools.run_folder import read_run

    run = read_run(str(_saved_run(tmp_path)))
    topo = build_topology(load_scenario(QUICKSTART).cluster)
    cap = dict(zip((f"{u}->{v}" for u, v in topo.links), topo.capacity))
    T = run.summary["iteration_time_s"]
    for b in run.summary["links"]["busiest"]:  # bytes integrated from the GB/s counters (rounded to 1 kB/s)
        assert run.link_bytes[b["link"]] == pytest.approx(b["bytes"], rel=1e-6)
        assert run.link_bytes[b["link"]] / (T * cap[b["link"]]) == pytest.approx(b["utilisation"], rel=1e-6)


def test_a_folder_without_gantt_or_scenario_still_renders_and_says_what_is_missing(tmp_path, capsys):
    run = _saved_run(tmp_path, "--no-gantt")
    os.unlink(run / "scenario.yaml")
    out = tmp_path / "r.html"
    assert main(["report", str(run), "--out", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    c = check_html(page)
    assert len(c.images) == 1  # the breakdown only: it needs summary.json alone
    assert "no gantt.png" in page and "no scenario.yaml" in page


def test_user_text_is_escaped(tmp_path, capsys):
    text = Path(QUICKSTART).read_text().replace("name: quickstart", 'name: "<script>alert(1)</script>\\u202e&"')
    scenario = tmp_path / "evil.yaml"
    scenario.write_text(text)
    out = tmp_path / "evil.html"
    assert main(["report", str(scenario), "--out", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert "<script>" not in page and "\u202e" not in page
    assert esc("<script>alert(1)</script>\u202e&") == "&lt;script&gt;alert(1)&lt;/script&gt;\\u202e&amp;"
    assert "&lt;script&gt;alert(1)&lt;/script&gt;\\u202e&amp;" in page
    check_html(page)


def test_bad_sources_exit_2_with_one_line(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nosuch.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert "nosuch.yaml" in err and len(err.splitlines()) == 1
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["report", str(empty)]) == 2
    err = capsys.readouterr().err.strip()
    assert "no summary.json" in err and len(err.splitlines()) == 1
    run = _saved_run(tmp_path)
    assert main(["report", str(run), "--set", "parallel.tp=4"]) == 2
    assert "--set needs a scenario" in capsys.readouterr().err


def _chromium() -> str | None:
    return next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


@pytest.mark.skipif(_chromium() is None, reason="no chromium binary on PATH (Debian: apt-get install chromium); "
                                               "the page is still checked as HTML by the other tests")
def test_the_report_renders_in_a_real_browser(tmp_path):
    import subprocess

    import numpy as np
    from matplotlib.image import imread

    run = _saved_run(tmp_path)
    assert main(["report", str(run)]) == 0
    shot = tmp_path / "shot.png"
    subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1280,3000", f"--screenshot={shot}", (run / "report.html").as_uri()],
                   capture_output=True, timeout=120, check=True)
    pixels = imread(str(shot))[..., :3]
    assert pixels.shape[:2] == (3000, 1280)
    # not blank: the page's pictures put thousands of pixels far from white, in several colours
    dark = (pixels.sum(axis=2) < 1.5).sum()
    assert dark > 10_000
    assert len(np.unique((pixels * 15).round().reshape(-1, 3), axis=0)) > 50
