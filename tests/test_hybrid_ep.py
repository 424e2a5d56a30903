"""HybridEP's cost functions (emulator/network/hybrid_ep.py): expected rows per link class, hand-computed
and counted by brute force over every routing, and the time of a dispatch and a combine."""
from itertools import combinations

import pytest

from emulator.network.collectives import CollectiveModel
from emulator.network.dispatch import dispatch
from emulator.network.fabric import alone
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
from emulator.network.raw_plan import StepCosts
from emulator.network.routing import Router
from emulator.network.topology import build_topology
from emulator.program import dispatch_op
from emulator.scenario import catalog, load_scenario_text
from emulator.scenario.spec import ModelSpec, ParallelSpec
from emulator.workload import layer as Ly


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


# -- the flex dispatcher's hybridep plan (emulator/network/dispatch.py) -----------------------------------

class _TwoDomains:
    """A PlanMaker of 8 ranks in two NVLink domains of 4 (ranks 0-3, 4-7), every step 1 us."""

    steps = StepCosts()

    @staticmethod
    def node_of(r: int) -> int:
        return r // 4

    def alpha(self, a: int, b: int) -> float:
        return 1e-6

    def by_node(self, group: tuple[int, ...]) -> list[list[int]]:
        return [[r for r in group if r // 4 == k] for k in sorted({r // 4 for r in group})]


def _op(direction: str, **extra: float) -> str:
    return dispatch_op("hybridep", direction, experts=8, top_k=2, groups=1, group_topk=1, load=1.0, **extra)


def test_hybridep_plan_legs_over_two_domains():
    # EP 8 over two 4-GPU domains, 8 experts (m = 1: rank r holds expert r), top-2, 128 tokens of 2048 B
    # (hidden 1024, bf16) per rank, with the probabilities. P(use a GPU) = 1 - C(7,2)/C(8,2) = 1 - 21/28 = 1/4;
    # P(use a domain) = 1 - C(4,2)/C(8,2) = 1 - 6/28 = 11/14. A row grows by m·4 = 4 B over NVLink
    # (x 2052/2048) and by m·L·4 = 16 B over RDMA (x 2064/2048). One 64-token chunk of 128 tokens: f = 1/2.
    plan = dispatch(_TwoDomains(), _op("in", tokens=128, row=2048, probs=1), tuple(range(8)), -1)
    first, both, last = plan  # RDMA's first chunk; the rest of both stages; NVLink's last chunk
    nvl, rdma = 0.25 * 2052 / 2048, 11 / 14 * 2064 / 2048
    hops, _vol, alpha, _m = first[0]  # rank 0: to its peer 4 in the other domain, half the RDMA bytes
    assert hops == [(0, 4, pytest.approx(rdma / 2))] and alpha == pytest.approx(2e-6)  # 0 -> 4 -> 5: two steps
    assert sorted(last[0][0]) == [(0, 1, pytest.approx(nvl / 2)), (0, 2, pytest.approx(nvl / 2)),
                                  (0, 3, pytest.approx(nvl / 2)), (4, 5, pytest.approx(nvl / 2)),
                                  (4, 6, pytest.approx(nvl / 2)), (4, 7, pytest.approx(nvl / 2))]
    assert [h[:2] for h in last[5][0]] == [(5, 4), (5, 6), (5, 7), (1, 0), (1, 2), (1, 3)]  # rank 5: its peer is 1
    assert len(both[0][0]) == 7 and both[0][2] == 0.0  # 1 RDMA + 6 NVLink legs, the latency paid once
    # per rank and byte of S = 128 · 2048: NVLink 6 · 1/4 · 2052/2048, RDMA 11/14 · 2064/2048, hybrid_ep.traffic's
    t = traffic(128, 1024, EpGroup(ep=8, ranks_per_domain=4, experts=8, top_k=2))
    per_byte = {"nvl": 0.0, "rdma": 0.0}
    for phase in plan:
        for a, b, x in phase[0][0]:
            per_byte["rdma" if a // 4 != b // 4 else "nvl"] += x
    assert per_byte["nvl"] == pytest.approx(t.nvlink / (128 * 2048)) == pytest.approx(1.5 * 2052 / 2048)
    assert per_byte["rdma"] == pytest.approx(t.rdma / (128 * 2048)) == pytest.approx(11 / 14 * 2064 / 2048)


def test_hybridep_combine_is_the_reverse_without_probabilities():
    # combine: NVLink to the peer first (pre-reduced there), RDMA home last; rows of 2048 B, no probabilities
    first, _both, last = dispatch(_TwoDomains(), _op("out", tokens=128, row=2048), tuple(range(8)), -1)
    assert sorted(first[0][0]) == [(1, 0, pytest.approx(0.125)), (2, 0, pytest.approx(0.125)),
                                   (3, 0, pytest.approx(0.125)), (5, 4, pytest.approx(0.125)),
                                   (6, 4, pytest.approx(0.125)), (7, 4, pytest.approx(0.125))]  # 1/4 · 1/2
    assert last[0][0] == [(4, 0, pytest.approx(11 / 14 / 2))]


def test_hybridep_on_one_nvl72_rack_sends_no_rdma_byte():
    # EP 72 on one GB200 NVL72 rack (18 trays of 4 GPUs, one NVLink domain): one phase, every leg between two
    # GPUs of the rack, so no link of the plan is a NIC's; DeepEP groups by the same domain (network/domain.py)
    sc = load_scenario_text("name: r\ncluster: {nodes: 18, node: gb200-nvl72}\n", "r.yaml")
    topo = build_topology(sc.cluster)  # the rack as one node of 72 GPUs (network/domain.py)
    cm = CollectiveModel(Router(topo), topo.node_of, StepCosts())
    op = dispatch_op("hybridep", "in", experts=144, top_k=8, groups=1, group_topk=1, load=1.0, tokens=4096,
                     row=14336, probs=1)
    raw = dispatch(cm, op, tuple(range(72)), -1)
    assert len(raw) == 1 and all(a // 72 == b // 72 for flow in raw[0] for a, b, _x in flow[0])
    plan = cm.collective(op, tuple(range(72)))
    classes = {topo.cls[link] for phase in plan for f in phase for link in f.links}
    assert classes == {"nvlink"}
    # the rack's first 8 GPUs (two trays): the same, NVLink only
    assert {topo.cls[link] for phase in cm.collective(op, tuple(range(8))) for f in phase for link in f.links} \
        == {"nvlink"}


def test_hybridep_dispatch_time_on_two_dgx_h100():
    # EP 16 on 2 DGX H100 (one switch): 16 experts, one per GPU, top-2, 4096 tokens of hidden 7168 in bf16 per
    # rank: S = 4096 · 14336 = 58,720,256 B. P(GPU) = 1 - C(15,2)/C(16,2) = 1/8; P(node) = 1 - C(8,2)/C(16,2) =
    # 92/120. Rows carry 1 probability over NVLink (x (14336+4)/14336), 8 over RDMA (x (14336+32)/14336).
    # A GPU's NVLink port: 7 own legs + 7 forwarded for its peer, 14 · 1/8 = 1.75 per byte of S, at 370 GB/s;
    # its NIC: 92/120 per byte at 47 GB/s (the bottleneck: 0.7684/47e9 > 1.7505/370e9). With f = 64/4096 the
    # call is α + t_rdma + f · t_nvl (the slower stage plus one chunk of the faster), α = 1 us (RDMA path) +
    # 0.3 us (NVLink) on the forwarded leg, as DeepEP's test above.
    model = ModelSpec(layers=2, hidden=7168, heads=56, seq_len=4096, vocab=1000, experts=16, top_k=2, swiglu=True,
                      expert_ffn_hidden=2048)
    par = ParallelSpec(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep")
    L = Ly.layer_shape(model, 1, ep=16, parallel=par, sm_count=132)
    d = next(st for st in Ly.forward_steps(L) if isinstance(st, Ly.Comm) and st.name == "moe.dispatch")
    assert d.bytes == 58720256 and d.collective.startswith("hybridep:in:")
    sc = load_scenario_text("name: f\ncluster: {nodes: 2, node: dgx-h100}\n", "f.yaml")
    topo = build_topology(sc.cluster)
    cm = CollectiveModel(Router(topo), topo.node_of, StepCosts())
    plan = cm.collective(d.collective, tuple(range(16)))
    t_rdma = 58720256 * 92 / 120 * 14368 / 14336 / 47e9
    t_nvl = 58720256 * 1.75 * 14340 / 14336 / 370e9
    expected = 1.3e-6 + t_rdma + t_nvl / 64  # 1.3 us + 959.7 us + 4.3 us
    assert alone(plan, d.bytes, topo.capacity).duration == pytest.approx(expected, rel=1e-9)
    assert expected == pytest.approx(965.3e-6, rel=1e-3)
    # hybrid_ep.py's closed form on the same links gives the same call
    links = Links(nvlink=370e9, rdma=47e9, alpha_nvlink=0.3e-6, alpha_rdma=1e-6, launch=0.0)
    assert dispatch_time(4096, 7168, EpGroup(16, 8, 16, 2), links) == pytest.approx(expected, rel=1e-9)
