"""Blackwell racks: the catalog's GB200/GB300 NVL72 and B300 entries, and NVLink domains of several nodes."""
import pytest

from emulator.errors import EmulatorError
from emulator.network.domain import domains, network_cluster
from emulator.network.routing import Router
from emulator.network.topology import build_topology
from emulator.scenario import catalog, load_scenario_text
from emulator.tools.collective_bench import collective_table
from emulator.workload.placement import Layout


def rack(nodes=18, extra="", node="gb200-nvl72"):
    return load_scenario_text(f"name: t\ncluster: {{nodes: {nodes}, node: {node}}}\n{extra}", "t.yaml")


def test_catalog_names_and_figures():
    gb200, gb300, b300 = catalog.gpu("B200-GB200"), catalog.gpu("B300-GB300"), catalog.gpu("B300")
    # GB200 NVL72 datasheet per superchip (2 GPUs), with sparsity: bf16 10 PF, fp8 20 PF, fp4 40 PF -> dense per GPU
    assert (gb200.peak_flops, gb200.peak_flops_fp8, gb200.peak_flops_fp4) == (2.5e15, 5e15, 10e15)
    assert gb200.memory_bytes == 186e9 and gb200.hbm_bandwidth == 8e12 and gb200.sm_count == 148
    # HGX B300: fp4 108 PF dense for 8 GPUs = 13.5 PF each; 2.3 TB HBM for 8 = 288 GB; Blackwell Ultra 160 SMs
    assert b300.peak_flops_fp4 == 13.5e15 and b300.memory_bytes == 288e9 and b300.sm_count == 160
    assert gb300.peak_flops_fp4 == 15e15 and gb300.peak_flops == 2.5e15
    # mamf-finder (blackwell/gemm.csv S1): GB200 1822 of 2500 TFLOP/s
    assert gb200.matmul_fraction == pytest.approx(1822 / 2500, abs=1e-3)
    n200, n300, dgx = catalog.node("gb200-nvl72"), catalog.node("gb300-nvl72"), catalog.node("dgx-b300")
    # a node is one compute tray: 4 GPUs, 4 NICs; CX-7 400 Gb/s = 50 GB/s, CX-8 800 Gb/s = 100 GB/s
    assert (n200.gpus_per_node, n200.nics, n200.nic_bandwidth, n200.nvlink_domain) == (4, 4, 50e9, 72)
    assert (n300.gpus_per_node, n300.nics, n300.nic_bandwidth, n300.nvlink_domain) == (4, 4, 100e9, 72)
    assert (dgx.gpus_per_node, dgx.domain, dgx.nics, dgx.nic_bandwidth) == (8, 8, 8, 100e9)
    assert n200.intra_bandwidth == 900e9 and n200.intra_efficiency == pytest.approx(680 / 900)


def test_the_network_sees_one_node_per_domain():
    sc = rack(nodes=20)  # 20 trays = 80 GPUs: one full domain of 72 and one of 8
    net = network_cluster(sc.cluster)
    assert sc.gpus == 80 and domains(sc.cluster) == 2 and net.nodes == 2
    assert net.node.gpus_per_node == 72 and net.node.nics == 72  # 18 trays x 4 NICs
    t = build_topology(sc.cluster)
    assert len(t.gpus) == 80 and t.node_of(71) == 0 and t.node_of(72) == 1
    assert t.nic_of(5) == "nic0.5" and t.nic_of(77) == "nic1.5"  # tray 1's second GPU, tray 19's second GPU


def test_ranks_of_one_domain_talk_over_nvlink_only_across_trays():
    t = build_topology(rack(nodes=20).cluster)
    router = Router(t)
    links, _w, lat = router.route(0, 71)  # tray 0 -> tray 17: one NVLink switch hop
    assert {t.cls[l] for l in links} == {"nvlink"} and lat == pytest.approx(0.3e-6)  # 2 x 0.15 us
    links, _w, _lat = router.route(0, 72)  # domain 0 -> domain 1: through the NICs
    assert "nic" in {t.cls[l] for l in links}


def test_tp_times_ep_beyond_eight_stays_inside_the_domain():
    # 72 GPUs, TP 4 x EP 16 = 64 GPUs per EP group, well over one tray (4) and a DGX (8)
    t = build_topology(rack().cluster)
    layout = Layout.from_parallel(rack(extra="parallel: {tp: 4, dp: 18, ep: 9}\n").parallel, 72)
    router = Router(t)
    for group in (layout.ep_group(0), layout.tp_group(0), layout.dp_group(3)):
        assert len(group) > 1
        for a in group:
            for b in group:
                if a != b:
                    assert {t.cls[l] for l in router.route(a, b)[0]} == {"nvlink"}


def test_nvlink_domain_override_and_its_errors():
    sc = rack(extra="", node="{preset: gb200-nvl72, nvlink_domain: 64}")
    assert sc.cluster.node.domain == 64 and domains(sc.cluster) == 2  # 72 GPUs: 64 + 8
    with pytest.raises(EmulatorError, match="nvlink_domain.*multiple of gpus_per_node"):
        rack(node="{preset: gb200-nvl72, nvlink_domain: 70}")


def test_one_rack_all_reduce_by_nvls_and_ring():
    sc = rack(extra="collectives: {algorithm: nvls}\n")
    s = 4 * 2**30
    row = collective_table(sc, "all_reduce", [s])[0]
    # L + 2 alpha + 2(n-1)/n S / nvls_busbw: 6.05 us + 2 x (0.3 + 1.39) us + 2*71/72 * 4 GiB / 839 GB/s
    expect = 6.05e-6 + 2 * 1.69e-6 + 2 * 71 / 72 * s / 839e9
    assert row["algorithm"] == "nvls" and row["time_s"] == pytest.approx(expect, rel=1e-9)
    ring = collective_table(rack(), "all_reduce", [s])[0]
    # 6.05 us + 2*71 steps of 1.69 us + 2*71/72 * S / (900 GB/s x 680/900)
    assert ring["time_s"] == pytest.approx(6.05e-6 + 142 * 1.69e-6 + 2 * 71 / 72 * s / 680e9, rel=1e-9)


def test_all_to_all_over_a_whole_rack_uses_nvlink_only():
    sc = rack()
    row = collective_table(sc, "all_to_all", [2**30])[0]
    # every GPU sends 71/72 of 1 GiB over its own 680 GB/s port, all at once: 6.05 + 1.69 us, 70 more peers at
    # (28.20 − 11.75)/24 = 0.685 us (NCCL's cost per peer, collectives.ALLTOALL_PEER_S), + 71/72 GiB / 680 GB/s
    peer = (28.20e-6 - 11.75e-6) / 24
    assert row["time_s"] == pytest.approx(6.05e-6 + 1.69e-6 + 70 * peer + 71 / 72 * 2**30 / 680e9, rel=1e-9)
