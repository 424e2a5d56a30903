"""Send/recv pairs of an imported trace: each send and the recv it pairs with agree on the bytes.

The engine pairs sends and recvs by (source, destination, tag), oldest first
(emulator/run/engine.py): the k-th send from rank a to rank b with tag t meets the k-th
recv on b from a with tag t. In file order (the order of each rank's stream) that pairing
is known before the run, so a size that differs between the two sides is a defect of the
trace, reported here with both ops, instead of being settled silently by the send's size.
"""
from __future__ import annotations

from emulator.program import RECV, SEND, Op, Program

Key = tuple[int, int, int]  # (source rank, destination rank, tag)


def pair_mismatch(program: Program) -> str | None:
    """The first send whose recv expects another number of bytes, in words; None when all agree."""
    sends: dict[Key, list[Op]] = {}
    recvs: dict[Key, list[Op]] = {}
    for op in program.ops:
        if op.kind is SEND:
            sends.setdefault((op.rank, op.peer, op.tag), []).append(op)
        elif op.kind is RECV:
            recvs.setdefault((op.peer, op.rank, op.tag), []).append(op)
    for key in sorted(sends.keys() & recvs.keys()):
        for k, (s, r) in enumerate(zip(sends[key], recvs[key])):
            if s.bytes != r.bytes:
                src, dst, tag = key
                return (f"send op {s.id} (rank {src} to rank {dst}, tag {tag}) carries {s.bytes:g} B but the recv "
                        f"it pairs with, op {r.id} on rank {dst}, expects {r.bytes:g} B (send and recv #{k + 1} "
                        f"from rank {src} to rank {dst} with tag {tag}); expected the same size on both sides")
    return None
