"""The results store: one SQLite row per resolved scenario, keyed by its hash.

A study (sweep or search) writes here as points finish, so that a killed study
resumes where it stopped. The key of a configuration is

    sha256(canonical JSON of {"scenario": asdict(Scenario) without ``path``,
                              "files": {path: sha256(content)} of its trace / graph files})

so two spellings of the same configuration ("4" and "4.0", a preset and its
figures) share one row, and editing a trace file makes a new key. Canonical JSON
is ``json.dumps(sort_keys=True, separators=(",", ":"), allow_nan=False)``.

Each row also records the ``emulator`` that computed it (:mod:`emulator.fingerprint`).
A row from another emulator is stale: it does not count as done, and running its
point again replaces it, so one configuration keeps one row, from the newest code
that ran it. Databases of schema 1 (no such column) gain it on opening, with
every old row stale.

Durability: WAL journal, one transaction per finished point, an insert that
leaves an existing row of the same key and emulator alone (and replaces a stale
one). SQLite's commit is atomic, so a process killed at any moment leaves
every committed point and no half-written one. Only the parent process writes.

Files that are not ours: an existing file is checked read-only first (our
``meta`` and ``results`` tables) and is never written if it fails the check.
A read-only file or folder is reported as such before anything runs. One
writer at a time: a study holds ``PATH.lock`` (flock) while the store is open,
and a second one is refused with a message (:class:`ResultStore`).

Columns: key, scenario (name), varied (JSON: the ``--set`` values that made this
point, in ``--vary`` order), resolved (JSON: the loaded scenario), status (ok | error), error (the
message), summary (JSON), and the flat metrics iteration_time_s, tokens_per_s,
mfu, peak_bytes_per_gpu, fits, gpus; ``emulator`` (the fingerprint); ``created`` (Unix time) is
informative only.
"""
from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import os
import sqlite3
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from emulator.errors import EmulatorError
from emulator.fingerprint import fingerprint
from emulator.outputs.atomic import write_atomic
from emulator.outputs.destination import DestinationError, check_file
from emulator.scenario.spec import Scenario

SCHEMA_VERSION = 2
METRICS = ("iteration_time_s", "tokens_per_s", "mfu", "peak_bytes_per_gpu", "fits", "gpus")
_COLUMNS = ("key", "scenario", "varied", "resolved", "status", "error", "summary") + METRICS + ("emulator", "created")
_CREATE = """
CREATE TABLE IF NOT EXISTS results (
    key TEXT PRIMARY KEY,
    scenario TEXT NOT NULL,
    varied TEXT NOT NULL,
    resolved TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('ok', 'error')),
    error TEXT,
    summary TEXT,
    iteration_time_s REAL,
    tokens_per_s REAL,
    mfu REAL,
    peak_bytes_per_gpu REAL,
    fits INTEGER,
    gpus INTEGER,
    emulator TEXT,
    created REAL
);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class StoreError(EmulatorError):
    """The results database cannot be opened or is not one of ours."""


def _lock(path: str) -> int | None:
    """Hold ``PATH.lock`` exclusively (the lock dies with the process; a normal close removes the file); StoreError
    if another process holds it. None where flock is missing (not POSIX): no protection there. The holder unlinks
    the file before it lets go, so a process that locked a file no longer at ``PATH.lock`` opens it again."""
    try:
        import fcntl
    except ImportError:
        return None
    lock_path = path + ".lock"
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        raise StoreError(f"{lock_path}: cannot create the lock file of {path} ({exc.strerror})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "?"
        os.close(fd)
        raise StoreError(f"{path}: another sweep or search (pid {holder}) is writing this results database; "
                         "wait for it to finish, or give another --db") from None
    try:
        same = os.path.samestat(os.fstat(fd), os.stat(lock_path))
    except OSError:
        same = False
    if not same:  # the previous holder removed this file as it closed: lock the one now at the path
        os.close(fd)
        return _lock(path)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def canonical_json(obj: Any) -> str:
    """Deterministic JSON: sorted keys, no spaces, no NaN."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def resolved_dict(scenario: Scenario) -> dict:
    """The loaded scenario as plain data, without ``path`` and ``given`` (where it was read from)."""
    d = dataclasses.asdict(scenario)
    d.pop("path", None)
    d.pop("given", None)
    return d


_FILE_HASHES: dict[tuple[str, float, int], str] = {}


def _file_hash(path: str) -> str:
    try:
        st = os.stat(path)
    except OSError:
        return "missing"
    key = (path, st.st_mtime, st.st_size)
    if key not in _FILE_HASHES:
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        _FILE_HASHES[key] = h.hexdigest()
    return _FILE_HASHES[key]


def scenario_key(scenario: Scenario) -> str:
    """The configuration's key: sha256 of the resolved scenario and its input files."""
    files = [p for p in (scenario.workload.trace, scenario.cluster.fabric.graph) if p]
    doc = {"scenario": resolved_dict(scenario), "files": {p: _file_hash(p) for p in files}}
    return hashlib.sha256(canonical_json(doc).encode()).hexdigest()


@dataclass(frozen=True)
class Row:
    """One configuration's outcome."""

    key: str
    scenario: str
    varied: dict
    resolved: dict
    status: str  # ok | error
    error: str | None
    summary: dict | None
    emulator: str | None = None  # the fingerprint of the emulator that computed it

    def metric(self, name: str) -> Any:
        """A summary value by dotted path ("tokens_per_s", "memory.fits", "breakdown_s.bubble")."""
        node: Any = self.summary or {}
        for part in name.split("."):
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node


def make_row(key: str, scenario: Scenario, varied: dict, summary: dict | None = None,
             error: str | None = None) -> Row:
    return Row(key, scenario.name, dict(varied), resolved_dict(scenario),
               "ok" if error is None else "error", error, summary, fingerprint())


def _flat(row: Row) -> tuple:
    s = row.summary or {}
    mem = s.get("memory") or {}
    fits = mem.get("fits")
    return (s.get("iteration_time_s"), s.get("tokens_per_s"), s.get("mfu"), mem.get("peak_bytes_per_gpu"),
            None if fits is None else int(bool(fits)), s.get("gpus"))


class ResultStore:
    """A SQLite results database: ``create=True`` to write (created on first use), ``create=False`` to read.

    A file that is not ours is never modified: an existing file is first opened read-only and must hold
    our ``meta`` (with a schema version) and ``results`` tables; anything else is a StoreError and the
    file is left byte-identical. A writer holds an exclusive lock (``flock`` on ``PATH.lock``, released
    when the process ends, even by SIGKILL) for as long as it is open, so a second sweep or search on the
    same database is refused with a message instead of running every point again. Readers take no lock.
    """

    def __init__(self, path: str, create: bool = True) -> None:
        self.path = path
        self._lock: int | None = None
        if not create and not os.path.isfile(path):
            what = "is a folder, not a" if os.path.isdir(path) else "no such"
            raise StoreError(f"{path}: {what} results database")
        if create:
            try:
                check_file(path)
            except DestinationError as exc:
                raise StoreError(f"{exc}; a study writes its results there") from None
        version = self._inspect() if os.path.isfile(path) and os.path.getsize(path) > 0 else None
        if not create:
            self.version = version or str(SCHEMA_VERSION)
            self.db = self._connect_readonly()
            return
        self._lock = _lock(path)
        try:
            self.db = sqlite3.connect(path, timeout=30.0)  # DML opens a transaction; `with self.db` commits it
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: a killed process loses nothing committed
            self.db.executescript(_CREATE)
            with self.db:
                self.db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
                if version == "1":
                    self._upgrade_from_1()
        except sqlite3.DatabaseError as exc:
            self._unlock()
            raise StoreError(f"{path}: cannot write the results database ({exc})") from None
        self.version = str(SCHEMA_VERSION)

    def _uri(self, immutable: bool = False) -> str:
        return f"file:{urllib.parse.quote(os.path.abspath(self.path))}?mode=ro" + ("&immutable=1" if immutable else "")

    def _connect_readonly(self) -> sqlite3.Connection:
        """A read-only connection; in a folder we may not write (no -shm can be made), an immutable one."""
        try:
            con = sqlite3.connect(self._uri(), uri=True, timeout=30.0)
            con.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
            return con
        except sqlite3.OperationalError:
            if os.access(os.path.dirname(os.path.abspath(self.path)), os.W_OK):
                raise
            return sqlite3.connect(self._uri(immutable=True), uri=True)

    def _inspect(self) -> str:
        """The schema version of an existing file, read without writing to it; StoreError if it is not ours."""
        path = self.path
        if not os.access(path, os.R_OK):
            raise StoreError(f"{path}: the results database is not readable (no read permission)")
        try:
            con = self._connect_readonly()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{path}: not a results database (SQLite cannot read it: {exc}); "
                             "it was left untouched") from None
        try:
            tables = {n for (n,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            missing = [t for t in ("meta", "results") if t not in tables]
            if missing:
                found = ", ".join(sorted(tables)) or "none"
                raise StoreError(f"{path}: a SQLite database, but not a results database of the emulator (tables: "
                                 f"{found}; no {' or '.join(missing)} table); it was left untouched, give another --db")
            row = con.execute("SELECT value FROM meta WHERE name='schema_version'").fetchone()
            columns = {r[1] for r in con.execute("PRAGMA table_info(results)")}
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{path}: not a results database ({exc}); it was left untouched") from None
        finally:
            con.close()
        if row is None:
            raise StoreError(f"{path}: not a results database of the emulator (its meta table has no schema_version); "
                             "it was left untouched, give another --db")
        version = str(row[0])
        if version not in ("1", str(SCHEMA_VERSION)):
            raise StoreError(f"{path}: results database schema {version}, this emulator reads {SCHEMA_VERSION}")
        need = set(_COLUMNS) - ({"emulator"} if version == "1" else set())
        if not need <= columns:
            raise StoreError(f"{path}: not a results database of the emulator (its results table lacks "
                             f"{', '.join(sorted(need - columns))}); it was left untouched, give another --db")
        return version

    def _upgrade_from_1(self) -> None:
        """Schema 1 → 2 (inside the caller's transaction): add ``emulator``; every old row is stale."""
        self.db.execute("ALTER TABLE results ADD COLUMN emulator TEXT")
        self.db.execute("UPDATE meta SET value=? WHERE name='schema_version'", (str(SCHEMA_VERSION),))

    def _unlock(self) -> None:
        if self._lock is not None:
            try:
                os.unlink(self.path + ".lock")  # while still held: no lock file is left after a normal exit
            except OSError:
                pass
            os.close(self._lock)  # releases the flock
            self._lock = None

    def close(self) -> None:
        if self._lock is not None:  # the writer: fold the WAL back, so no -wal/-shm stays, nor appears for readers
            try:
                self.db.execute("PRAGMA journal_mode=DELETE")
            except sqlite3.Error:
                pass  # another connection still reads it: SQLite keeps WAL, and the data is safe either way
        self.db.close()
        self._unlock()

    def __enter__(self) -> "ResultStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def record(self, row: Row) -> bool:
        """Write one finished point in its own transaction; False if its key was already there from the
        same emulator (a row from another emulator is replaced)."""
        varied = json.dumps(row.varied)  # in --vary order
        values = (row.key, row.scenario, varied, canonical_json(row.resolved), row.status,
                  row.error, None if row.summary is None else json.dumps(row.summary, sort_keys=True),
                  *_flat(row), row.emulator, time.time())
        update = ", ".join(f"{c}=excluded.{c}" for c in _COLUMNS[1:])
        try:
            with self.db:  # BEGIN ... COMMIT
                cur = self.db.execute(f"INSERT INTO results ({', '.join(_COLUMNS)}) "
                                      f"VALUES ({', '.join('?' * len(_COLUMNS))}) "
                                      f"ON CONFLICT(key) DO UPDATE SET {update} "
                                      "WHERE results.emulator IS NOT excluded.emulator", values)
        except sqlite3.OperationalError as exc:  # disk full, the file made read-only meanwhile, ...
            raise StoreError(f"{self.path}: cannot write the results database ({exc}); every point committed "
                             "before this one is kept") from None
        return cur.rowcount == 1

    def done_keys(self, keys: Iterable[str] | None = None) -> set[str]:
        """Keys with a row (ok or error) from this emulator, among ``keys`` (all when None)."""
        return self._keys("emulator IS ?", keys)

    def stale_keys(self, keys: Iterable[str] | None = None) -> set[str]:
        """Keys whose row comes from another emulator (or from before fingerprints), among ``keys``."""
        return self._keys("emulator IS NOT ?", keys)

    def _keys(self, condition: str, keys: Iterable[str] | None) -> set[str]:
        if self.version == "1":  # opened read-only, so never upgraded: every row is stale
            condition = condition.replace("emulator", "NULL")
        found = {k for (k,) in self.db.execute(f"SELECT key FROM results WHERE {condition}", (fingerprint(),))}
        return found if keys is None else found & set(keys)

    def delete_errors(self, keys: Iterable[str]) -> int:
        """Forget the error rows of ``keys`` (so that they run again); returns how many."""
        n = 0
        with self.db:
            for k in keys:
                n += self.db.execute("DELETE FROM results WHERE key=? AND status='error'", (k,)).rowcount
        return n

    def rows(self, keys: Sequence[str] | None = None) -> list[Row]:
        """Rows in the order of ``keys`` (missing keys skipped), or all rows in a stable order."""
        emulator = "emulator" if self.version != "1" else "NULL"  # a schema-1 file opened read-only
        cur = self.db.execute(f"SELECT key, scenario, varied, resolved, status, error, summary, {emulator} "
                              "FROM results")
        found = {r[0]: Row(r[0], r[1], json.loads(r[2]), json.loads(r[3]), r[4], r[5],
                           None if r[6] is None else json.loads(r[6]), r[7]) for r in cur}
        if keys is None:
            return sorted(found.values(), key=lambda r: (r.scenario, canonical_json(r.varied), r.key))
        seen: set[str] = set()
        out = []
        for k in keys:
            if k in found and k not in seen:
                seen.add(k)
                out.append(found[k])
        return out

    def count(self) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM results").fetchone()[0])


# ------------------------------------------------------------------ CSV export

_CSV_METRICS = ("gpus", "iteration_time_s", "tokens_per_s", "samples_per_s", "model_tflops_per_gpu", "mfu", "hfu",
                "breakdown_s.compute", "breakdown_s.exposed_comm", "breakdown_s.bubble", "breakdown_s.other",
                "memory.peak_bytes_per_gpu", "memory.capacity_bytes", "memory.fits", "sim.events")


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, (dict, list)):
        return canonical_json(v)
    return str(v)


def csv_rows(rows: Sequence[Row]) -> list[list[str]]:
    """Header + one line per row: key, scenario, status, error, each varied key, the metrics.

    Deterministic: no wall-clock column (``sim.wall_s``, ``created``) is exported.
    """
    varied: list[str] = []
    for r in rows:
        for k in r.varied:
            if k not in varied:
                varied.append(k)
    out = [["key", "scenario", "status", "error", *varied, *_CSV_METRICS]]
    for r in rows:
        out.append([r.key, r.scenario, r.status, r.error or "", *(_cell(r.varied.get(k)) for k in varied),
                    *(_cell(r.metric(m)) for m in _CSV_METRICS)])
    return out


def export_csv(rows: Sequence[Row], path: str) -> None:
    """Write ``rows`` as CSV, atomically."""
    table = csv_rows(rows)
    write_atomic(path, lambda fh: csv.writer(fh, lineterminator="\n").writerows(table))
