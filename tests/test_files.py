"""File-system states for every command that writes: exit 2 and one line naming the path, before any work.

Also: the run's output folder is replaced as one set, outputs honour the umask and keep the mode of the
file they replace, a foreign or read-only results database is never modified, and one writer per database.
The tiny scenario (tests/test_sweep.py): iteration = 1 ms + 2 × 1 µs + 1 MB / bw, so 1.012 ms at 100 GB/s
and 1.022 ms at 50 GB/s.
"""
import json
import os
import sqlite3
import subprocess
import sys

import pytest
from test_sweep import write_tiny

from emulator.cli import main
from emulator.outputs import atomic
from emulator.outputs.atomic import TMP_PREFIX, remove_stale, write_text
from emulator.outputs.destination import DestinationError, check_file, check_folder
from emulator.outputs.run_files import OUTPUT_FILES
from emulator.run import simulation
from emulator.studies.store import ResultStore, StoreError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
T_100 = 1e-3 + 2e-6 + 1e6 / 100e9  # = 0.001012 s
T_50 = 1e-3 + 2e-6 + 1e6 / 50e9  # = 0.001022 s


@pytest.fixture
def no_simulation(monkeypatch):
    """Any simulation is a failure: the checks must come first."""
    def boom(*a, **k):
        raise AssertionError("a simulation ran before the destination was checked")
    monkeypatch.setattr(simulation, "simulate", boom)


@pytest.fixture
def readonly(tmp_path):
    """A folder nobody may write into, even root (chmod 555, else chattr +i); skips where neither holds."""
    made = []

    def make(name="ro"):
        path = tmp_path / name
        path.mkdir(exist_ok=True)
        path.chmod(0o555)
        if os.access(path, os.W_OK):  # root: make it immutable
            subprocess.run(["chattr", "+i", str(path)], capture_output=True)
            made.append(path)
        if os.access(path, os.W_OK):
            pytest.skip("cannot make a read-only folder here")
        return path

    yield make
    for path in made:
        subprocess.run(["chattr", "-i", str(path)], capture_output=True)
    for path in tmp_path.iterdir():
        if path.is_dir():
            path.chmod(0o755)


def _fails(capsys, argv, *needles):
    """The command exits 2 with one line on stderr that contains every needle."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("emulator: "), err
    for n in needles:
        assert n in err, err
    return err


def _tiny(tmp_path, bw=100e9):
    folder = tmp_path / f"sc{int(bw / 1e9)}"
    folder.mkdir(exist_ok=True)
    return write_tiny(str(folder), bw=bw)


# ------------------------------------------------------------------ the checks themselves


def test_check_file_and_folder_name_the_path_and_the_fault(tmp_path, readonly):
    (tmp_path / "f").write_text("x")
    (tmp_path / "d").mkdir()
    ro = readonly()
    cases = [(lambda: check_file(str(tmp_path / "d"), "--csv"), "is a folder; expected a file name"),
             (lambda: check_file(str(tmp_path / "f" / "x.csv"), "--csv"), f"lies below {tmp_path / 'f'}, which is a file"),
             (lambda: check_file(str(ro / "x.csv")), f"its folder {ro} is not writable"),
             (lambda: check_file(str(ro / "a" / "b" / "x.csv")), f"cannot create it: the folder {ro} is not writable"),
             (lambda: check_file("/dev/null"), "is not a regular file"),
             (lambda: check_folder(str(tmp_path / "f"), "--out"), "exists and is a file, not a folder"),
             (lambda: check_folder(str(tmp_path / "f" / "sub" / "deeper")), "which is a file, not a folder"),
             (lambda: check_folder(str(ro)), "the folder is not writable"),
             (lambda: check_folder(str(tmp_path), names=("d",)), f"{tmp_path / 'd'} is a folder"),
             (lambda: check_folder(str(tmp_path / "dangling")), "is a broken symbolic link"),
             (lambda: check_file(str(tmp_path / "loop")), "is a symbolic link that leads nowhere")]
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    os.symlink(tmp_path / "loop", tmp_path / "loop")
    for call, needle in cases:
        with pytest.raises(DestinationError) as exc:
            call()
        assert needle in str(exc.value), str(exc.value)
    if os.path.isdir("/proc/self"):  # root passes os.access there, but no file can be created: the probe says so
        with pytest.raises(DestinationError, match="its folder /proc is not writable"):
            check_file("/proc/x.csv")
    check_file(str(tmp_path / "new" / "deeper" / "x.csv"))  # creatable: no error
    check_folder(str(tmp_path / "new" / "out"))


def test_a_read_only_file_is_not_replaced(tmp_path, capsys):
    f = tmp_path / "x.csv"
    f.write_text("mine")
    f.chmod(0o444)
    if os.access(f, os.W_OK):  # root: make it immutable
        subprocess.run(["chattr", "+i", str(f)], capture_output=True)
    if os.access(f, os.W_OK):
        pytest.skip("cannot make a read-only file here")
    try:
        with pytest.raises(DestinationError, match="is read-only"):
            check_file(str(f))
        _fails(capsys, ["sweep", _tiny(tmp_path), "--db", str(tmp_path / "r.sqlite"), "--csv", str(f)],
               f"--csv {f}: is read-only")
    finally:
        subprocess.run(["chattr", "-i", str(f)], capture_output=True)
    assert f.read_text() == "mine" and not os.path.exists(tmp_path / "r.sqlite")


# ------------------------------------------------------------------ run --out


def test_run_out_on_bad_paths_fails_before_simulating(tmp_path, capsys, readonly, no_simulation):
    sc = _tiny(tmp_path)
    (tmp_path / "afile").write_text("x")
    ro = readonly()
    _fails(capsys, ["run", sc, "--out", str(tmp_path / "afile")], "--out", "afile: exists and is a file, not a folder")
    _fails(capsys, ["run", sc, "--out", str(tmp_path / "afile" / "o")], "lies below", "afile, which is a file")
    _fails(capsys, ["run", sc, "--out", str(ro / "o")], f"cannot create it: the folder {ro} is not writable")
    _fails(capsys, ["run", sc, "--out", str(ro)], f"--out {ro}: the folder is not writable")
    (tmp_path / "o2" / "trace.json").mkdir(parents=True)
    _fails(capsys, ["run", sc, "--out", str(tmp_path / "o2")], "trace.json is a folder")
    (tmp_path / "o3").mkdir()
    locked = tmp_path / "o3" / "spans.csv"
    locked.write_text("theirs")
    locked.chmod(0o444)
    if os.access(locked, os.W_OK):  # root: make it immutable
        subprocess.run(["chattr", "+i", str(locked)], capture_output=True)
    try:
        if not os.access(locked, os.W_OK):
            _fails(capsys, ["run", sc, "--out", str(tmp_path / "o3")], "spans.csv is read-only")
    finally:
        subprocess.run(["chattr", "-i", str(locked)], capture_output=True)
    assert locked.read_text() == "theirs"


def _summary(out):
    return json.loads((out / "summary.json").read_text())


def test_no_gantt_removes_the_old_gantt_and_the_set_is_of_one_run(tmp_path, capsys):
    out = tmp_path / "out"
    (tmp_path / "out").mkdir()
    (out / "notes.txt").write_text("the user's own file")
    assert main(["run", _tiny(tmp_path), "--out", str(out)]) == 0
    assert _summary(out)["iteration_time_s"] == pytest.approx(T_100, rel=1e-12)
    assert (out / "gantt.png").exists()
    assert main(["run", _tiny(tmp_path, 50e9), "--out", str(out), "--no-gantt"]) == 0
    capsys.readouterr()
    assert _summary(out)["iteration_time_s"] == pytest.approx(T_50, rel=1e-12)
    assert not (out / "gantt.png").exists()  # it was the 100 GB/s run's
    ends = [float(r.split(",")[6]) for r in (out / "spans.csv").read_text().splitlines()[1:]]
    assert max(ends) == pytest.approx(T_50, rel=1e-12)  # spans.csv is the 50 GB/s run's too
    assert sorted(os.listdir(out)) == ["notes.txt", "ranks.csv", "scenario.yaml", "spans.csv", "summary.json",
                                       "trace.json"]
    scenario = _tiny(tmp_path, 50e9)  # scenario.yaml is the 50 GB/s run's: its file, under two header lines
    assert (out / "scenario.yaml").read_text().split("\n", 2)[2] == open(scenario).read()
    assert (out / "notes.txt").read_text() == "the user's own file"


def test_a_failed_write_leaves_the_old_set_whole_and_no_temporaries(tmp_path, capsys, monkeypatch):
    import emulator.outputs.run_files as outputs

    out = tmp_path / "out"
    assert main(["run", _tiny(tmp_path), "--out", str(out)]) == 0
    before = {n: (out / n).read_bytes() for n in os.listdir(out)}

    def broken(path, result):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(outputs, "write_perfetto", broken)
    _fails(capsys, ["run", _tiny(tmp_path, 50e9), "--out", str(out)], "No space left on device")
    assert {n: (out / n).read_bytes() for n in os.listdir(out)} == before  # nothing new, nothing left over


KILLER = """
import os, signal, sys
sys.path.insert(0, {root!r})
real = os.replace
def replace(a, b):
    if os.path.basename(b) == "trace.json" and (os.path.dirname(b) == {out!r}) == {in_commit!r}:
        os.kill(os.getpid(), signal.SIGKILL)  # kill -9 while staging, or in the middle of the commit
    return real(a, b)
os.replace = replace
from emulator.cli import main
main(["run", {scenario!r}, "--out", {out!r}])
"""


@pytest.mark.parametrize("in_commit", [False, True])
def test_kill_9_never_leaves_a_summary_beside_files_of_another_run(tmp_path, capsys, in_commit):
    out = tmp_path / "out"
    assert main(["run", _tiny(tmp_path), "--out", str(out)]) == 0
    before = {n: (out / n).read_bytes() for n in os.listdir(out)}
    code = KILLER.format(root=ROOT, scenario=_tiny(tmp_path, 50e9), out=str(out), in_commit=in_commit)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == -9
    names = os.listdir(out)
    assert [n for n in names if n.startswith(TMP_PREFIX)]  # the dead process's staging folder is left behind
    if in_commit:  # the old summary went first, spans.csv is new, trace.json and gantt.png are old: no summary
        assert "summary.json" not in names
        assert (out / "spans.csv").read_bytes() != before["spans.csv"]
        assert (out / "trace.json").read_bytes() == before["trace.json"]
    else:  # killed while staging: the old set is whole
        assert {n: (out / n).read_bytes() for n in names if not n.startswith(TMP_PREFIX)} == before
    assert main(["run", _tiny(tmp_path, 50e9), "--out", str(out)]) == 0
    capsys.readouterr()
    assert sorted(os.listdir(out)) == sorted(OUTPUT_FILES)  # the next run removed the staging folder
    assert _summary(out)["iteration_time_s"] == pytest.approx(T_50, rel=1e-12)


def test_stale_temporaries_of_dead_processes_go_and_live_ones_stay(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    (tmp_path / f"{TMP_PREFIX}{dead}-abc").mkdir()
    (tmp_path / f"{TMP_PREFIX}{dead}-abc" / "trace.json").write_text("{}")
    (tmp_path / f"{TMP_PREFIX}{dead}-x.csv").write_text("half")
    (tmp_path / f"{TMP_PREFIX}{os.getppid()}-live").write_text("someone is writing")
    (tmp_path / ".tmp-other").write_text("not ours")
    assert remove_stale(str(tmp_path)) == [f"{TMP_PREFIX}{dead}-abc", f"{TMP_PREFIX}{dead}-x.csv"]
    assert sorted(os.listdir(tmp_path)) == sorted([".tmp-other", f"{TMP_PREFIX}{os.getppid()}-live"])


# ------------------------------------------------------------------ permissions


def _mode(path):
    return os.stat(path).st_mode & 0o777


def test_outputs_honour_the_umask_and_keep_the_replaced_mode(tmp_path, capsys):
    old = os.umask(0o027)
    try:
        assert atomic.current_umask() == 0o027
        write_text(str(tmp_path / "a.txt"), "x")
        assert _mode(tmp_path / "a.txt") == 0o640  # 0666 & ~0027
        (tmp_path / "b.txt").write_text("old")
        os.chmod(tmp_path / "b.txt", 0o644)
        write_text(str(tmp_path / "b.txt"), "new")
        assert _mode(tmp_path / "b.txt") == 0o644 and (tmp_path / "b.txt").read_text() == "new"
        out = tmp_path / "out"
        assert main(["run", _tiny(tmp_path), "--out", str(out), "--no-gantt"]) == 0
        assert {_mode(out / n) for n in ("summary.json", "spans.csv", "trace.json")} == {0o640}
        os.chmod(out / "trace.json", 0o644)
        os.umask(0o022)
        assert main(["run", _tiny(tmp_path), "--out", str(out), "--no-gantt"]) == 0
        capsys.readouterr()
        assert _mode(out / "trace.json") == 0o644 and _mode(out / "summary.json") == 0o640  # each keeps its own
    finally:
        os.umask(old)


# ------------------------------------------------------------------ sweep, search, plot, calibrate


def test_sweep_csv_and_export_csv_bad_paths_fail_before_running(tmp_path, capsys, readonly, no_simulation):
    sc = _tiny(tmp_path)
    ro = readonly()
    (tmp_path / "afile").write_text("x")
    db = str(tmp_path / "r.sqlite")
    vary = ["--vary", "training.global_batch=1,2"]
    _fails(capsys, ["sweep", sc, *vary, "--db", db, "--csv", str(tmp_path)], f"--csv {tmp_path}: is a folder")
    _fails(capsys, ["sweep", sc, *vary, "--db", db, "--csv", str(ro / "x.csv")], f"its folder {ro} is not writable")
    _fails(capsys, ["sweep", sc, *vary, "--db", str(tmp_path / "afile" / "r.sqlite")], "--db", "which is a file")
    _fails(capsys, ["sweep", sc, *vary, "--db", str(ro / "r.sqlite")], f"its folder {ro} is not writable")
    assert not os.path.exists(db)  # nothing was created
    _fails(capsys, ["sweep", "--db", db, "--export-csv", str(tmp_path / "afile" / "e.csv")], "--export-csv",
           "which is a file")


def test_search_bad_paths_fail_before_running(tmp_path, capsys, readonly, no_simulation, monkeypatch):
    ro = readonly()
    quick = os.path.join(ROOT, "scenarios", "quickstart.yaml")
    _fails(capsys, ["search", quick, "--db", str(ro / "s.sqlite")], f"--db {ro / 's.sqlite'}: its folder")
    _fails(capsys, ["search", quick, "--db", str(tmp_path / "s.sqlite"), "--csv", str(tmp_path)], "--csv",
           "is a folder")
    monkeypatch.chdir(ro)  # the defaults out/quickstart-search.sqlite and .csv land under the current folder
    _fails(capsys, ["search", quick], "--db out/quickstart-search.sqlite: cannot create it", "is not writable")


def test_plot_and_calibrate_bad_paths_fail_before_any_work(tmp_path, capsys, readonly, no_simulation):
    ro = readonly()
    (tmp_path / "afile").write_text("x")
    _fails(capsys, ["plot", "--links", _tiny(tmp_path), "--out", str(ro / "p.png")], f"--out {ro / 'p.png'}")
    _fails(capsys, ["plot", "--links", _tiny(tmp_path), "--out", str(tmp_path / "afile" / "p.png")], "which is a file")
    (tmp_path / "p.svg").mkdir()  # the SVG beside the PNG is checked too
    _fails(capsys, ["plot", "--links", _tiny(tmp_path), "--out", str(tmp_path / "p.png")], "p.svg: is a folder")
    # calibrate checks --out before it reads its inputs: the log need not even exist
    _fails(capsys, ["calibrate", "--nccl-log", "missing.log", "--out", str(tmp_path / "afile" / "c.yaml")],
           "--out", "which is a file")


# ------------------------------------------------------------------ results databases


def _foreign(path):
    con = sqlite3.connect(path)
    con.executescript("CREATE TABLE results (id INTEGER, v TEXT); INSERT INTO results VALUES (1, 'theirs');")
    con.commit()
    con.close()
    with open(path, "rb") as fh:
        return fh.read()


def test_a_foreign_database_is_refused_and_left_byte_identical(tmp_path, capsys):
    db = tmp_path / "theirs.sqlite"
    before = _foreign(str(db))
    err = _fails(capsys, ["sweep", _tiny(tmp_path), "--db", str(db)], str(db), "not a results database",
                 "no meta table", "left untouched")
    assert "internal error" not in err
    assert db.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["sc100", "theirs.sqlite"]
    con = sqlite3.connect(db)  # a meta table, but not ours
    con.executescript("CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);")
    con.close()
    before = db.read_bytes()
    _fails(capsys, ["sweep", _tiny(tmp_path), "--db", str(db)], "no schema_version")
    _fails(capsys, ["plot", "--db", str(db)], "no schema_version")
    assert db.read_bytes() == before
    text = tmp_path / "notes.txt"
    text.write_text("not sqlite at all\n" * 10)
    _fails(capsys, ["sweep", _tiny(tmp_path), "--db", str(text)], "not a results database", "left untouched")
    assert text.read_text() == "not sqlite at all\n" * 10


def test_a_read_only_results_database_is_called_read_only_and_still_reads(tmp_path, capsys, readonly):
    sc = _tiny(tmp_path)
    ro = tmp_path / "ro"
    ro.mkdir()
    db = ro / "r.sqlite"
    assert main(["sweep", sc, "--vary", "cluster.overrides=[],[{kind: link_degrade, target: g0->s, factor: 0.5}]",
                 "--db", str(db)]) == 0
    capsys.readouterr()
    assert not (ro / "r.sqlite.lock").exists()  # a normal close removes the lock file
    readonly("ro")
    before = db.read_bytes()
    err = _fails(capsys, ["sweep", sc, "--db", str(db)], f"--db {db}", "not writable")
    assert "not a results database" not in err
    # reading needs no write: export and plot work on the read-only database in its read-only folder
    assert main(["sweep", "--db", str(db), "--export-csv", str(tmp_path / "e.csv")]) == 0
    lines = (tmp_path / "e.csv").read_text().splitlines()
    assert len(lines) == 3  # header + the two points
    with ResultStore(str(db), create=False) as store:
        times = sorted(r.metric("iteration_time_s") for r in store.rows())
    assert times == pytest.approx([T_100, T_50], rel=1e-12)  # g0->s at 50 GB/s: 1 MB takes 20 µs
    assert db.read_bytes() == before


def test_a_second_writer_is_refused_while_the_first_holds_the_database(tmp_path, capsys):
    sc = _tiny(tmp_path)
    db = str(tmp_path / "r.sqlite")
    with ResultStore(db):
        _fails(capsys, ["sweep", sc, "--db", db], f"{db}: another sweep or search (pid {os.getpid()})")
        with pytest.raises(StoreError, match="another sweep or search"):
            ResultStore(db)
        with ResultStore(db, create=False) as reader:  # readers are never refused
            assert reader.count() == 0
    assert main(["sweep", sc, "--db", db]) == 0  # released on close
    assert "1 points: 0 already in" in capsys.readouterr().out


def test_the_lock_of_a_killed_sweep_is_released(tmp_path):
    db = str(tmp_path / "r.sqlite")
    code = (f"import os, signal, sys; sys.path.insert(0, {ROOT!r})\n"
            "from emulator.studies.store import ResultStore\n"
            f"s = ResultStore({db!r}); print('held', flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(StoreError, match=f"pid {proc.pid}"):  # another process holds it
            ResultStore(db)
        proc.kill()  # kill -9: no cleanup code runs
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    with ResultStore(db) as store:
        assert store.count() == 0


def test_a_figure_is_written_as_a_png_and_svg_pair(tmp_path):
    from matplotlib.figure import Figure

    from emulator.outputs.figures import save_figure

    (tmp_path / "p.svg").write_text("<svg>an older drawing</svg>")
    (tmp_path / "other.png").write_bytes(b"the user's")
    paths = save_figure(Figure(figsize=(1, 1)), str(tmp_path / "p.png"))
    assert paths == [str(tmp_path / "p.png"), str(tmp_path / "p.svg")]
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "an older drawing" not in (tmp_path / "p.svg").read_text()
    assert sorted(os.listdir(tmp_path)) == ["other.png", "p.png", "p.svg"]


def test_live_out_on_a_file_is_refused_before_the_script_starts(tmp_path, monkeypatch, capsys):
    import subprocess as sp

    def boom(*a, **k):
        raise AssertionError("the live script started before --out was checked")
    monkeypatch.setattr(sp, "call", boom)
    blocker = tmp_path / "f"
    blocker.write_text("x")
    scen = os.path.join(ROOT, "scenarios", "live-gloo-loopback.yaml")
    assert main(["live", scen, "--out", str(blocker), "--", sys.executable, "-c", "pass"]) == 2
    assert f"--out {blocker}: exists and is a file, not a folder" in capsys.readouterr().err


def test_a_live_report_is_written_as_one_set(tmp_path):
    from emulator.live.report import LIVE_FILES, write_report

    out = tmp_path / "live"
    record = {"rank": 0, "world": 2, "comms": [], "waits": [], "steps_s": [0.5, 1.0], "end_s": 1.0}
    first = write_report(str(out), record, {"scenario": "a", "n": 1})
    assert [os.path.basename(p) for p in first] == list(LIVE_FILES)
    write_report(str(out), record, {"scenario": "b", "n": 2})
    # the second set replaced the first whole; no staging folder is left behind
    assert sorted(os.listdir(out)) == sorted(LIVE_FILES)
    assert json.loads((out / "summary.json").read_text())["n"] == 2
    assert json.loads((out / "trace.json").read_text())["otherData"]["scenario"] == "b"
