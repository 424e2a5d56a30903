"""A file of measured MoE expert loads (``model.moe_expert_load: FILE``): one line per MoE layer.

Each non-empty line holds one number of at least 0 per expert, in expert order, separated by commas or
white space; ``#`` starts a comment. A user writes it from the router's per-layer token counts (Megatron-Core
router.py keeps ``tokens_per_expert`` for the load-balancing loss), a row per MoE layer in layer order.
Pure: text in, rows out; a problem names the file's line and what was expected.
"""
from __future__ import annotations

import math
import re

MAX_LOAD_FILE_BYTES = 16 << 20  # 61 layers × 256 experts of counts is about 160 kB
_SPLIT = re.compile(r"[,\s]+")


class LoadFileError(ValueError):
    """A line of a load file that is not a row of numbers; ``line`` is 1-based."""

    def __init__(self, line: int, message: str) -> None:  # noqa: D107
        super().__init__(message)
        self.line = line


def parse_loads(text: str) -> tuple[tuple[float, ...], ...]:
    """The rows of a load file (one per MoE layer), each a tuple of numbers of at least 0."""
    rows: list[tuple[float, ...]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        body = raw.split("#", 1)[0].strip()
        if body:
            rows.append(_row(body, number))
    if not rows:
        raise LoadFileError(0, "the file holds no row of numbers (one line per MoE layer)")
    return tuple(rows)


def _row(body: str, line: int) -> tuple[float, ...]:
    out: list[float] = []
    for word in _SPLIT.split(body):
        if not word:
            continue
        try:
            x = float(word)
        except ValueError:
            raise LoadFileError(line, f"expected numbers of at least 0, got {word!r}") from None
        if not math.isfinite(x) or x < 0:
            raise LoadFileError(line, f"expected numbers of at least 0, got {word}")
        out.append(x)
    return tuple(out)
