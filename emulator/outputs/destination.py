"""Destinations: the paths a command will write, checked before any work is done.

A destination is a file (``sweep --csv``, ``plot --out``, ``calibrate --out``,
``--db``) or a folder (``run --out``). ``check_file`` and ``check_folder``
raise a DestinationError (an EmulatorError, so exit code 2) whose one line
names the path and what is wrong with it:

- a folder where a file is expected, or a file (or a device, a pipe, ...)
  where a folder is expected;
- a path that lies below a file (``out.txt/x``);
- a file that exists but is read-only, or not a regular file;
- a folder that is not writable: the destination's own folder, or, when
  folders have to be created, the nearest one that exists.

A folder counts as writable when ``os.access`` says so and a temporary file
can really be created in it (and is removed at once), so the checks agree with
what the kernel will allow, even for root. They run again where the file is written: a path that changes between
the check and the write still fails cleanly, only later.
"""
from __future__ import annotations

import os
import stat
import tempfile
from typing import Sequence

from emulator.errors import EmulatorError


class DestinationError(EmulatorError):
    """A path that cannot be written as asked."""


def _name(label: str, path: str) -> str:
    return f"{label} {path}" if label else path


def _writable_folder(folder: str) -> bool:
    """The kernel lets us create a file in ``folder``: asked (``os.access``), then tried (a temporary file,
    removed at once), since root passes every ``access`` check on folders where creation still fails."""
    if not os.access(folder, os.W_OK | os.X_OK):
        return False
    try:
        fd, probe = tempfile.mkstemp(prefix=f".tmp-emulator-{os.getpid()}-probe-", dir=folder)
    except OSError:
        return False
    os.close(fd)
    os.unlink(probe)
    return True


def _check_creatable(folder: str, label: str, path: str) -> None:
    """``folder`` exists and is writable, or can be created: its nearest existing ancestor is a writable folder.
    Paths are named as the user wrote them (relative stays relative)."""
    folder = os.path.normpath(folder or ".")
    probe = folder
    while not os.path.lexists(probe):
        parent = os.path.dirname(probe) or "."
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        raise DestinationError(f"{_name(label, path)}: lies below {probe}, which is a file, not a folder")
    if not _writable_folder(probe):
        what = "its folder" if probe == folder else "cannot create it: the folder"
        raise DestinationError(f"{_name(label, path)}: {what} {probe} is not writable")


def check_file(path: str, label: str = "") -> None:
    """``path`` can be created or replaced as a regular file (``label``: the option that named it)."""
    if not path:
        raise DestinationError(f"{label or 'output'}: expected a file name, got an empty one")
    if os.path.isdir(path):
        raise DestinationError(f"{_name(label, path)}: is a folder; expected a file name")
    if os.path.lexists(path):
        try:
            mode = os.stat(path).st_mode
        except OSError as exc:  # a dangling or looping symbolic link
            raise DestinationError(f"{_name(label, path)}: is a symbolic link that leads nowhere "
                                   f"({exc.strerror})") from None
        if not stat.S_ISREG(mode):
            raise DestinationError(f"{_name(label, path)}: is not a regular file (a device, pipe or socket)")
        if not os.access(path, os.W_OK):
            raise DestinationError(f"{_name(label, path)}: is read-only")
    _check_creatable(os.path.dirname(path), label, path)


def check_folder(path: str, label: str = "", names: Sequence[str] = ()) -> None:
    """``path`` is a writable folder, or can be created; ``names`` (files the command writes in it) are not
    folders."""
    if not path:
        raise DestinationError(f"{label or 'output'}: expected a folder name, got an empty one")
    if os.path.islink(path) and not os.path.exists(path):
        raise DestinationError(f"{_name(label, path)}: is a broken symbolic link")
    if os.path.lexists(path) and not os.path.isdir(path):
        what = "a file" if os.path.isfile(path) else "a device, pipe or socket"
        raise DestinationError(f"{_name(label, path)}: exists and is {what}, not a folder")
    if os.path.isdir(path):
        if not _writable_folder(path):
            raise DestinationError(f"{_name(label, path)}: the folder is not writable")
        for name in names:
            inside = os.path.join(path, name)
            if os.path.isdir(inside):
                raise DestinationError(f"{_name(label, path)}: {inside} is a folder; the command writes a file "
                                       "there")
            if os.path.isfile(inside) and not os.access(inside, os.W_OK):
                raise DestinationError(f"{_name(label, path)}: {inside} is read-only; the command would replace it")
        return
    _check_creatable(path, label, path)


def write_error(path: str, exc: OSError) -> DestinationError:
    """The one-line error for an OSError met while writing ``path``."""
    return DestinationError(f"{path}: cannot write: {exc.strerror or exc}")
