"""The one progress display (tqdm on stderr): silent off a terminal unless asked, on when asked,
off when asked on a terminal, and never a change to stdout or to an output file."""
import io
import os
import subprocess
import sys

from test_sweep import degrade, write_tiny

import emulator.outputs.progress
import emulator.run.engine
from emulator.cli import main
from emulator.outputs.progress import RunProgress, points_bar, wanted

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICK = os.path.join(ROOT, "scenarios", "quickstart.yaml")


class Terminal(io.StringIO):
    def isatty(self):
        return True


def _sweep_bar(stream):
    bar = points_bar(5, "sweep", stream)
    bar.reset(total=3)  # run_points: 2 of the 5 points were already in the store
    for _ in range(3):
        bar.update(1)
    bar.close()
    return stream.getvalue()


def test_silent_off_a_terminal_unless_asked(monkeypatch):
    monkeypatch.delenv("EMULATOR_PROGRESS", raising=False)
    assert _sweep_bar(io.StringIO()) == ""
    run = RunProgress(delay_s=0, stream=(pipe := io.StringIO()))
    run(1e-3, 50_000)
    run.close()
    assert pipe.getvalue() == ""
    assert not wanted(io.StringIO()) and wanted(Terminal())


def test_drawn_on_a_terminal_and_when_asked(monkeypatch):
    monkeypatch.delenv("EMULATOR_PROGRESS", raising=False)
    assert "sweep: 100%" in _sweep_bar(Terminal()) and "3/3" in _sweep_bar(Terminal())
    monkeypatch.setenv("EMULATOR_PROGRESS", "1")
    text = _sweep_bar(io.StringIO())
    assert "3/3" in text and "point/s" in text
    run = RunProgress(delay_s=0, stream=(pipe := io.StringIO()))
    run(0.0125, 50_000)
    run.close()
    assert "simulating" in pipe.getvalue() and "50.0k events" in pipe.getvalue()
    assert "simulated 12.500 ms" in pipe.getvalue()


def test_turned_off_on_a_terminal_when_asked(monkeypatch):
    monkeypatch.setenv("EMULATOR_PROGRESS", "0")
    assert _sweep_bar(Terminal()) == ""


def test_a_short_run_shows_no_bar_even_when_asked(monkeypatch):
    monkeypatch.setenv("EMULATOR_PROGRESS", "1")
    run = RunProgress(delay_s=3600, stream=(pipe := io.StringIO()))
    run(1.0, 50_000)
    run.close()
    assert pipe.getvalue() == ""


def _run(out, capsys):
    assert main(["run", QUICK, "--out", str(out)]) == 0
    std = capsys.readouterr()
    return std, {n: (out / n).read_bytes() for n in ("spans.csv", "trace.json", "gantt.png")}


def test_a_forced_bar_changes_no_output_file_and_no_stdout(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("EMULATOR_PROGRESS", raising=False)
    quiet, files = _run(tmp_path / "a", capsys)
    assert quiet.err == ""
    monkeypatch.setenv("EMULATOR_PROGRESS", "1")
    monkeypatch.setattr(emulator.outputs.progress, "RUN_DELAY_S", 0.0)
    monkeypatch.setattr(emulator.run.engine, "PROGRESS_EVERY", 500)  # call back often in this short run
    loud, files2 = _run(tmp_path / "b", capsys)
    assert "simulating" in loud.err and "events" in loud.err
    def same(out):  # the stdout table, less the wall-time line
        return [ln for ln in out.replace("/b/", "/a/").splitlines() if not ln.startswith("simulated")]
    assert same(loud.out) == same(quiet.out) and len(same(quiet.out)) > 10
    assert files2 == files


def test_sweep_progress_goes_to_stderr_only(tmp_path, capsys, monkeypatch):
    path = write_tiny(str(tmp_path))
    vary = ["--vary", f"cluster.overrides={degrade(1)},{degrade(0.5)}"]
    monkeypatch.delenv("EMULATOR_PROGRESS", raising=False)
    assert main(["sweep", path, *vary, "--db", str(tmp_path / "a.sqlite")]) == 0
    quiet = capsys.readouterr()
    assert quiet.err == ""
    monkeypatch.setenv("EMULATOR_PROGRESS", "1")
    assert main(["sweep", path, *vary, "--db", str(tmp_path / "b.sqlite")]) == 0
    loud = capsys.readouterr()
    assert "sweep: 100%" in loud.err and "2/2" in loud.err
    assert "point" not in loud.out.replace("points", "") and "\r" not in loud.out


def test_a_run_without_a_bar_never_imports_tqdm_nor_matplotlib():
    # `emulator run --json` into a pipe draws no bar: tqdm (7 ms of imports) is not imported, and no
    # figure is made: matplotlib is not imported either
    code = ("import sys; from emulator.cli import main; main(['run', 'scenarios/quickstart.yaml', '--json']); "
            "print('tqdm' in sys.modules, 'matplotlib' in sys.modules, file=sys.stderr)")
    env = {k: v for k, v in os.environ.items() if k != "EMULATOR_PROGRESS"}
    env["PYTHONPATH"] = ROOT
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT, env=env)
    assert out.stderr.strip().splitlines()[-1] == "False False"
