"""The emulator's fingerprint: a hash of the code and data that compute a result.

A results store reuses a finished point only when the emulator that computed it
is the one running now; any change to the package's sources (a cost model, a
catalog figure, a bug fix) gives a new fingerprint, and a study runs such points
again instead of mixing old and new numbers. It is the sha256 of every ``.py``
and ``.yaml`` file under ``emulator/``, in sorted path order, each as
``relative path NUL content NUL``; 16 hex digits are kept.

May import: nothing of the emulator (the bottom layer).
"""
from __future__ import annotations

import functools
import hashlib
import os

_PACKAGE = os.path.dirname(os.path.abspath(__file__))
_SUFFIXES = (".py", ".yaml")


def _sources(root: str) -> list[str]:
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        found += [os.path.join(folder, f) for f in files if f.endswith(_SUFFIXES)]
    return sorted(found, key=lambda p: os.path.relpath(p, root).replace(os.sep, "/"))


def fingerprint_of(root: str) -> str:
    """The fingerprint of the sources under ``root``."""
    h = hashlib.sha256()
    for path in _sources(root):
        h.update(os.path.relpath(path, root).replace(os.sep, "/").encode() + b"\0")
        with open(path, "rb") as fh:
            h.update(fh.read() + b"\0")
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def fingerprint() -> str:
    """The fingerprint of this emulator (computed once per process)."""
    return fingerprint_of(_PACKAGE)


def version() -> str:
    """The emulator's release (the installed distribution's, setup.cfg) and its fingerprint:
    ``emulator 0.1.0 (sources 0123456789abcdef)``; a checkout that is not installed says so."""
    from importlib import metadata

    try:
        release = metadata.version("emulator")
    except metadata.PackageNotFoundError:
        release = "(not installed)"
    return f"emulator {release} (sources {fingerprint()})"
