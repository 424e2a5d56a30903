"""Fold.orbit: every distinct image of a group under the fold, without the rows that repeat it."""
import random

import pytest

from emulator.program import Fold


def distinct(rows: list[list[int]], key: int, ordered: bool) -> list:
    """First occurrences of the images of the first ``key`` ranks, in row order."""
    seen, out = set(), []
    for row in rows:
        ident = tuple(row[:key]) if ordered else frozenset(row[:key])
        if ident not in seen:
            seen.add(ident)
            out.append(ident)
    return out


def test_a_group_spanning_the_fold_has_one_row():
    # pure data parallelism on 8 ranks, all folded: every translation maps the group onto itself
    fold = Fold((8,), (True,))
    assert fold.orbit(list(range(8)), 8, ordered=False) == [list(range(8))]
    assert len(fold.translate_all(list(range(8)))) == 8  # what the engine enumerated before


def test_rows_are_kept_where_an_axis_moves_the_group():
    # grid 2 × 4, both folded; the group {0, 1, 2, 3} is row 0: the fast axis maps it onto itself
    # (so it is left out), the slow one moves it to row 1 → 2 rows instead of 8
    fold = Fold((2, 4), (True, True))
    rows = fold.orbit([0, 1, 2, 3], 4, ordered=False)
    assert [sorted(r) for r in rows] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # a send 0 → 1 is ordered: no translation but the identity fixes it, all 8 rows stay
    assert len(fold.orbit([0, 1], 2, ordered=True)) == 8


def test_a_root_rides_along_but_does_not_count():
    # broadcast on the whole group with root 3 (the extra last member): the group is fixed by
    # every translation, so one row, root unmoved, as the engine's dedup by member set had it
    fold = Fold((4,), (True,))
    assert fold.orbit([0, 1, 2, 3, 3], 4, ordered=False) == [[0, 1, 2, 3, 3]]


@pytest.mark.parametrize("seed", range(40))
def test_same_distinct_images_in_the_same_order_as_every_translation(seed):
    rng = random.Random(seed)
    shape = tuple(rng.choice([1, 2, 3, 4]) for _ in range(rng.randint(1, 4)))
    folded = tuple(rng.random() < 0.7 for _ in shape)
    fold = Fold(shape, folded)
    world = 1
    for s in shape:
        world *= s
    group = rng.sample(range(world), rng.randint(1, world))
    ordered = rng.random() < 0.3
    full = fold.translate_all(group)
    fast = fold.orbit(group, len(group), ordered)
    assert distinct(fast, len(group), ordered) == distinct(full, len(group), ordered)
    assert len(fast) <= len(full)
