"""Allocation of jobs to nodes (emulator/scenario/allocation.py): each policy on a small cluster."""
import pytest

from emulator.scenario.allocation import AllocationError, Request, allocate


def test_contiguous_takes_the_first_free_runs():
    # 8 nodes: a takes 0-2, b the next 3 free in a row: 3-5
    got = allocate([Request("a", 3), Request("b", 3)], total=8, leaf_size=4)
    assert got == [(0, 1, 2), (3, 4, 5)]


def test_explicit_lists_are_reserved_first():
    # b lists node 1, so contiguous a (2 nodes) cannot start at 0: 0 free, 1 taken → first run is 2, 3
    got = allocate([Request("a", 2), Request("b", 1, "list", (1,))], total=6, leaf_size=2)
    assert got == [(2, 3), (1,)]


def test_spread_round_robins_over_leaves():
    # 8 nodes in leaves of 2: {0,1} {2,3} {4,5} {6,7}; a (4 nodes) takes the lowest of each leaf: 0, 2, 4, 6;
    # b (3 nodes) then the lowest free of each leaf in turn: 1, 3, 5
    got = allocate([Request("a", 4, "spread"), Request("b", 3, "spread")], total=8, leaf_size=2)
    assert got == [(0, 2, 4, 6), (1, 3, 5)]
    # more nodes than leaves: a second round; 4 nodes in leaves of 2 → 0, 2, then 1, 3
    assert allocate([Request("a", 4, "spread")], total=4, leaf_size=2) == [(0, 2, 1, 3)]


def test_random_is_seeded_and_sorted():
    import random

    one = allocate([Request("a", 3, "random", seed=7)], total=10, leaf_size=2)
    two = allocate([Request("a", 3, "random", seed=7)], total=10, leaf_size=2)
    assert one == two == [tuple(sorted(random.Random(7).sample(range(10), 3)))]
    other = allocate([Request("a", 3, "random", seed=8)], total=10, leaf_size=2)
    assert other == [tuple(sorted(random.Random(8).sample(range(10), 3)))]


@pytest.mark.parametrize("requests, index, key, text", [
    ([Request("a", 3), Request("b", 2)], 1, "nodes", "needs 2 nodes but only 1 of the cluster's 4 are free"),
    ([Request("a", 1, "list", (1,)), Request("b", 2, "list", (2, 1))], 1, "placement",
     "node 1 is already taken by job 'a'"),
    ([Request("a", 2, "list", (0, 0))], 0, "placement", "node 0 is listed twice"),
    ([Request("a", 1, "list", (4,))], 0, "placement", "there is no node 4: the cluster has nodes 0 to 3"),
    # 1 taken, 0, 2, 3 free: no 3 consecutive free nodes
    ([Request("a", 1, "list", (1,)), Request("b", 3)], 1, "placement", "needs 3 consecutive free nodes"),
])
def test_requests_that_cannot_be_met(requests, index, key, text):
    with pytest.raises(AllocationError) as info:
        allocate(requests, total=4, leaf_size=2)
    assert (info.value.index, info.value.key) == (index, key)
    assert text in info.value.message
