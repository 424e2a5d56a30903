"""Atomic file writes: write to a temporary file in the same folder, fsync, rename.

A reader (or a killed run) never sees a half-written output file.

- Temporary names are ``.tmp-emulator-<pid>-...``. A process killed with
  SIGKILL cannot remove its own; the next write into the same folder removes
  every one whose process is gone (:func:`remove_stale`), and never one of a
  live process.
- Permissions: a new file gets ``0666 & ~umask``, as ``open()`` would give it
  (not the ``0600`` of ``tempfile.mkstemp``); a file that replaces another
  keeps the mode of the one it replaces.
- Any OSError while writing becomes a DestinationError naming the path
  (exit code 2), and the temporary file is removed.
"""
from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
from typing import IO, Any, Callable

from emulator.outputs.destination import write_error

TMP_PREFIX = ".tmp-emulator-"
_TMP_NAME = re.compile(re.escape(TMP_PREFIX) + r"(\d+)-")


def tmp_prefix() -> str:
    """The prefix of this process's temporary files and folders."""
    return f"{TMP_PREFIX}{os.getpid()}-"


def current_umask() -> int:
    """The process's umask (read from /proc where it can be, so that it is never changed, even briefly)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode(path: str) -> int:
    """The mode a file written at ``path`` gets: that of the file it replaces, else ``0666 & ~umask``."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return 0o666 & ~current_umask()


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def remove_stale(folder: str) -> list[str]:
    """Remove the temporary files and folders of dead emulator processes in ``folder``; return their names."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    gone = []
    for name in sorted(names):
        m = _TMP_NAME.match(name)
        if m is None or _alive(int(m.group(1))):
            continue
        path = os.path.join(folder, name)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
            gone.append(name)
        except OSError:
            pass  # not ours to force
    return gone


def fsync_folder(folder: str) -> None:
    """Make the renames in ``folder`` durable (where the platform allows it)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: str, write: Callable[[IO[Any]], object], binary: bool = False) -> None:
    """Call ``write(fh)`` on a temporary file, then rename it over ``path``."""
    folder = os.path.dirname(os.path.abspath(path))
    tmp = ""
    try:
        os.makedirs(folder, exist_ok=True)
        remove_stale(folder)
        mode = file_mode(path)
        fd, tmp = tempfile.mkstemp(prefix=tmp_prefix(), dir=folder)
        fh: IO[Any]
        with (os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8", newline="")) as fh:
            write(fh)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        tmp = ""
        fsync_folder(folder)
    except OSError as exc:
        raise write_error(path, exc) from None
    finally:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)


def write_text(path: str, text: str) -> None:
    write_atomic(path, lambda fh: fh.write(text))
