"""The hardware catalog: figures from hardware.csv / nccl.csv, names, and unknown names."""
from importlib import resources

import pytest
import yaml

from emulator.errors import CatalogError, EmulatorError
from emulator.scenario import catalog

GIB = 2**30


@pytest.mark.parametrize("name, flops, hbm, memory", [
    ("A100-SXM4-80GB", 312e12, 2039e9, 80 * GIB),
    ("A100-SXM4-40GB", 312e12, 1555e9, 40 * GIB),
    ("H100-SXM5-80GB", 989.4e12, 3350e9, 80 * GIB),
    ("H200-SXM", 989.4e12, 4800e9, 141e9),
    ("H800-SXM", 989.4e12, 3350e9, 80 * GIB),
    ("B200", 2250e12, 8000e9, 192e9),
    ("L40S", 362e12, 864e9, 48e9),
    ("V100-SXM2-32GB", 125e12, 900e9, 32 * GIB),
])
def test_gpus(name, flops, hbm, memory):
    g = catalog.gpu(name)
    assert g.name == name
    assert g.peak_flops == pytest.approx(flops, rel=1e-12)
    assert g.hbm_bandwidth == pytest.approx(hbm, rel=1e-12)
    assert g.memory_bytes == pytest.approx(memory, rel=1e-12)
    assert g.launch_overhead == pytest.approx(4e-6, rel=1e-12)


def test_dgx_a100_calibration():
    n = catalog.node("dgx-a100")
    assert (n.gpus_per_node, n.intra, n.nics) == (8, "nvswitch", 8)
    assert n.gpu == catalog.gpu("A100-SXM4-80GB")
    # nccl.csv: busbw 230 GB/s on a 300 GB/s line rate
    assert n.intra_bandwidth * n.intra_efficiency == pytest.approx(230e9, rel=1e-12)
    # HDR 200 Gb/s = 25 GB/s line rate; nccl.csv: 24 GB/s achieved
    assert n.nic_bandwidth == pytest.approx(25e9, rel=1e-12)
    assert n.nic_bandwidth * n.nic_efficiency == pytest.approx(24e9, rel=1e-12)
    # one ring step = hop (2 links x 0.15 us) + 1.675 us = 1.975 us
    step = 2 * n.intra_latency + n.step_latency_intra
    assert step == pytest.approx(1.975e-6, rel=1e-12)
    # nccl.csv latency rows: 2 GPUs, 2 steps: 6.05 + 2*1.975 = 10 us; 8 GPUs, 14 steps: 6.05 + 27.65 = 33.7 us
    assert n.collective_launch + 2 * step == pytest.approx(10e-6, rel=1e-12)
    assert n.collective_launch + 14 * step == pytest.approx(33.7e-6, rel=1e-12)
    assert (n.step_latency_inter, n.nic_latency) == pytest.approx((3e-6, 0.5e-6), rel=1e-12)


@pytest.mark.parametrize("name, gpu, nvlink", [
    ("dgx-h100", "H100-SXM5-80GB", 450e9), ("dgx-h200", "H200-SXM", 450e9),
    ("h800-node", "H800-SXM", 200e9), ("dgx-b200", "B200", 900e9),
])
def test_hopper_class_nodes(name, gpu, nvlink):
    n = catalog.node(name)
    assert n.gpu.name == gpu
    assert n.intra_bandwidth == pytest.approx(nvlink, rel=1e-12)
    # nccl.csv H100 ring busbw 370 of 450 GB/s; NDR 47 of 50 GB/s
    assert n.intra_efficiency == pytest.approx(370 / 450, rel=1e-12)
    assert n.nic_bandwidth == pytest.approx(50e9, rel=1e-12)  # 400 Gb/s / 8
    assert n.nic_efficiency == pytest.approx(47 / 50, rel=1e-12)
    assert n.nics == 8
    assert n.collective_launch == pytest.approx(6.05e-6, rel=1e-12)


def test_pcie_and_v100_nodes():
    l40s = catalog.node("pcie-l40s")
    assert (l40s.intra, l40s.gpu.name, l40s.gpus_per_node) == ("pcie", "L40S", 8)
    assert (l40s.intra_bandwidth, l40s.intra_efficiency) == pytest.approx((32e9, 0.8), rel=1e-12)
    v100 = catalog.node("dgx-v100")
    assert (v100.intra, v100.gpu.name) == ("nvswitch", "V100-SXM2-32GB")
    assert (v100.intra_bandwidth, v100.intra_efficiency) == pytest.approx((150e9, 0.8), rel=1e-12)


def test_names():
    assert catalog.node_names() == ["dgx-a100", "dgx-h100", "dgx-h200", "h800-node", "dgx-b200",
                                    "gb200-nvl72", "gb300-nvl72", "dgx-b300", "pcie-l40s", "dgx-v100"]
    assert len(catalog.gpu_names()) == 11
    for name in catalog.node_names():
        n = catalog.node(name)
        assert n.gpu.name in catalog.gpu_names()
        assert 0 < n.intra_efficiency <= 1 and 0 < n.nic_efficiency <= 1


def test_lookup_is_case_insensitive():
    assert catalog.node("DGX-A100") is catalog.node("dgx-a100")
    assert catalog.gpu("h100-sxm5-80gb").name == "H100-SXM5-80GB"


def test_unknown_names_suggest():
    with pytest.raises(CatalogError) as info:
        catalog.node("dgx-a10")
    assert isinstance(info.value, KeyError) and isinstance(info.value, EmulatorError)
    assert str(info.value).startswith('unknown node "dgx-a10"; did you mean "dgx-a100"')
    with pytest.raises(CatalogError, match='did you mean "H100-SXM5-80GB"'):
        catalog.gpu("H100")


def test_every_entry_cites_a_source():
    text = resources.files("emulator").joinpath("data/catalog.yaml").read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    for section in ("gpus", "nodes"):
        for name, entry in data[section].items():
            assert entry.get("source"), f"{section}.{name} has no source"
    assert "nccl.csv" in data["nodes"]["dgx-a100"]["source"]
