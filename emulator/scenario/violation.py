"""A broken rule of the rule book: the key path to change and what is wrong, in the loader's words."""
from __future__ import annotations

from dataclasses import dataclass

from emulator.errors import ScenarioError


@dataclass(frozen=True)
class Violation:
    """One broken rule: the key path to change and what is wrong, in the loader's words."""

    key: str
    message: str

    def error(self) -> ScenarioError:
        return ScenarioError(self.message, key=self.key)
