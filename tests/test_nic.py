"""NIC ports and link utilisation: which link is the bottleneck."""
import pytest

from emulator.outputs.nic import busiest_links, busiest_nic, nics
from emulator.program import RECV, SEND, Op, Program
from emulator.run.simulation import run_program
from emulator.scenario import load_scenario_text


def test_one_transfer_makes_its_nic_the_busiest():
    # 2 DGX A100 on one switch; rank 0 sends 1 GB to rank 8 (node 1): it crosses nic0.0 → sw → nic1.0.
    sc = load_scenario_text("name: n\ncluster: {nodes: 2, node: dgx-a100, fabric: {kind: single_switch}}\n", "n.yaml")
    ops = [Op(0, 0, SEND, peer=8, bytes=1e9, tag=1), Op(1, 8, RECV, peer=0, bytes=1e9, tag=1)]
    r = run_program(Program(16, ops), sc)
    assert len(nics(r.topology)) == 16 and all(len(n.egress) == 1 for n in nics(r.topology))
    # the NIC ports (24 GB/s after efficiency) carry the bytes the whole time the transfer streams:
    # utilisation = 1e9 / (24e9 × T), T = latency + 1e9/24e9
    top = busiest_links(r.topology, r.link_bytes, r.iteration_time_s, top=2)
    assert {t["link"] for t in top} == {"nic0.0->sw", "sw->nic1.0"}
    assert top[0]["utilisation"] == pytest.approx(1e9 / (24e9 * r.iteration_time_s), rel=1e-9)
    assert busiest_nic(r.topology, r.link_bytes, r.iteration_time_s)["nic"] in ("nic0.0", "nic1.0")
