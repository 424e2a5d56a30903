"""Sweeps: --vary parsing, grid and zip, up-front validation, skip-finished, SIGKILL resume."""
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
from helpers import star

from emulator.cli import main
from emulator.errors import EmulatorError
from emulator.studies.executor import LocalExecutor
from emulator.studies.store import ResultStore
from emulator.studies.sweep import build_points, evaluate, expand, parse_vary, run_points, scalar, split_values

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_tiny(folder, bw=100e9):
    """A 2-GPU star (bw each way, 1 us per link) and a trace: rank 0 computes 1 ms, then
    sends 1 MB to rank 1. Iteration = 1e-3 + 2 × 1e-6 + 1e6 / (bandwidth of g0→s)."""
    star(folder, 2, bw=bw, lat=1e-6)
    trace = {"format": "emulator-trace", "version": 1, "ranks": 2, "ops": [
        {"id": 0, "rank": 0, "kind": "compute", "deps": [], "duration": 1e-3},
        {"id": 1, "rank": 0, "kind": "send", "deps": [0], "peer": 1, "bytes": 1e6, "tag": 1},
        {"id": 2, "rank": 1, "kind": "recv", "deps": [], "peer": 0, "bytes": 1e6, "tag": 1}]}
    with open(os.path.join(folder, "tiny.json"), "w") as fh:
        json.dump(trace, fh)
    path = os.path.join(folder, "tiny.yaml")
    with open(path, "w") as fh:
        fh.write("name: tiny\ncluster:\n  fabric: {kind: custom, graph: graph.json}\nworkload:\n  trace: tiny.json\n")
    return path


def degrade(f):
    """The --vary value that scales g0→s by f."""
    return "[{kind: link_degrade, target: g0->s, factor: %s}]" % f


def no_wall(summary):
    s = json.loads(json.dumps(summary))
    s["sim"].pop("wall_s")
    return s


def test_split_values_respects_brackets_and_quotes():
    assert split_values('1, 2,[4, 4],"a,b",{k: 1, j: 2}') == ["1", "2", "[4, 4]", '"a,b"', "{k: 1, j: 2}"]


def test_scalar_parses_yaml_scalars():
    assert [scalar(x) for x in ("4", "2.5", "true", "dgx-a100", "'2'", "200 Gb/s")] == \
        [4, 2.5, True, "dgx-a100", "2", "200 Gb/s"]


def test_parse_vary_and_errors():
    assert parse_vary("parallel.tp=1,2,4") == ("parallel.tp", ["1", "2", "4"])
    with pytest.raises(EmulatorError, match="key.path=v1,v2"):
        parse_vary("parallel.tp")
    with pytest.raises(EmulatorError, match="no empty value"):
        parse_vary("parallel.tp=1,,2")


def test_grid_is_cartesian_first_vary_slowest_and_zip_pairs():
    v = [("a", ["1", "2"]), ("b", ["x", "y", "z"])]
    grid = expand(v)
    assert len(grid) == 6  # 2 × 3
    assert grid[:3] == [{"a": "1", "b": "x"}, {"a": "1", "b": "y"}, {"a": "1", "b": "z"}]
    assert expand([("a", ["1", "2"]), ("b", ["x", "y"])], zipped=True) == [{"a": "1", "b": "x"}, {"a": "2", "b": "y"}]
    with pytest.raises(EmulatorError, match="same length"):
        expand(v, zipped=True)
    with pytest.raises(EmulatorError, match="given twice"):
        expand([("a", ["1"]), ("a", ["2"])])


def test_a_bad_point_is_named_before_anything_runs(tmp_path):
    path = write_tiny(str(tmp_path))
    combos = expand([("cluster.overrides", [degrade(1), degrade(-1)])])
    with pytest.raises(EmulatorError) as err:
        build_points(path, [], combos)
    text = str(err.value)
    assert text.startswith("point 2 of 2 (cluster.overrides=") and "factor" in text
    points, invalid = build_points(path, [], combos, skip_invalid=True)
    assert len(points) == 1 and len(invalid) == 1
    with pytest.raises(EmulatorError, match=r"point 1 of 1 \(simulation\.iterationz=2\).*unknown key"):
        build_points(path, [], expand([("simulation.iterationz", ["2"])]))


def test_sweep_values_are_hand_computed_and_rerun_skips(tmp_path):
    path = write_tiny(str(tmp_path))
    db = str(tmp_path / "r.sqlite")
    args = ["sweep", path, "--vary", f"cluster.overrides={degrade(1)},{degrade(0.5)},{degrade(0.25)}", "--db", db,
            "--csv", str(tmp_path / "r.csv")]
    assert main(args) == 0
    with ResultStore(db) as store:
        rows = store.rows()
    times = sorted(r.summary["iteration_time_s"] for r in rows)
    # 1e-3 + 2e-6 + 1e6 / (100e9 × f): f = 1 → 1.012e-3, 0.5 → 1.022e-3, 0.25 → 1.042e-3
    assert times == pytest.approx([1.012e-3, 1.022e-3, 1.042e-3], rel=1e-9)
    lines = (tmp_path / "r.csv").read_text().splitlines()
    assert len(lines) == 4 and lines[0].startswith("key,scenario,status,error,cluster.overrides,")
    points, _ = build_points(path, [], expand([("cluster.overrides", [degrade(1), degrade(0.5)])]))
    with ResultStore(db) as store:
        stats = run_points(points, store, LocalExecutor(1))
    assert (stats.points, stats.skipped, stats.ran) == (2, 2, 0)


def test_equal_configurations_share_one_row(tmp_path):
    # factor 0.5 and 0.50 resolve to the same scenario: one key, run once
    path = write_tiny(str(tmp_path))
    points, _ = build_points(path, [], expand([("cluster.overrides", [degrade(0.5), degrade("0.50")])]))
    assert points[0].key == points[1].key
    with ResultStore(str(tmp_path / "r.sqlite")) as store:
        stats = run_points(points, store, LocalExecutor(1))
        assert (stats.points, stats.distinct, stats.ran, store.count()) == (2, 1, 1, 1)


def test_errors_are_recorded_once_unless_retried(tmp_path):
    # a trace that is not JSON loads as a path but fails when simulated: an error row
    path = write_tiny(str(tmp_path))
    (tmp_path / "bad.json").write_text("not json")
    points, _ = build_points(path, [], expand([("workload.trace", ["bad.json"])]))
    assert "error" in evaluate(points[0].scenario)
    with ResultStore(str(tmp_path / "r.sqlite")) as store:
        assert run_points(points, store, LocalExecutor(1)).errors == 1
        row = store.rows()[0]
        assert row.status == "error" and "not a JSON trace" in row.error
        assert run_points(points, store, LocalExecutor(1)).ran == 0
        assert run_points(points, store, LocalExecutor(1), retry_errors=True).ran == 1


def test_export_csv_without_running(tmp_path, capsys):
    path = write_tiny(str(tmp_path))
    db = str(tmp_path / "r.sqlite")
    assert main(["sweep", path, "--vary", f"cluster.overrides={degrade(1)},{degrade(0.5)}", "--db", db]) == 0
    assert main(["sweep", "--db", db, "--export-csv", str(tmp_path / "all.csv")]) == 0
    assert "exported 2 rows" in capsys.readouterr().out
    assert main(["sweep", "--db", str(tmp_path / "none.sqlite"), "--export-csv", str(tmp_path / "x.csv")]) == 2


def _sweep_cmd(path, db, jobs):
    values = ",".join(degrade(f"{(i + 1) / 200:.3f}") for i in range(200))
    return [sys.executable, "-m", "emulator", "sweep", path, "--vary", f"cluster.overrides={values}", "--db", db,
            "--jobs", str(jobs)]


def _rows(db):
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT COUNT(*) FROM results").fetchone()[0]
    except sqlite3.OperationalError:  # not created yet
        return 0
    finally:
        con.close()


def test_sigkill_at_random_moments_then_resume_loses_and_repeats_nothing(tmp_path):
    path = write_tiny(str(tmp_path))
    env = dict(os.environ, PYTHONPATH=ROOT)
    # the uninterrupted reference, in this process
    ref_db = str(tmp_path / "ref.sqlite")
    values = [degrade(f"{(i + 1) / 200:.3f}") for i in range(200)]
    points, _ = build_points(path, [], expand([("cluster.overrides", values)]))
    with ResultStore(ref_db) as store:
        run_points(points, store, LocalExecutor(1))
        ref = {r.key: r for r in store.rows()}
    assert len(ref) == 200

    db = str(tmp_path / "killed.sqlite")
    rng = random.Random(20240611)
    before = 0
    killed_midway = 0
    for attempt, jobs in enumerate((1, 2, 1, 2)):
        target = before + rng.randint(5, 40)  # kill once the database has reached this many rows...
        delay = rng.uniform(0.0, 0.02)  # ...plus a random instant later (mid-commit, mid-simulation)
        proc = subprocess.Popen(_sweep_cmd(path, db, jobs), cwd=str(tmp_path), env=env, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 30
        while _rows(db) < target and proc.poll() is None and time.time() < deadline:
            time.sleep(0.003)
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # orphaned pool workers of this run
        except ProcessLookupError:
            pass
        now = _rows(db)
        assert before <= now <= 200, f"attempt {attempt}: {now} rows"
        before = now
        if now == 200:  # on a fast moment the sweep can finish before the kill lands
            break
        killed_midway += 1
    assert killed_midway >= 2  # the kills did interrupt the sweep (the first target is at most 40 rows)
    # resume: it must skip exactly the committed rows and run the rest once
    out = subprocess.run(_sweep_cmd(path, db, 2), cwd=str(tmp_path), env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"200 points: {before} already in {db}, ran {200 - before} (0 errors)" in out.stdout
    con = sqlite3.connect(db)
    keys = [k for (k,) in con.execute("SELECT key FROM results")]
    con.close()
    assert len(keys) == 200 and set(keys) == set(ref)  # no duplicates, no losses
    with ResultStore(db) as store:
        for row in store.rows():
            assert no_wall(row.summary) == no_wall(ref[row.key].summary)
            assert row.varied == ref[row.key].varied
