"""Figures on disk: every plot the emulator draws is saved here, as PNG and SVG, as one set.

The pair is written with :func:`emulator.outputs.fileset.write_set` (the PNG is the
marker): a PNG never sits beside the SVG of another drawing, and other files in
the folder are left alone.
"""
from __future__ import annotations

import io
import os
from typing import Any

from emulator.outputs.atomic import write_atomic
from emulator.outputs.fileset import write_set


def _render(fig: Any, fmt: str) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=120)
    return buf.getvalue()


def save_figure(fig: Any, path: str) -> list[str]:
    """Write ``fig`` as ``path`` (PNG) and the same name with .svg; return the two paths."""
    folder, stem = os.path.split(os.path.splitext(os.path.abspath(path))[0])
    names = (f"{stem}.png", f"{stem}.svg")
    data = {name: _render(fig, name.rsplit(".", 1)[1]) for name in names}
    writers = {name: (lambda p, b=data[name]: write_atomic(p, lambda fh: fh.write(b), binary=True)) for name in names}
    write_set(folder, writers, names)
    return [os.path.join(os.path.dirname(path), n) for n in names]
