"""NCCL's tuning model (network/tuning.py) and its double binary tree (network/tree.py), by hand."""
import pytest

from emulator.network import tree, tuning
from emulator.network.tuning import AMPERE, HOPPER, LL, LL128, RING, SIMPLE, TREE, Comm, Hardware

# a DGX A100 as the tuning model sees it: HDR NIC 25 GB/s × 0.96 = 24 GB/s, NVLink 300 × 230/300 = 230 GB/s
A100 = Hardware(AMPERE, True, 8, 24e9, 230e9)


def test_btree_and_its_mirror_on_eight_nodes():
    # trees.cc ncclGetBtree, n = 8: rank 1: lowest set bit 1, up = (1^1)|2 = 2; rank 2: bit 2, up = 0|4 = 4;
    # rank 4: bit 4, up = 0|8 = 8 ≥ 8 → 4^4 = 0; rank 6: bit 2, up = 4|4 = 4; rank 5, 7: bit 1 → 6.
    assert tree.parents(8, 0) == [-1, 2, 4, 2, 0, 6, 4, 6]
    # n even: the mirror, rank r ↔ 7 − r
    assert tree.parents(8, 1) == [1, 3, 1, 7, 5, 3, 5, -1]
    assert tree.btree(8, 4) == (0, 2, 6)
    # every interior node of one tree is a leaf of the other
    kids0 = {p for p in tree.parents(8, 0) if p >= 0}
    kids1 = {p for p in tree.parents(8, 1) if p >= 0}
    assert not kids0 & kids1
    assert tree.depth(tree.parents(8, 0)) == 3 and tree.depth(tree.parents(128, 1)) == 7  # log2 n


def test_odd_node_count_shifts_the_second_tree():
    # n = 3: btree parents [-1, 2, 0]; the second tree is it shifted by one: rank r plays r−1, so
    # rank 1 (plays 0) is the root, rank 2 (plays 1) has parent 2+1 → 0, rank 0 (plays 2) has parent 0+1 → 1
    assert tree.parents(3, 0) == [-1, 2, 0]
    assert tree.parents(3, 1) == [1, -1, 0]


def test_channels_of_a_communicator():
    # across nodes: one channel per local position of the smallest node, each at a NIC's 24 GB/s
    assert tuning.comm_of(A100, [8] * 128) == Comm(1024, 128, 8, 24.0)
    assert tuning.comm_of(A100, [8, 4]) == Comm(12, 2, 4, 24.0)
    # one node: a channel per GPU sharing the 230 GB/s port: 230/8 = 28.75 GB/s each
    assert tuning.comm_of(A100, [8]) == Comm(8, 1, 8, 28.75)


def test_eight_bytes_on_128_nodes_is_a_tree():
    comm = tuning.comm_of(A100, [8] * 128)
    # Tree/LL latency, tuning.cc: base 6.8 + 2·((ppn−1)·hwLat[NVLINK][Tree][LL] + log2(128)·hwLat[NET][Tree][LL])
    #   = 6.8 + 2·(7·0.6 + 7·5.0) = 85.2 us
    assert tuning.latency("all_reduce", TREE, LL, comm, A100) == pytest.approx(85.2)
    # Ring/LL: base 6.6 + (nsteps − nInter)·max(0.6, netOverhead 1.0) + nInter·hwLat[NET][Ring][LL]
    #   nsteps = 2·1023 = 2046, nInter = 2·127 = 254: 6.6 + 1792·1.0 + 254·2.7 = 2484.4 us
    assert tuning.latency("all_reduce", RING, LL, comm, A100) == pytest.approx(2484.4)
    # Tree/LL bandwidth: 8 ch × 24 = 192; ×.92 = 176.64, capped at 8 × perChMaxTreeBw[Ampere][>2 nodes] 17.8
    # = 142.4; LL: min(142.4/3.8, llMaxBw[0][2] 20.4) = 20.4; busbw → algbw × .5 = 10.2 GB/s
    assert tuning.bandwidth("all_reduce", TREE, LL, comm, A100) == pytest.approx(10.2)
    pick = tuning.choose("all_reduce", 8, comm, A100, ("ring", "tree"))
    assert (pick.algorithm, pick.protocol) == ("tree", "LL")
    assert pick.time_s == pytest.approx(85.2e-6 + 8 / 10.2e9, rel=1e-12)  # no tree correction below 64 B


def test_a_large_all_reduce_on_two_nodes_is_a_ring():
    comm = tuning.comm_of(A100, [8, 8])
    S = 2**30
    # Ring/Simple: busbw 8 × 24 = 192 GB/s, algbw 192 × 16/30 = 102.4 GB/s;
    # latency 8.4 + (30 − 2)·max(3.4, 3 × 1.0) + 2·14 = 131.6 us, × 1.4 (ring plateau: S/(8·16) ≥ 64)
    ring = tuning.algo_time("all_reduce", RING, SIMPLE, S, comm, A100)
    assert ring == pytest.approx(131.6e-6 * 1.4 + S / 102.4e9, rel=1e-12)
    # Tree/Simple: min(192 × .92, 8 × 23.6) = 176.64, × .5 = 88.32 GB/s; 8.4 + 2·(7·4.0 + 1·14) = 92.4 us;
    # 1 GiB is past the correction table (log2(S/64) = 24)
    tree_t = tuning.algo_time("all_reduce", TREE, SIMPLE, S, comm, A100)
    assert tree_t == pytest.approx(92.4e-6 + S / 88.32e9, rel=1e-12)
    # Ring/LL128: min(192 × .92, 8 × 20) = 160 GB/s busbw → 85.33 algbw: slower than Simple at 1 GiB
    assert tuning.bandwidth("all_reduce", RING, LL128, comm, A100) == pytest.approx(160 * 16 / 30)
    pick = tuning.choose("all_reduce", S, comm, A100, ("ring", "tree"))
    assert (pick.algorithm, pick.protocol, pick.time_s) == ("ring", "Simple", ring)


def test_collnet_direct_bandwidth_and_latency():
    hw = Hardware(HOPPER, True, 8, 47e9, 370e9, sharp=True)
    comm = tuning.comm_of(hw, [8] * 16)  # 8 channels × 47 GB/s
    # CollNet Direct, tuning.cc: busbw 8 × 47 = 376; GPU/NIC factor 8/8 = 1 → 1 − 0 = 1; Hopper × .85;
    # algbw × .5: 376 × .85 × .5 = 159.8 GB/s
    assert tuning.bandwidth("all_reduce", tuning.COLLNET_DIRECT, SIMPLE, comm, hw) == pytest.approx(159.8)
    # latency 0 + 2·(min(1, 7)·hwLat[NVLINK][CollNetDirect][Simple] 3.7 + 7 × 0.4) + hwLat[NET] 31 = 44 us
    assert tuning.latency("all_reduce", tuning.COLLNET_DIRECT, SIMPLE, comm, hw) == pytest.approx(44.0)
    assert tuning.bandwidth("all_reduce", tuning.COLLNET_DIRECT, LL, comm, hw) == 0  # Simple only


def test_other_operations_have_only_the_ring():
    comm = tuning.comm_of(A100, [8] * 4)
    for op in ("all_gather", "reduce_scatter", "broadcast"):
        assert tuning.bandwidth(op, TREE, SIMPLE, comm, A100) == 0
        assert tuning.choose(op, 2**20, comm, A100, ("ring", "tree")).algorithm == "ring"
    with pytest.raises(ValueError, match="no NCCL algorithm"):
        tuning.choose("all_gather", 8, comm, A100, ("tree",))


def test_pcie_nodes_have_no_ll128_and_gpu_names_map_to_nccl_rows():
    pcie = Hardware(AMPERE, False, 1, 24e9, 24e9)
    assert tuning.bandwidth("all_reduce", RING, LL128, tuning.comm_of(pcie, [2, 2]), pcie) == 0
    assert [tuning.arch_of(n) for n in ("V100-SXM2-32GB", "A100-SXM4-80GB", "H200-SXM", "B200", "L40S", "X")] \
        == [tuning.VOLTA, AMPERE, HOPPER, tuning.BLACKWELL, AMPERE, AMPERE]
