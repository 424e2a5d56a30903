"""HybridEP's cost functions (emulator/network/hybrid_ep.py): expected rows per link class, hand-computed
and counted by brute force over every routing, and the time of a dispatch and a combine."""
from itertools import combinations

import pytest

from emulator.network.hybrid_ep import (
    EpGroup,
    Links,
    dispatch_time,
    hit_probability,
    links_of,
    ranks_per_domain,
    row_bytes,
    time_of,
    traffic,
)
from emulator.scenario import catalog


def test_hit_probability():
    # 4 experts, top-2, one held: 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert hit_probability(4, 2, 1) == pytest.approx(0.5)
    assert hit_probability(8, 2, 7) == 1.0 and hit_probability(8, 2, 0) == 0.0


def test_row_bytes():
    assert row_bytes(7168) == 14336  # bf16
    assert row_bytes(7168, "fp8") == 7168 + 4 * 7168 / 128  # 7392: one fp32 scale per 128 elements


def test_one_domain_moves_nvlink_only():
    # ep 4 in one domain, 8 experts (m = 2), top-2: p(rank) = 1 - C(6,2)/C(8,2) = 13/28
    g = EpGroup(ep=4, ranks_per_domain=4, experts=8, top_k=2)
    t = traffic(100, 1000, g)  # bf16 rows of 2000 B, plus m = 2 fp32 probabilities = 2008 B
    rows = 100 * 3 * 13 / 28  # T (L-1) p(rank)
    assert t.rdma == 0 and t.nvlink == pytest.approx(rows * 2008)
    assert t.received == pytest.approx(100 * 4 * 13 / 28 * 2000)  # T ep p(rank) rows of 2000 B


def test_two_domains_send_each_token_once_per_domain():
    # ep 8 = 2 domains of 4, 8 experts (m = 1), top-2: p(rank) = 1 - C(7,2)/C(8,2) = 1/4,
    # p(domain) = 1 - C(4,2)/C(8,2) = 11/14
    g = EpGroup(ep=8, ranks_per_domain=4, experts=8, top_k=2)
    t = traffic(128, 1024, g, "fp8")  # rows of 1024 + 32 B
    assert t.nvlink == pytest.approx(128 * 2 * 3 / 4 * (1056 + 4))  # T N (L-1) p(rank), + m probabilities
    assert t.rdma == pytest.approx(128 * 1 * 11 / 14 * (1056 + 4 * 4))  # T (N-1) p(domain), + m L probabilities
    links = Links(nvlink=1e9, rdma=1e8, alpha_nvlink=1e-6, alpha_rdma=2e-6, launch=5e-6)
    t_nvl, t_rdma = t.nvlink / 1e9, t.rdma / 1e8  # 203.52 us, 1078.13 us
    # launch + both alphas + the slower stage + one chunk (64 of 128 tokens) of the other
    expect = 5e-6 + 1e-6 + 2e-6 + t_rdma + 64 / 128 * t_nvl
    assert dispatch_time(128, 1024, g, links, "fp8") == pytest.approx(expect)
    assert expect == pytest.approx(1187.886e-6, rel=1e-6)


def test_counts_match_a_brute_force_over_every_routing():
    # every top-2 choice of 8 experts equally likely; ranks r hold experts {r} (m = 1); 2 domains of 4
    ep, L = 8, 4
    g = EpGroup(ep=ep, ranks_per_domain=L, experts=8, top_k=2)
    nvl = rdma = 0
    pairs = list(combinations(range(8), 2))
    for src in range(ep):
        for route in pairs:
            hit = set(route)  # expert e lives on rank e
            dom = src // L
            nvl += sum(1 for r in hit if r // L == dom and r != src)  # own domain, self excluded
            for d in {r // L for r in hit} - {dom}:
                rdma += 1
                peer = d * L + src % L  # the same local rank in domain d forwards over NVLink
                nvl += sum(1 for r in hit if r // L == d and r != peer)
    t = traffic(1, 1, g, probs=False)  # 1 token of 2 B per rank: rows = bytes / 2
    assert t.nvlink / 2 == pytest.approx(nvl / ep / len(pairs))
    assert t.rdma / 2 == pytest.approx(rdma / ep / len(pairs))


def test_links_of_a_gb200_tray():
    links = links_of(catalog.node("gb200-nvl72"))
    assert links.nvlink == pytest.approx(680e9)  # 900 GB/s x 680/900
    assert links.rdma == pytest.approx(47e9)  # 4 NICs x 50 GB/s x 47/50 over 4 GPUs
    assert links.alpha_nvlink == pytest.approx(0.3e-6 + 1.39e-6) and links.alpha_rdma == pytest.approx(1e-6 + 3e-6)


def test_rack_of_36_ranks_against_deepep_measurement():
    # DeepEP hybrid-ep docs/README_Hybrid-EP.md, GB200, 4096 tokens, hidden 7168, top-8, 8 local experts,
    # BF16 dispatch, kernel only: 764.03 GB/s at 8 ranks and 632.31 at 36 (32 SMs), "algorithm bandwidth"
    # = rows received (its own included) / time (tests/test_hybrid_ep.py). The model, with gb200-nvl72's
    # calibrated 680 GB/s port: 761 and 689 GB/s.
    links = links_of(catalog.node("gb200-nvl72"))
    for ranks, measured, tol in ((8, 764.03, 0.02), (36, 632.31, 0.10)):
        g = EpGroup(ranks, ranks, 8 * ranks, 8)
        bw = traffic(4096, 7168, g).received / dispatch_time(4096, 7168, g, links) / 1e9
        assert bw == pytest.approx(measured, rel=tol)


def test_time_of_nothing_is_zero_and_ranks_per_domain():
    assert time_of(traffic(64, 8, EpGroup(1, 1, 4, 2)), Links(1, 1, 1, 1, 1), 64) == 0.0
    assert ranks_per_domain(range(0, 144, 2), 72) == 36  # every other rank of two racks: 36 per rack
    with pytest.raises(ValueError, match="must divide ep"):
        EpGroup(ep=8, ranks_per_domain=3, experts=8, top_k=2)
