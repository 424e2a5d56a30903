"""Per-rank results: the time breakdown of every GPU, expanded from the folded representatives.

``summary.json`` holds one row per simulated rank (``ranks``: the rank, the number of
ranks it stands for, and its compute, exposed communication, bubble and other time,
which add up to the iteration time). ``ranks.csv`` expands those rows over the whole
world: one line per GPU, naming the simulated rank whose timeline it shares. A folded
copy is a translate of its representative on an identical part of the network
(DESIGN.md, "Speed"), so its breakdown is the representative's exactly.
"""
from __future__ import annotations

import io
from typing import Any

from emulator.outputs.metrics import Breakdown, Totals, per_rank
from emulator.program import Fold

COLUMNS = ("rank", "represented_by", "compute_s", "exposed_comm_s", "bubble_s", "other_s")


def rank_rows(totals: Totals, iterations: int, fold: Fold | None) -> list[dict[str, Any]]:
    """The summary's ``ranks`` rows: one per simulated rank, with the copies it stands for
    (``totals``: :func:`emulator.outputs.metrics.rank_totals`)."""
    copies = fold.copies if fold is not None else 1
    each = getattr(fold, "copies_of", None)  # several jobs, each folded its own way (folding.JobsFold)
    return [{"rank": rank, "copies": each(rank) if each else copies, **bd.as_dict()}
            for rank, bd in per_rank(totals, iterations).items()]


def ranks_csv(rows: list[dict[str, Any]], world: int, fold: Fold | None) -> str:
    """``ranks.csv``: every rank of the world that has a simulated representative, in rank order."""
    by_rank = {row["rank"]: Breakdown(row["compute"], row["exposed_comm"], row["bubble"], row["other"])
               for row in rows}
    out = io.StringIO()
    out.write(",".join(COLUMNS) + "\n")
    for rank in range(world):
        rep = fold.representative(rank) if fold is not None else rank
        bd = by_rank.get(rep)
        if bd is None:
            continue  # a rank with no spans (an idle member of a trace)
        out.write(f"{rank},{rep},{bd.compute!r},{bd.exposed_comm!r},{bd.bubble!r},{bd.other!r}\n")
    return out.getvalue()
