"""NCCL's double binary tree over the nodes of a communicator.

A port of ``ncclGetBtree`` and ``ncclGetDtree`` from NCCL's src/graph/trees.cc
(github.com/NVIDIA/nccl, commit 5067397c, NCCL 2.30.7). The first tree is a
binary tree over node indices 0..n−1 with the root at 0; the second is its mirror
(n even) or its shift by one (n odd), so that a node that is interior in one tree
is a leaf in the other, and the two trees together load every node alike. NCCL
gives half of the channels the first tree and half the second; inside a node each
tree channel is a chain through the node's GPUs.
"""
from __future__ import annotations


def btree(n: int, rank: int) -> tuple[int, int, int]:
    """(parent, child0, child1) of ``rank`` in NCCL's binary tree of n ranks; −1: none."""
    bit = 1
    while bit < n:
        if bit & rank:
            break
        bit <<= 1
    if rank == 0:
        return -1, -1, (bit >> 1 if n > 1 else -1)
    up = (rank ^ bit) | (bit << 1)
    if up >= n:
        up = rank ^ bit
    lowbit = bit >> 1
    down0 = -1 if lowbit == 0 else rank - lowbit
    down1 = -1 if lowbit == 0 else rank + lowbit
    while down1 >= n:  # as trees.cc: recompute with the current lowbit, then halve it
        down1 = -1 if lowbit == 0 else rank + lowbit
        lowbit >>= 1
    return up, down0, down1


def dtree(n: int, rank: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(parent, child0, child1) of ``rank`` in each of NCCL's two trees."""
    first = btree(n, rank)
    if n % 2 == 1:  # shift
        u, d0, d1 = btree(n, (rank - 1 + n) % n)
        second = tuple(-1 if x == -1 else (x + 1) % n for x in (u, d0, d1))
    else:  # mirror
        u, d0, d1 = btree(n, n - 1 - rank)
        second = tuple(-1 if x == -1 else n - 1 - x for x in (u, d0, d1))
    return first, (second[0], second[1], second[2])


def parents(n: int, tree: int) -> list[int]:
    """The parent of each of n ranks in tree 0 or 1 (−1 at the root)."""
    return [dtree(n, r)[tree][0] for r in range(n)]


def depth(parent: list[int]) -> int:
    """Edges on the longest root-to-leaf path of a tree given by its parent list."""
    best = 0
    for r in range(len(parent)):
        d, x = 0, r
        while parent[x] != -1:
            x = parent[x]
            d += 1
            if d > len(parent):
                raise ValueError("not a tree: a cycle in the parent list")
        best = max(best, d)
    return best
