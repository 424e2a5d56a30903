"""Atomic file writes: write to a temporary file in the same folder, fsync, rename.

A reader (or a killed run) never sees a half-written output file.
"""
from __future__ import annotations

import os
import tempfile
from typing import IO, Any, Callable


def write_atomic(path: str, write: Callable[[IO[Any]], object], binary: bool = False) -> None:
    """Call ``write(fh)`` on a temporary file, then rename it over ``path``."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
    try:
        fh: IO[Any]
        with (os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8", newline="")) as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_text(path: str, text: str) -> None:
    write_atomic(path, lambda fh: fh.write(text))
