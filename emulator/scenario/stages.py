"""The split of a model's layers over its pipeline chunks (virtual stages).

A model of L layers on pp stages of v chunks each has V = pp·v chunks; chunk k (in
model order) is chunk k // pp of stage k % pp (schedules.py), or, under a V-shaped schedule
(v = 2), on stage k for k < pp and 2·pp − 1 − k after (:func:`rank_of`). Chunk 0 also holds the
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

import re
from dataclasses import dataclass

from emulator.errors import ScenarioError


def chunk_layers(layers: int, pp: int, virtual: int = 1, first: int | None = None,
                 last: int | None = None) -> tuple[int, ...]:
    """Layers of each of the pp·virtual chunks, in model order."""
    V = pp * virtual
    if first is None and last is None:
        if layers % V:
            raise ScenarioError(f"model.layers ({layers}) must be divisible by pp*virtual_stages = {pp}*{virtual} = "
                                f"{V}, or set parallel.first_chunk_layers / last_chunk_layers for an uneven split "
                                f"(or account_for_embedding_in_pipeline_split / account_for_loss_in_pipeline_split, "
                                f"which count the embedding and the loss as layers)",
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


# V-shaped schedules (ZB-V, DualPipeV): two chunks per pipeline rank, rank i holding chunks i and
# 2·pp − 1 − i, so the first and the last chunk sit on rank 0 and chunks pp − 1 and pp on rank pp − 1
# (sail-sg/zero-bubble-pipeline-parallelism megatron/core/pipeline_parallel/zerobubble/scheduler/zbv.py
# ``create_schedule``: layer_group_idx = n_stages·chunk + (stage, or n_stages − 1 − stage for chunk 1);
# deepseek-ai/DualPipe dualpipe/dualpipev.py: phase 1 on the first rank is the last stage).
V_SHAPED = ("zb-v", "dualpipev")


def head_apart(pp: int, schedule: str) -> bool:
    """The LM head on another rank than the embedding (then it holds a copy of a tied word embedding, and
    the two are all-reduced): pp > 1, and neither a V (the head on rank 0) nor dualpipe (each end rank holds
    an embedding and a head; workload/plan.py)."""
    return pp > 1 and schedule not in (*V_SHAPED, "dualpipe")


def virtual_stage(chunk: int, stage: int, pp: int, v_shape: bool = False) -> int:
    """The virtual stage (chunk in model order) that is chunk ``chunk`` of pipeline rank ``stage``:
    c·pp + stage, or in a V 2·pp − 1 − stage for the second chunk."""
    if v_shape and chunk == 1:
        return 2 * pp - 1 - stage
    return chunk * pp + stage


def rank_of(vs: int, pp: int, v_shape: bool = False) -> int:
    """The pipeline rank that holds virtual stage ``vs`` (the inverse of :func:`virtual_stage`)."""
    if v_shape and vs >= pp:
        return 2 * pp - 1 - vs
    return vs % pp


def stage_layers(chunks: tuple[int, ...], pp: int, v_shape: bool = False) -> list[tuple[int, ...]]:
    """The layers of each chunk of each stage: ``[stage][c]`` = layers of the stage's chunk c
    (:func:`virtual_stage`: chunk c·pp + stage, or the V's)."""
    return [tuple(chunks[virtual_stage(c, s, pp, v_shape)] for c in range(len(chunks) // pp)) for s in range(pp)]


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


# --- Megatron's flexible pipeline layout (parallel.pipeline_model_parallel_layout) -----------------
# Megatron-LM megatron/core/transformer/pipeline_parallel_layer_layout.py @ d98e8a64dd,
# ``PipelineParallelLayerLayout``: ``parse_str_to_list`` reads the string, ``validate_layer_layout``
# checks it against the model, and the stage list in model order is chunk k = (vpp k // pp, pp k % pp).
LAYOUT_SYMBOLS = {"E": "embedding", "t": "decoder", "m": "mtp", "L": "loss"}
_GROUP = re.compile(r"\(([^)]+)\)\*(\d+)")  # (ab|cd)*2 → ab|cdab|cd
_REPEAT = re.compile(r"(.)\*(\d+)")  # t*3 → ttt
MAX_LAYOUT_STAGES = 10**5  # an unrolled string longer than any pipeline (a typo such as t*999999999)


def parse_layout(text: str) -> tuple[str, ...]:
    """The stages of a layout string, in model order, each a string of E, t, m, L.

    As Megatron's ``parse_str_to_list``: commas are dropped (cosmetic), then ``(...)*n`` and
    ``x*n`` are unrolled (in that order, once each, so parentheses do not nest), and the result is
    split at ``|``; an empty stage is allowed. ``"Et*3|(tt|)*29,m|L"`` is 32 stages."""
    s = text.replace(",", "")
    for pattern in (_GROUP, _REPEAT):
        def unroll(match: re.Match[str]) -> str:
            n = int(match.group(2))
            if n * len(match.group(1)) > MAX_LAYOUT_STAGES * 8:
                raise ScenarioError(f"pipeline_model_parallel_layout {text!r}: {match.group(0)} unrolls to more "
                                    f"than {MAX_LAYOUT_STAGES * 8} symbols", key=LAYOUT_KEY)
            return str(match.group(1)) * n
        s = pattern.sub(unroll, s)
    stages = tuple(s.split("|"))
    for stage in stages:
        for ch in stage:
            if ch not in LAYOUT_SYMBOLS:
                raise ScenarioError(f"pipeline_model_parallel_layout {text!r}: invalid symbol {ch!r} in stage "
                                    f"{stage!r} (expected E embedding, t transformer layer, m MTP layer, L loss, "
                                    f"| between stages, x*n and (...)*n repetitions)", key=LAYOUT_KEY)
    return stages


LAYOUT_KEY = "parallel.pipeline_model_parallel_layout"


@dataclass(frozen=True)
class ChunkPlan:
    """What each model chunk (virtual stage, model order) holds: its transformer layers, and where the
    MTP layers are (``mtp_chunk``, -1: none). The embedding is in chunk 0 and the loss in the last."""

    layers: tuple[int, ...]
    mtp: int = 0
    mtp_chunk: int = -1


def layout_problems(stages: tuple[str, ...], layers: int, mtp: int, pp: int, virtual: int) -> list[str]:
    """Megatron's rules for a layout (``validate_layer_layout`` and arguments.py's stage count), in
    its words; empty when it is valid."""
    V = pp * virtual
    if len(stages) != V:
        return [f"pipeline_model_parallel_layout has {len(stages)} stages, but pp*virtual_stages = {pp}*{virtual} "
                f"= {V}: they must be equal (Megatron: the stages are pp x virtual pipeline stages)"]
    flat = "".join(stages)
    out: list[str] = []
    if not flat or flat[0] != "E" or flat.count("E") != 1:
        out.append("the layout must start with the embedding E, given exactly once")
    if not flat or flat[-1] != "L" or flat.count("L") != 1:
        out.append("the layout must end with the loss L, given exactly once")
    if flat.count("t") != layers:
        out.append(f"the layout has {flat.count('t')} transformer layers t, but model.layers is {layers}")
    if flat.count("m") != mtp:
        out.append(f"the layout has {flat.count('m')} MTP layers m, but model.mtp_num_layers is {mtp}")
    if "m" in flat and "t" in flat[flat.index("m"):]:
        out.append("transformer layers t must all come before the MTP layers m")
    holders = [k for k, st in enumerate(stages) if "m" in st]
    if len(holders) > 1:
        out.append("all MTP layers m must be in one stage")
    elif holders and holders[0] // pp != virtual - 1:
        out.append(f"the MTP layers m must be in the last virtual stage of their pipeline rank (stage "
                   f"{holders[0]} is virtual stage {holders[0] // pp} of pipeline rank {holders[0] % pp})")
    return out


def layout_chunks(text: str, layers: int, mtp: int, pp: int, virtual: int) -> ChunkPlan:
    """The chunk plan of a layout string (ScenarioError naming the broken rule)."""
    stages = parse_layout(text)
    problems = layout_problems(stages, layers, mtp, pp, virtual)
    if problems:
        raise ScenarioError(f"{problems[0]} (layout {text!r})", key=LAYOUT_KEY)
    holders = [k for k, st in enumerate(stages) if "m" in st]
    return ChunkPlan(tuple(st.count("t") for st in stages), mtp, holders[0] if holders else -1)


def model_chunks(layers: int, pp: int, virtual: int = 1, first: int | None = None, last: int | None = None,
                 layout: str | None = None, mtp: int = 0) -> ChunkPlan:
    """The chunk plan of a model: from ``layout`` when given, else :func:`chunk_layers`, with the MTP
    layers (if any) in the last chunk, beside the loss, as Megatron places them without a layout
    (multi_token_prediction.py ``mtp_on_this_rank``: the last pipeline stage)."""
    if layout:
        return layout_chunks(layout, layers, mtp, pp, virtual)
    return ChunkPlan(chunk_layers(layers, pp, virtual, first, last), mtp, pp * virtual - 1 if mtp else -1)
