"""Figures on disk: every plot the emulator draws is saved here, as PNG and SVG, atomically."""
from __future__ import annotations

import io
import os
from typing import Any

from emulator.outputs.atomic import write_atomic


def save_figure(fig: Any, path: str) -> list[str]:
    """Write ``fig`` as ``path`` (PNG) and the same name with .svg, each atomically."""
    stem = os.path.splitext(path)[0]
    out = []
    for ext in ("png", "svg"):
        buf = io.BytesIO()
        fig.savefig(buf, format=ext, dpi=120)
        target = f"{stem}.{ext}"
        write_atomic(target, lambda fh: fh.write(buf.getvalue()), binary=True)
        out.append(target)
    return out
