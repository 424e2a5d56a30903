"""The watchdog of ``emulator live --real K``: a real rank that waits for one that never comes.

Real ranks talk over real process groups (``emulator.live.peers``), and a real wait has no
emulated end: a rank that waits for a peer that exited, or for an operation the peer never
issues, would wait until gloo's timeout (10 minutes) or for ever. ``emulator run`` reports the
same program as a deadlock; live must too.

Two sides, one small state file per real rank (JSON, replaced atomically):
- the child (``Beacon``): before each blocking wait on the real transport it writes what it waits
  in (operation, the group's world ranks, the real ranks it waits for, the peer of a send or
  receive) and clears it after; it also says whether the script called ``init_process_group``;
- the launcher (``verdict``, a pure function of those states, the exit codes and how long each
  state has stood): a deadlock is
  1. a rank blocked, for ``GRACE_S``, on a real rank that has exited (it can never take part); or
  2. every running rank blocked, none changed for ``QUIET_S``, in operations that do not pair up
     (a receive whose peer is not sending to it, a collective that a member is not in).
  The launcher then stops every process it started and exits 2 with the verdict, which names the
  rank, the operation and the peer.

Pure Python, no torch (the launcher imports it).
"""
from __future__ import annotations

import json
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

# a rank blocked on a peer that exited: its wait could still be ending (the peer's last send
# landed just before it exited), so it must stand this long before it is a deadlock
GRACE_S = 1.0
# every rank blocked, mismatched: the states are written by separate processes, so one may lag
# behind the other by a scheduling slice; this long unchanged is no race
QUIET_S = 3.0


class Beacon:
    """The child side: publishes the local real rank's blocking waits to ``path`` (None: off)."""

    def __init__(self, path: str | None, rank: int) -> None:
        self.path = path
        self.rank = rank
        self.seq = 0
        self.initialised = False
        self._waiting: dict | None = None

    def _write(self) -> None:
        if not self.path:
            return
        self.seq += 1
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump({"rank": self.rank, "seq": self.seq, "init": self.initialised, "waiting": self._waiting}, fh)
        os.replace(tmp, self.path)

    def init(self) -> None:
        """The script called init_process_group."""
        if not self.initialised:
            self.initialised = True
            self._write()

    @contextmanager
    def blocked(self, op: str, group: tuple[int, ...], on: tuple[int, ...], peer: int = -1) -> Iterator[None]:
        """A blocking wait in ``op`` over ``group`` (world ranks) for the real ranks ``on``;
        ``peer``: the other end of a send or receive."""
        if not self.path or self._waiting is not None:  # nested: the outer wait says it already
            yield
            return
        self._waiting = {"op": op, "group": sorted(group), "on": sorted(r for r in on if r != self.rank),
                         "peer": peer}
        self._write()
        try:
            yield
        finally:
            self._waiting = None
            self._write()


@dataclass(frozen=True)
class RankState:
    """What the launcher knows of one real rank."""

    rank: int
    waiting: dict | None  # op, group, on, peer; None: not blocked on the real transport
    initialised: bool
    exit_code: int | None  # None: still running
    stood_s: float  # how long this state (or the exit) has stood


def read_state(path: str, rank: int) -> tuple[dict | None, bool, int]:
    """(waiting, initialised, seq) from a rank's state file; (None, False, 0) if there is none yet."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return None, False, 0
    return doc.get("waiting"), bool(doc.get("init")), int(doc.get("seq", 0))


def _op(w: dict) -> str:
    if w["op"] == "rendezvous":
        return "the real ranks' rendezvous (before the script starts)"
    if w["op"] in ("send", "recv"):
        return f"{w['op']} {'to' if w['op'] == 'send' else 'from'} real rank {w['peer']}"
    return f"{w['op']} over ranks {w['group']}"


def _pairs(w: dict, rank: int, other: dict | None) -> bool:
    """Whether ``other`` (a member's wait) is the counterpart of ``w`` (rank ``rank``'s)."""
    if other is None:
        return False
    if w["op"] == "send":
        return other["op"] == "recv" and other["peer"] == rank
    if w["op"] == "recv":
        return other["op"] == "send" and other["peer"] == rank
    return other["op"] == w["op"] and other["group"] == w["group"]


def verdict(states: list[RankState], grace_s: float = GRACE_S, quiet_s: float = QUIET_S) -> str | None:
    """The deadlock among the real ranks, in words, or None while the run may still go on."""
    by = {s.rank: s for s in states}
    for s in states:
        if s.exit_code is not None or s.waiting is None:
            continue
        for p in s.waiting["on"]:
            q = by.get(p)
            if q is None or q.exit_code is None or min(s.stood_s, q.stood_s) < grace_s:
                continue
            never = ("without calling init_process_group" if not q.initialised else
                     "without " + ("sending it" if s.waiting["op"] == "recv" else
                                   "receiving it" if s.waiting["op"] == "send" else "issuing it"))
            whom = "" if s.waiting["op"] in ("send", "recv") else f" for real rank {p}"
            return (f"deadlock: real rank {s.rank} waits in {_op(s.waiting)}{whom}, "
                    f"which exited with code {q.exit_code} {never}")
    running = [s for s in states if s.exit_code is None]
    waits = {s.rank: s.waiting for s in running if s.waiting is not None and s.stood_s >= quiet_s}
    if len(running) < 2 or len(waits) < len(running):
        return None
    if all(_pairs(w, r, by[p].waiting) for r, w in waits.items() for p in w["on"] if p in by):
        return None  # every wait has its counterpart: a slow transfer, not a deadlock
    return (f"deadlock: every real rank has waited {quiet_s:g} s or more, and the waits do not pair up: "
            + "; ".join(f"real rank {r} waits in {_op(w)}" for r, w in waits.items()))
