"""emulator compare: runs side by side, from scenario files, saved run folders, or one scenario with
``--set`` variants; the differences and ratios are each run's against the first."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from htmlcheck import check_html

from emulator.cli import main
from emulator.outputs.comparison import comparison_rows, comparison_text
from emulator.tools.compare import columns

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = str(ROOT / "scenarios" / "quickstart.yaml")
ZERO3 = str(ROOT / "scenarios" / "zero3-llama2-13b-16-a100.yaml")


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    monkeypatch.setenv("EMULATOR_PROGRESS", "0")


def _json(capsys, argv):
    capsys.readouterr()
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def _summary(capsys, path, *sets):
    return _json(capsys, ["run", path, "--json", *[a for s in sets for a in ("--set", s)]])


def _check_rows(data, summaries):
    rows = {r["key"]: r for r in data["rows"]}
    t = [s["iteration_time_s"] for s in summaries]
    assert rows["iteration_time_s"]["values"] == t
    for i in range(1, len(t)):
        assert rows["iteration_time_s"]["differences"][i - 1] == t[i] - t[0]
        assert rows["iteration_time_s"]["ratios"][i - 1] == t[i] / t[0]
    assert rows["mfu"]["values"] == [s["mfu"] for s in summaries]
    assert rows["memory.peak_bytes_per_gpu"]["values"] == [s["memory"]["peak_bytes_per_gpu"] for s in summaries]
    for part in ("compute", "exposed_comm", "bubble", "other"):
        assert rows[f"breakdown_s.{part}"]["values"] == [s["breakdown_s"][part] for s in summaries]


def test_variants_expand_every_scenario_and_leave_run_folders_alone(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    assert columns(["a.yaml", str(folder)], [["x=1", "y=2"], []]) == [
        ("a.yaml --set x=1 y=2", "a.yaml", ["x=1", "y=2"]), ("a.yaml (as written)", "a.yaml", []),
        (str(folder), str(folder), [])]


def test_compare_two_scenarios(capsys, tmp_path):
    data = _json(capsys, ["compare", QUICKSTART, ZERO3, "--json"])
    assert [r["scenario"] for r in data["runs"]] == ["quickstart", "zero3-llama2-13b-16-a100"]
    _check_rows(data, [_summary(capsys, QUICKSTART), _summary(capsys, ZERO3)])


def test_compare_two_saved_runs_prints_the_table_and_writes_the_page(capsys, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["run", QUICKSTART, "--out", str(a)]) == 0
    assert main(["run", QUICKSTART, "--out", str(b), "--set", "parallel.tp=4", "--set", "parallel.dp=1"]) == 0
    sa, sb = (json.loads((x / "summary.json").read_text()) for x in (a, b))
    data = _json(capsys, ["compare", str(a), str(b), "--json"])
    _check_rows(data, [sa, sb])
    out = tmp_path / "c.html"
    assert main(["compare", str(a), str(b), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0] == f"A  {a}" and text.splitlines()[1] == f"B  {b}"
    assert "step time" in text and "B / A" in text
    # the ratio of the step times, printed to three places, is the summaries' own ratio
    assert f"{sb['iteration_time_s'] / sa['iteration_time_s']:.3f}×" in text
    page = out.read_text(encoding="utf-8")
    c = check_html(page)
    assert len(c.images) == 1  # the breakdowns as stacked bars
    assert {(v["data-key"], v["data-run"]) for v in c.values} >= {("iteration_time_s", "0"), ("iteration_time_s", "1")}


def test_one_scenario_with_two_set_variants_is_one_line(capsys, tmp_path):
    # the same job on two fabrics: a fat-tree with one node per leaf, full bisection or 4:1 oversubscribed
    v1 = ["cluster.fabric.kind=fat_tree", "cluster.fabric.leaf_size=1"]
    v2 = [*v1, "cluster.fabric.oversubscription=4"]
    data = _json(capsys, ["compare", ZERO3, "--set", *v1, "--set", *v2, "--json"])
    assert [r["set"] for r in data["runs"]] == [v1, v2]
    s1, s2 = _summary(capsys, ZERO3, *v1), _summary(capsys, ZERO3, *v2)
    _check_rows(data, [s1, s2])
    assert s2["breakdown_s"]["exposed_comm"] > s1["breakdown_s"]["exposed_comm"]  # ZeRO-3's traffic crosses leaves
    out = tmp_path / "v.html"
    assert main(["compare", ZERO3, "--set", *v1, "--set", *v2, "--out", str(out)]) == 0
    check_html(out.read_text(encoding="utf-8"))


def test_the_text_table_gives_differences_and_ratios_against_the_first():
    a = {"iteration_time_s": 2.0, "tokens_per_s": 1000.0, "mfu": 0.5, "breakdown_s": {"compute": 1.0}}
    b = {"iteration_time_s": 1.5, "tokens_per_s": 1500.0, "mfu": 0.25, "breakdown_s": {"compute": 0.0}}
    rows = {r["key"]: r for r in comparison_rows([a, b])}
    assert rows["iteration_time_s"]["differences"] == [-0.5] and rows["iteration_time_s"]["ratios"] == [0.75]
    assert rows["breakdown_s.compute"]["ratios"] == [0.0]
    assert "memory.peak_bytes_per_gpu" not in rows  # neither run has it
    text = comparison_text(["a", "b"], [a, b])
    line = next(x for x in text.splitlines() if x.startswith("step time"))
    assert line.split() == ["step", "time", "2.0", "s", "1.5", "s", "−500.0", "ms", "0.750×"]
    line = next(x for x in text.splitlines() if x.startswith("MFU"))
    assert line.split() == ["MFU", "50.0%", "25.0%", "−25.0", "pt", "0.500×"]  # 25 − 50 = −25 points, 0.25/0.5


def test_too_few_runs_and_a_misplaced_set_exit_2(capsys):
    assert main(["compare", QUICKSTART]) == 2
    assert "two runs or more" in capsys.readouterr().err
    assert main(["compare", QUICKSTART, "--set", "parallel.tp=4", "nosuch.yaml"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--set nosuch.yaml: expected KEY.PATH=VALUE" in err and len(err.splitlines()) == 1
