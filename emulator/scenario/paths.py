"""Input paths: what a path names, in words, when it is not a readable regular file.

A scenario names files (a trace, a graph, a catalog); the loader and the importers read
them. A path that is missing, a dangling or looping symbolic link, a device such as
/dev/zero (endless), a named pipe (blocks) or a folder is not a file to read: ``problem``
says which, so that the message names the real fault instead of "file not found".
"""
from __future__ import annotations

import errno
import os
import stat

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"))


def problem(path: str, folder_ok: bool = False) -> str | None:
    """None when ``path`` is a regular file (or a folder, with ``folder_ok``); else what it is instead."""
    try:
        st = os.stat(path)
    except OSError as err:
        return _missing(path, err)
    if stat.S_ISREG(st.st_mode) or (folder_ok and stat.S_ISDIR(st.st_mode)):
        return None
    what = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
    target = os.path.realpath(path)
    via = f' (a link to "{target}")' if target != os.path.abspath(path) else ""
    return f"{what}{via}, not a regular file"


def _missing(path: str, err: OSError) -> str:
    if err.errno == errno.ELOOP:
        return "a symbolic link loop (following the links never reaches a file)"
    if os.path.islink(path):
        return f'a dangling symbolic link (to "{os.readlink(path)}", which does not exist)'
    if err.errno == errno.ENOENT:
        return "file not found"
    if err.errno == errno.ENOTDIR:
        return "file not found (a part of the path is a file, not a folder)"
    return f"cannot be read: {err.strerror or err}"
