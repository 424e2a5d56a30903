"""The results store: keys of resolved scenarios, one transaction per row, CSV export."""
import os
import sqlite3

import pytest
from test_sweep import write_tiny

from emulator.scenario import load_scenario
from emulator.studies.store import ResultStore, StoreError, canonical_json, csv_rows, export_csv, make_row, scenario_key

MODEL = """name: m
cluster: {nodes: 1, node: dgx-a100}
model: {preset: gpt3-125m}
training: {global_batch: 16}
"""


def _model(folder, name="m.yaml"):
    path = os.path.join(folder, name)
    with open(path, "w") as fh:
        fh.write(MODEL)
    return path


def test_canonical_json_is_sorted_and_compact():
    assert canonical_json({"b": 1, "a": [1.5, None]}) == '{"a":[1.5,null],"b":1}'
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})


def test_key_is_of_the_resolved_scenario_not_its_spelling_or_path(tmp_path):
    a = _model(str(tmp_path))
    os.makedirs(tmp_path / "elsewhere")
    b = _model(str(tmp_path / "elsewhere"))
    k = scenario_key(load_scenario(a))
    assert len(k) == 64  # sha256 hex
    assert scenario_key(load_scenario(b)) == k  # path is excluded
    # "2" and "2.0" and "2:1" are the same oversubscription
    ks = {scenario_key(load_scenario(a, ["cluster.fabric.kind=fat_tree", f"cluster.fabric.oversubscription={v}"]))
          for v in ("2", "2.0", "2:1")}
    assert len(ks) == 1 and k not in ks
    # dp=8 given or derived (8 GPUs / tp 1) is the same layout
    assert scenario_key(load_scenario(a, ["parallel.dp=8"])) == k


def test_key_follows_the_trace_file_content(tmp_path):
    path = write_tiny(str(tmp_path))
    k1 = scenario_key(load_scenario(path))
    text = (tmp_path / "tiny.json").read_text().replace("0.001", "0.002")
    (tmp_path / "tiny.json").write_text(text)
    os.utime(tmp_path / "tiny.json", (1, 1))  # a new mtime: the content hash is recomputed
    assert scenario_key(load_scenario(path)) != k1


def test_record_is_insert_or_ignore_and_survives_reopen(tmp_path):
    sc = load_scenario(_model(str(tmp_path)))
    db = str(tmp_path / "r.sqlite")
    summary = {"iteration_time_s": 0.5, "tokens_per_s": 65536.0, "mfu": 0.25, "gpus": 8,
               "memory": {"peak_bytes_per_gpu": 1e9, "capacity_bytes": 8e10, "fits": True}}
    with ResultStore(db) as store:
        assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert store.record(make_row("k1", sc, {"parallel.tp": 1}, summary)) is True
        assert store.record(make_row("k1", sc, {"parallel.tp": 2}, summary)) is False  # first one wins
        assert store.record(make_row("k2", sc, {"parallel.tp": 2}, error="boom")) is True
    with ResultStore(db) as store:
        assert store.count() == 2
        assert store.done_keys(["k1", "k3"]) == {"k1"}
        rows = store.rows(["k2", "k1", "k2"])
        assert [r.key for r in rows] == ["k2", "k1"]
        assert rows[1].varied == {"parallel.tp": 1} and rows[1].metric("memory.fits") is True
        assert rows[0].status == "error" and rows[0].error == "boom" and rows[0].summary is None
        assert store.delete_errors(["k1", "k2"]) == 1 and store.done_keys() == {"k1"}
    con = sqlite3.connect(db)
    flat = con.execute("SELECT iteration_time_s, tokens_per_s, mfu, peak_bytes_per_gpu, fits, gpus FROM results").fetchone()
    con.close()
    assert flat == (0.5, 65536.0, 0.25, 1e9, 1, 8)


def test_not_a_database_is_a_clear_error(tmp_path):
    bad = tmp_path / "x.sqlite"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="not a results database"):
        ResultStore(str(bad))
    with pytest.raises(StoreError, match="no such results database"):
        ResultStore(str(tmp_path / "missing.sqlite"), create=False)


def test_csv_has_varied_columns_and_no_wall_clock(tmp_path):
    sc = load_scenario(_model(str(tmp_path)))
    summary = {"iteration_time_s": 0.25, "tokens_per_s": 131072.0, "gpus": 8, "sim": {"wall_s": 9.9, "events": 7},
               "memory": {"fits": False}}
    rows = [make_row("a", sc, {"parallel.tp": 1}, summary), make_row("b", sc, {"parallel.pp": 2}, error="bad")]
    table = csv_rows(rows)
    head = table[0]
    assert head[:6] == ["key", "scenario", "status", "error", "parallel.tp", "parallel.pp"]
    assert "sim.wall_s" not in head and "created" not in head
    line = dict(zip(head, table[1]))
    assert (line["parallel.tp"], line["parallel.pp"], line["iteration_time_s"], line["memory.fits"],
            line["sim.events"]) == ("1", "", "0.25", "false", "7")
    assert dict(zip(head, table[2]))["error"] == "bad"
    export_csv(rows, str(tmp_path / "o.csv"))
    assert (tmp_path / "o.csv").read_text().count("\n") == 3


def test_fingerprint_follows_the_sources_only(tmp_path):
    from emulator.fingerprint import fingerprint, fingerprint_of

    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "a.py").write_text("x = 1\n")
    (pkg / "sub" / "cat.yaml").write_text("gpu: a100\n")
    f = fingerprint_of(str(pkg))
    assert len(f) == 16 and f == fingerprint_of(str(pkg))
    (pkg / "notes.txt").write_text("not code")  # neither .py nor .yaml
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "a.py").write_text("compiled")
    assert fingerprint_of(str(pkg)) == f
    (pkg / "sub" / "cat.yaml").write_text("gpu: h100\n")  # a catalog figure changes a result
    assert fingerprint_of(str(pkg)) != f
    assert fingerprint() == fingerprint() and len(fingerprint()) == 16


def test_rows_of_another_emulator_are_stale_and_replaced(tmp_path, monkeypatch):
    from emulator.studies import store as store_module

    sc = load_scenario(_model(str(tmp_path)))
    db = str(tmp_path / "r.sqlite")
    monkeypatch.setattr(store_module, "fingerprint", lambda: "old0000000000000")
    with ResultStore(db) as store:
        assert store.record(make_row("k1", sc, {}, {"iteration_time_s": 1.0}))
        assert store.record(make_row("k2", sc, {}, {"iteration_time_s": 2.0}))
    monkeypatch.setattr(store_module, "fingerprint", lambda: "new0000000000000")
    with ResultStore(db) as store:
        assert store.done_keys() == set() and store.stale_keys(["k1", "k3"]) == {"k1"}
        assert store.record(make_row("k1", sc, {}, {"iteration_time_s": 0.5})) is True  # replaces the stale row
        assert store.record(make_row("k1", sc, {}, {"iteration_time_s": 9.0})) is False  # same emulator: kept
        assert store.count() == 2 and store.done_keys() == {"k1"} and store.stale_keys() == {"k2"}
        row = store.rows(["k1"])[0]
        assert row.metric("iteration_time_s") == 0.5 and row.emulator == "new0000000000000"


def test_schema_1_database_gains_the_emulator_column(tmp_path):
    db = str(tmp_path / "v1.sqlite")
    con = sqlite3.connect(db)
    con.executescript("""
        CREATE TABLE results (key TEXT PRIMARY KEY, scenario TEXT NOT NULL, varied TEXT NOT NULL,
            resolved TEXT NOT NULL, status TEXT NOT NULL, error TEXT, summary TEXT, iteration_time_s REAL,
            tokens_per_s REAL, mfu REAL, peak_bytes_per_gpu REAL, fits INTEGER, gpus INTEGER, created REAL);
        CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO meta VALUES ('schema_version', '1');
        INSERT INTO results (key, scenario, varied, resolved, status, summary)
            VALUES ('k1', 'm', '{}', '{}', 'ok', '{"iteration_time_s": 1.0}');
    """)
    con.commit()
    con.close()
    with ResultStore(db) as store:
        assert store.db.execute("SELECT value FROM meta WHERE name='schema_version'").fetchone()[0] == "2"
        row = store.rows()[0]
        assert row.metric("iteration_time_s") == 1.0 and row.emulator is None  # kept, but stale
        assert store.stale_keys() == {"k1"} and store.done_keys() == set()
    with ResultStore(db) as store:  # the upgrade happens once
        assert store.count() == 1


def test_sweep_runs_stale_points_again(tmp_path, monkeypatch, capsys):
    from emulator.cli import main
    from emulator.studies import store as store_module

    path = write_tiny(str(tmp_path))
    db = str(tmp_path / "s.sqlite")
    args = ["sweep", path, "--vary", "cluster.overrides=[],[{kind: link_degrade, target: g0->s, factor: 0.5}]",
            "--db", db]
    monkeypatch.setattr(store_module, "fingerprint", lambda: "old0000000000000")
    assert main(args) == 0
    assert "2 points: 0 already in" in capsys.readouterr().out
    assert main(args) == 0
    assert "2 points: 2 already in" in capsys.readouterr().out
    monkeypatch.setattr(store_module, "fingerprint", lambda: "new0000000000000")
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "2 points: 0 already in" in out and "ran 2 (0 errors)" in out
    assert "2 were from another emulator version and ran again" in out
    with ResultStore(db) as store:
        assert store.count() == 2 and {r.emulator for r in store.rows()} == {"new0000000000000"}
