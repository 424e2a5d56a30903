"""Who stands for whom when a live run has K real ranks: the mirror rules of a mixed group.

Pure Python (no torch). In ``emulator live --real K`` world ranks 0..K−1 are real
processes and the rest are emulated. In a group (world ranks, in group order):
- the real members are the members below K;
- the emulated members, taken in group order, mirror the real members round-robin:
  the i-th emulated member holds the data of real member ``real[i mod R]`` (R real
  members). For the data-parallel group of a world of N = m·K this is rank r ↦ r mod K,
  the translate of the real block;
- a real member's *weight* is how many members hold its data: itself plus the emulated
  members that mirror it. A SUM over the group is then Σ_k w_k·x_k over the real members.
"""
from __future__ import annotations


def real_members(group: tuple[int, ...], real: int) -> tuple[int, ...]:
    """The members of ``group`` that are real processes (world rank < ``real``), in group order."""
    return tuple(r for r in group if r < real)


def mirrors(group: tuple[int, ...], real: int) -> dict[int, int]:
    """Each member of ``group`` → the real member whose data it holds (a real member → itself)."""
    reals = real_members(group, real)
    if not reals:
        raise ValueError(f"group {list(group)} has no real member (real ranks: 0..{real - 1})")
    out: dict[int, int] = {}
    i = 0
    for r in group:
        if r < real:
            out[r] = r
        else:
            out[r] = reals[i % len(reals)]
            i += 1
    return out


def weights(group: tuple[int, ...], real: int) -> dict[int, int]:
    """Each real member of ``group`` → the number of members that hold its data (itself included)."""
    w: dict[int, int] = {}
    for k in mirrors(group, real).values():
        w[k] = w.get(k, 0) + 1
    return w


def is_real(group: tuple[int, ...], real: int) -> bool:
    """Whether every member of ``group`` is a real process."""
    return all(r < real for r in group)
