"""Printable text: user-given strings made safe for a terminal line or a figure title.

A scenario name, a file name or a key comes from the user and may hold an ESC
(a terminal escape sequence that recolours, moves the cursor or retitles the
window), a newline (a forged extra line of output), a carriage return, a bidi
override or a NUL. ``printable`` writes each such character as a visible escape
(``\\x1b``, ``\\n``, ``\\u202e``) and leaves all other text, accents and CJK
included, as it is. ``figure_text`` also escapes ``$``, which matplotlib would
read as the start of a formula.
"""
from __future__ import annotations

import unicodedata

# Unicode categories that a terminal acts on instead of showing: controls (Cc: C0, DEL, C1),
# format characters (Cf: bidi overrides, zero-width joiners), line and paragraph separators
# (Zl, Zp), and unpaired surrogates (Cs) that cannot be encoded for output
_HIDDEN = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: str, keep: str = "") -> str:
    """``text`` with every control or invisible formatting character escaped, except those in
    ``keep`` (e.g. ``"\\n\\t"`` for a multi-line report). Backslashes are left alone: this is for
    reading, not for parsing back (a name spelt ``a\\x1b`` and one holding an ESC look alike)."""
    return "".join(ch if ch in keep or unicodedata.category(ch) not in _HIDDEN else _escape(ch) for ch in text)


def figure_text(text: str) -> str:
    """``printable(text)`` for a matplotlib title or label: ``$`` escaped so that it shows as itself."""
    return printable(text).replace("$", r"\$")
