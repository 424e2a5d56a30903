"""User-facing errors.

Every error that bad user input can cause derives from :class:`EmulatorError`;
the CLI prints ``str(err)`` as one line and exits with code 2. Anything else
escaping to the CLI is a bug in the emulator, not in the user's input.

May import: nothing of the emulator (the bottom layer).
"""
from __future__ import annotations


class EmulatorError(Exception):
    """Base of all user-facing errors (bad scenario, bad trace, deadlock, ...)."""


class ReportError(EmulatorError):
    """An error whose message is a report of several lines (a deadlock's waiting ops, one a line):
    the CLI prints each line, made printable, instead of one line with the breaks escaped."""


class ScenarioError(EmulatorError):
    """A scenario file (or a ``--set`` override) is wrong.

    ``str(err)`` is one line: ``FILE:LINE: KEY.PATH: what was expected, what was found``.
    ``where`` is ``FILE:LINE`` (or ``FILE``, or ``--set a.b=c``); ``key`` is the
    dotted key path; both may be empty.
    """

    def __init__(self, message: str, where: str = "", key: str = "") -> None:
        self.message = message
        self.where = where
        self.key = key
        super().__init__(self._text())

    def _text(self) -> str:
        parts = [p for p in (self.where, self.key) if p]
        text = ": ".join(parts + [self.message])
        return text.replace("\r", "\\r").replace("\n", "\\n")  # always one line

    def __str__(self) -> str:
        return self._text()


class UnitError(EmulatorError, ValueError):
    """A quantity is missing its unit, has an unknown unit, or an impossible value."""


class CatalogError(EmulatorError, KeyError):
    """An unknown GPU, node or model name (a KeyError with a readable message)."""

    def __str__(self) -> str:  # KeyError would quote its message
        return str(self.args[0]) if self.args else ""


def close_names(name: str, known: list[str], n: int = 3) -> list[str]:
    """Known names close to ``name``: those containing it, else difflib's close matches."""
    import difflib

    lower = name.lower()
    close = [k for k in known if (len(lower) >= 3 and lower in k.lower())
             or (len(k) >= 2 and k.lower() in lower)][:n]
    if close:
        return close
    folded = {k.lower(): k for k in known}
    return [folded[c] for c in difflib.get_close_matches(lower, list(folded), n=n, cutoff=0.6)]


def did_you_mean(name: str, known: list[str]) -> str:
    """'; did you mean "fabric"?' (or "" when nothing is close)."""
    close = close_names(name, known)
    if not close:
        return ""
    return "; did you mean " + " or ".join(f'"{c}"' for c in close) + "?"
