"""emulator validate: cases CSV → predictions, errors, MAPE per group, chart, exit codes."""
from pathlib import Path

import pytest

from emulator.cli import main
from emulator.tools.validate import (
    Case,
    Outcome,
    ValidationError,
    mape,
    predict,
    read_cases,
    summary_value,
)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "validate" / "cases.csv"
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
HEADER = "case,group,scenario,set,metric,measured,source\n"


def write(tmp_path: Path, body: str, header: str = HEADER) -> str:
    p = tmp_path / "cases.csv"
    p.write_text(header + body)
    return str(p)


def case(group: str, measured: float, name: str = "c") -> Case:
    return Case(line=2, case=name, group=group, scenario="s.yaml", overrides=(), metric="m",
                measured=measured, source="")


def test_rows_are_read_with_units_overrides_and_paths(tmp_path):
    path = write(tmp_path, "a,g,sub/s.yaml,parallel.tp=2; training.micro_batch=4,layer_forward_s,7.7 ms,src\n"
                           "b,,s.yaml,,tokens_per_s,1.5e5,\n")
    a, b = read_cases(path)
    assert a.measured == pytest.approx(7.7e-3, rel=1e-15)  # 7.7 ms in seconds
    assert a.overrides == ("parallel.tp=2", "training.micro_batch=4")
    assert a.scenario == str(tmp_path / "sub" / "s.yaml")  # relative to the CSV's folder
    assert (b.group, b.measured, b.line) == ("all", 150000.0, 3)  # no group: pooled in "all"


@pytest.mark.parametrize("body, header, says", [
    ("a,g,s.yaml,,iteration_time_s,fast,\n", HEADER, ":2: column 'measured': expected a positive time"),
    ("a,g,s.yaml,,tokens_per_s,7 ms,\n", HEADER, ":2: column 'measured': expected a positive number"),
    ("a,g,s.yaml,,tokens_per_s,-3,\n", HEADER, ":2: column 'measured': expected a positive number"),
    ("a,g,s.yaml,,tokens_per_s,nan,\n", HEADER, ":2: column 'measured': expected a positive number"),
    ("a,g,s.yaml,tp 2,tokens_per_s,3,\n", HEADER, ":2: column 'set': expected KEY.PATH=VALUE"),
    ("a,g,,,tokens_per_s,3,\n", HEADER, ":2: column 'scenario' is empty"),
    ("a,g,s.yaml,,tokens_per_s\n", HEADER, ":2: 5 fields, the header has 7"),
    ("a,s.yaml,3\n", "case,scenario,measured\n", ":1: missing column(s) metric"),
    ("", HEADER, "no cases below the header"),
])
def test_a_malformed_file_names_file_line_and_column(tmp_path, body, header, says):
    path = write(tmp_path, body, header)
    with pytest.raises(ValidationError) as err:
        read_cases(path)
    assert str(err.value).startswith(path) and says in str(err.value)


def test_cli_malformed_csv_exits_2_with_one_line(tmp_path, capsys):
    path = write(tmp_path, "a,g,s.yaml,,iteration_time_s,fast,\n")
    assert main(["validate", path]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{path}:2: column 'measured'" in err


def test_summary_value_follows_dotted_paths_into_lists():
    s = {"iteration_time_s": 1.5, "replay": [{"x": 2}, {"x": 3.5}], "name": "n", "flag": True}
    assert summary_value(s, "iteration_time_s") == 1.5
    assert summary_value(s, "replay.1.x") == 3.5
    assert summary_value(s, "replay.2.x") is None  # no third item
    assert summary_value(s, "name") is None  # not a number
    assert summary_value(s, "flag") is None  # a bool is not a measurement


def test_mape_per_group_by_hand():
    out = [Outcome(case("a", 10.0), 11.0),   # +10 %
           Outcome(case("a", 10.0), 8.0),    # −20 %
           Outcome(case("b", 4.0), 4.2)]     # +5 %
    # a: (10 + 20) / 2 = 15 %; b: 5 %
    assert mape(out) == pytest.approx({"a": 15.0, "b": 5.0}, rel=1e-12)


def test_each_scenario_and_set_is_run_once():
    calls = []

    def run(scenario, overrides):
        calls.append((scenario, overrides))
        return {"iteration_time_s": 2.0, "tokens_per_s": 8.0}, []

    cases = [Case(2, "x", "g", "s.yaml", (), "iteration_time_s", 1.0, ""),
             Case(3, "y", "g", "s.yaml", (), "tokens_per_s", 4.0, ""),
             Case(4, "z", "g", "s.yaml", ("parallel.tp=2",), "tokens_per_s", 4.0, "")]
    out = predict(cases, run)
    assert calls == [("s.yaml", ()), ("s.yaml", ("parallel.tp=2",))]
    assert [o.error for o in out] == pytest.approx([1.0, 1.0, 1.0])  # 2/1 − 1, 8/4 − 1, 8/4 − 1


def test_a_metric_the_run_lacks_is_an_error():
    with pytest.raises(ValidationError, match="metric 'replay.0.x': the run has no such value"):
        predict([Case(2, "x", "g", "s.yaml", (), "replay.0.x", 1.0, "")], lambda s, o: ({}, []))


def test_quickstart_twice_measured_fails_max_error(tmp_path, capsys):
    from emulator.outputs.summary import summarize
    from emulator.run.simulation import simulate
    from emulator.scenario.reader import load_scenario

    t = summarize(simulate(load_scenario(QUICKSTART), record_links=False))["iteration_time_s"]
    # measured = 2 t: error t / 2t − 1 = −50 %, MAPE 50 % > 10 %
    path = write(tmp_path, f"q,quick,{QUICKSTART},,iteration_time_s,{2 * t!r},\n")
    assert main(["validate", path, "--max-error", "10"]) == 1
    out = capsys.readouterr().out
    assert "-50.00%" in out and "group 'quick': MAPE 50.00% > --max-error 10%" in out
    # the same measurement, exactly: 0 % error passes
    path = write(tmp_path, f"q,quick,{QUICKSTART},,iteration_time_s,{t!r},\n")
    assert main(["validate", path, "--max-error", "0"]) == 0


def test_the_example_runs_and_writes_its_chart(tmp_path, capsys):
    out = tmp_path / "val"
    assert main(["validate", str(EXAMPLE), "--out", str(out), "--max-error", "5"]) == 0
    text = capsys.readouterr().out
    # layer 0 of GPT-22B, no SP, no recompute: 7.8686 ms forward against the 7.7 ms measured (+2.19 %),
    # the figure tests/test_calibration.py derives from the kernel fit and the TP all-reduces
    assert "22b fwd" in text and "+2.19%" in text
    assert {p.name for p in out.iterdir()} == {"validation.csv", "validation.png", "validation.svg"}
    rows = (out / "validation.csv").read_text().splitlines()
    assert rows[0] == "case,group,metric,measured,predicted,error" and len(rows) == 1 + 19


def test_out_that_is_a_file_is_refused_before_running(tmp_path, capsys):
    blocker = tmp_path / "f"
    blocker.write_text("x")
    assert main(["validate", str(EXAMPLE), "--out", str(blocker)]) == 2
    assert f"--out {blocker}: exists and is a file, not a folder" in capsys.readouterr().err
