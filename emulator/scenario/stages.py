"""The split of a model's layers over its pipeline chunks (virtual stages).

A model of L layers on pp stages of v chunks each has V = pp·v chunks; chunk k (in
model order) is chunk k // pp of stage k % pp (schedules.py). Chunk 0 also holds the
embedding and chunk V − 1 the LM head and loss, so an even split leaves the first
and last stages heavier. Megatron-LM lightens them with
``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``,
and the Llama 3 paper (§3.3.2) removes one layer each from the first and the last
stage of its 126-layer, PP-16 run ("the first model chunk on the first stage has
only the embedding, and the last model chunk on the last stage has only output
projection and loss").

``parallel.first_chunk_layers`` and ``parallel.last_chunk_layers`` give the layers
of chunk 0 and chunk V − 1; the other chunks split the rest evenly. With
virtual_stages = 1 a chunk is a pipeline stage, as in Megatron's flags; with a
single chunk (pp = v = 1) they do not apply. Either end may hold 0 layers (only
the embedding, or only the head); a middle chunk holds at least one.
"""
from __future__ import annotations

from emulator.errors import ScenarioError


def chunk_layers(layers: int, pp: int, virtual: int = 1, first: int | None = None,
                 last: int | None = None) -> tuple[int, ...]:
    """Layers of each of the pp·virtual chunks, in model order."""
    V = pp * virtual
    if first is None and last is None:
        if layers % V:
            raise ScenarioError(f"model.layers ({layers}) must be divisible by pp*virtual_stages = {pp}*{virtual} = "
                                f"{V}, or set parallel.first_chunk_layers / last_chunk_layers for an uneven split",
                                key="parallel.pp")
        return (layers // V,) * V
    if V == 1:  # one chunk holds everything; the ends do not apply (a sweep over pp may include 1)
        return (layers,)
    ends = [x for x in (first, last) if x is not None]
    middle = V - len(ends)
    rest = layers - sum(ends)
    key = "parallel.first_chunk_layers" if first is not None else "parallel.last_chunk_layers"
    given = " and ".join(f"{n} {x}" for n, x in (("first_chunk_layers", first), ("last_chunk_layers", last))
                         if x is not None)
    if middle == 0 and rest != 0:
        raise ScenarioError(f"{given}: the {V} chunks must hold all {layers} layers", key=key)
    if middle and (rest < middle or rest % middle):
        raise ScenarioError(f"{given} leave {rest} of {layers} layers for the other {middle} of {V} chunks "
                            f"(pp*virtual_stages): they must share them evenly, at least one each", key=key)
    each = rest // middle if middle else 0
    out = [each] * V
    if first is not None:
        out[0] = first
    if last is not None:
        out[-1] = last
    return tuple(out)


def stage_layers(chunks: tuple[int, ...], pp: int) -> list[tuple[int, ...]]:
    """The layers of each chunk of each stage: ``[stage][c]`` = layers of chunk c·pp + stage."""
    return [tuple(chunks[c * pp + s] for c in range(len(chunks) // pp)) for s in range(pp)]


def balanced_ends(layers: int, chunks: int) -> int | None:
    """Layers for the first and the last chunk when ``layers`` do not split evenly over ``chunks``:
    the most that leaves the middle chunks an even share at least as large (the ends also hold the
    embedding and the head). 126 layers on 16 chunks: 7 (14 × 8 between); on 128: 0 (126 × 1).
    None when an even split exists or no such split does."""
    if chunks < 3 or layers % chunks == 0:
        return None
    for x in range(layers // chunks, -1, -1):
        rest = layers - 2 * x
        if rest % (chunks - 2) == 0 and rest // (chunks - 2) >= max(x, 1):
            return x
    return None
