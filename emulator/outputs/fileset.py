"""A file set: the files of one run in one folder, replaced together.

``emulator run --out DIR`` writes several files (summary.json, spans.csv,
trace.json, gantt.png). Each file being atomic is not enough: a new summary
must never sit beside an old trace. The protocol:

1. every file is written into a fresh staging folder ``DIR/.tmp-emulator-<pid>-*``
   (each atomically, fsynced); a failure or a kill here leaves DIR as it was;
2. under an exclusive lock on DIR (``flock``, so two runs into one folder
   commit one after the other), the old **marker** (the first name, summary.json)
   is removed first; then each other name of the set is renamed in, or removed
   when this run does not write it (gantt.png with ``--no-gantt``); the new
   marker is renamed in last;
3. the staging folder is removed and the folder entry fsynced.

So **when the marker exists, every file of the set beside it comes from the
same run.** A kill during step 2 leaves no marker (a folder with no summary is
an unfinished run). Staging folders of dead processes are removed by the next
write into DIR (:func:`emulator.outputs.atomic.remove_stale`). A replaced file
keeps its mode; a new one gets ``0666 & ~umask``. Files in DIR whose names are
not in the set are never touched.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from typing import Callable, Iterator, Mapping, Sequence

from emulator.outputs.atomic import file_mode, fsync_folder, remove_stale, tmp_prefix
from emulator.outputs.destination import write_error

Writer = Callable[[str], object]  # writes one file at the path it is given


@contextmanager
def _locked(folder: str) -> Iterator[None]:
    """An exclusive flock on the folder itself (no lock file is left behind); none where flock is missing."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def write_set(folder: str, writers: Mapping[str, Writer], names: Sequence[str]) -> list[str]:
    """Write ``writers`` (name → writer) into ``folder`` as one set among ``names`` (the marker first);
    names of the set without a writer are removed. Returns the paths written, in ``names`` order."""
    marker, rest = names[0], list(names[1:])
    stage = ""
    try:
        os.makedirs(folder, exist_ok=True)
        remove_stale(folder)
        stage = tempfile.mkdtemp(prefix=tmp_prefix(), dir=folder)
        for name in names:
            if name in writers:
                writers[name](os.path.join(stage, name))
        with _locked(folder):
            modes = {n: file_mode(os.path.join(folder, n)) for n in writers}
            _unlink(os.path.join(folder, marker))
            for name in [*rest, marker]:
                target = os.path.join(folder, name)
                if name not in writers:
                    _unlink(target)
                    continue
                staged = os.path.join(stage, name)
                os.chmod(staged, modes[name])
                os.replace(staged, target)
            fsync_folder(folder)
    except OSError as exc:
        raise write_error(folder, exc) from None
    finally:
        if stage:
            shutil.rmtree(stage, ignore_errors=True)
    return [os.path.join(folder, n) for n in names if n in writers]
