"""`emulator topology`: the cluster's GPUs, NICs, switches and links, named as cluster.overrides names them."""
import json

from emulator.cli import main
from emulator.network.topology import build_topology
from emulator.run.faults import _links, _ranks
from emulator.scenario.reader import load_scenario

TWO_NODES = "name: two\ncluster:\n  nodes: 2\n  node: dgx-a100\n"  # single_switch by default


def _two(tmp_path):
    path = tmp_path / "two.yaml"
    path.write_text(TWO_NODES)
    return str(path)


def test_two_dgx_a100_nodes_have_the_hand_counted_names_and_links(tmp_path, capsys):
    assert main(["topology", _two(tmp_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    # 2 nodes × 8 GPUs = 16 GPUs; 2 × 8 NICs (dgx-a100: 8 NICs) = 16 NICs;
    # switches: one NVSwitch per node (nvsw0, nvsw1) + the fabric's single switch (sw) = 3
    assert [g["name"] for g in data["gpus"]] == [f"gpu{r}" for r in range(16)]
    assert [g["node"] for g in data["gpus"]] == [0] * 8 + [1] * 8
    assert len(data["nics"]) == 16
    assert [s["name"] for s in data["switches"]] == ["nvsw0", "nvsw1", "sw"]
    # cables: GPU–NVSwitch 16 (nvlink) + GPU–NIC 16 (pcie) + NIC–switch 16 (nic) = 48; two directions: 96 links
    classes = [lk["class"] for lk in data["links"]]
    assert len(classes) == 96
    assert {c: classes.count(c) for c in set(classes)} == {"nvlink": 32, "pcie": 32, "nic": 32}
    nic = next(lk for lk in data["links"] if lk["name"] == "nic1.7->sw")
    assert nic["bandwidth_B_per_s"] == 25e9 and nic["latency_s"] == 0.5e-6  # 200 Gb/s = 25 GB/s, 0.5 us


def test_the_text_groups_by_kind_with_counts_and_rates(tmp_path, capsys):
    assert main(["topology", _two(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "16 GPUs, 16 NICs, 3 switches, 96 links" in text
    assert "GPUs (16): gpu0..gpu15" in text
    assert "NICs (16): nic0.0..nic0.7, nic1.0..nic1.7" in text
    assert "nic (32 links, 16 cables): 200 Gb/s (25 GB/s)" in text  # 25 GB/s × 8 = 200 Gb/s
    assert "nvlink (32 links, 16 cables): 2400 Gb/s (300 GB/s)" in text
    assert "\n    gpu15<->nvsw1\n" in text


def test_every_listed_name_is_one_an_override_accepts(tmp_path, capsys):
    path = "scenarios/spine-link-failure.yaml"
    assert main(["topology", path, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    topo = build_topology(load_scenario(path, []).cluster)
    for lk in data["links"]:
        assert _links(topo, lk["name"]) == [topo.link_ids[lk["src"], lk["dst"]]]
        assert len(_links(topo, f"{lk['src']}<->{lk['dst']}")) == 2
    for g in data["gpus"]:
        assert _ranks(topo, f"gpu:{g['rank']}") == [g["rank"]]
        assert g["rank"] in _ranks(topo, f"node:{g['node']}")
    # 4 nodes, 2 per leaf: 2 leaves × 8 spines (one per NIC) = 16 leaf–spine cables = 32 fabric links
    assert sum(lk["class"] == "fabric" for lk in data["links"]) == 32


def test_bad_input_exits_2_with_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: b\ncluster:\n  nodes: 2\n  node: dgx-a100\n  fabric: {kind: fat_treee}\n")
    assert main(["topology", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cluster.fabric.kind" in err and "bad.yaml" in err
    assert main(["topology", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err
