"""Results files of the benchmark scripts: ``benchmarks/results/NAME.json``, written atomically.

Every table of measured figures in the README and the docs site is rendered from one of these files
at build time (docs/results_tables.py); no figure is typed by hand. Each file records which script
wrote it, when, and on which commit, beside the script's own results.
"""
from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")


def commit() -> str:
    """The checkout's commit, with ``+dirty`` when tracked files under emulator/ differ from it."""
    try:
        rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--", "emulator"], capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return rev + ("+dirty" if dirty else "")


def stamp(script: str) -> dict[str, Any]:
    """Who wrote a results file: the script, the UTC time, the commit and the load average."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"written_by": os.path.relpath(os.path.abspath(script), ROOT),
            "measured_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": commit(), "load_average": load, "python": sys.version.split()[0]}


def results_path(name: str) -> str:
    return os.path.join(RESULTS, f"{name}.json")


def read(name: str) -> dict[str, Any] | None:
    """A results file's content, or None where none was written yet."""
    try:
        with open(results_path(name), encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        return None


def write(name: str, doc: dict[str, Any]) -> str:
    """Write ``doc`` as benchmarks/results/NAME.json atomically (temporary file, fsync, rename)."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from emulator.outputs.atomic import write_text

    os.makedirs(RESULTS, exist_ok=True)
    path = results_path(name)
    write_text(path, json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    return path
