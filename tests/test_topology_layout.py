"""Generated topologies as plain dicts (Layout); the networkx graph only when asked for.

dgx-a100: 8 GPUs with a NIC each; fat_tree with leaves of 2 nodes over 8 spines (one per NIC).
"""
import os
import subprocess
import sys

import pytest

from emulator.network.topology import Layout, build_topology
from emulator.outputs.nic import nics
from emulator.scenario import load_scenario_text


def topo(fabric, nodes=4):
    sc = load_scenario_text(f"name: t\ncluster: {{nodes: {nodes}, node: dgx-a100, fabric: {fabric}}}\n", "t.yaml")
    return build_topology(sc.cluster)


def test_the_graph_is_built_on_first_use_with_the_layouts_links():
    t = topo("{kind: fat_tree, leaf_size: 2}")
    assert isinstance(t.source, Layout)
    # 4 nodes × 8 GPUs: GPU↔NVSwitch and GPU↔NIC cables (2 × 32 × 2), NIC↔leaf (32 × 2),
    # 2 leaves × 8 spines cables (16 × 2): 128 + 64 + 32 = 224 directed links
    assert len(t.links) == 224
    g = t.graph
    assert not isinstance(t.source, Layout)
    assert sorted(g.edges()) == t.links
    assert g.nodes["gpu9"] == {"kind": "gpu", "rank": 9, "node": 1, "local": 1}
    assert g.edges["leaf1", "spine3"]["bandwidth"] == 2 * 8 * 25e9 / 8  # leaf's NICs / 8 spines = 50 GB/s


def test_nics_from_the_layout_equal_those_from_the_graph():
    t = topo("{kind: rail, leaf_size: 2}")
    from_layout = nics(t)
    t.graph  # noqa: B018 — build the graph: nics() now reads it
    assert nics(t) == from_layout
    assert len(from_layout) == 32 and from_layout[0].name == "nic0.0"
    assert [t.links[i] for i in from_layout[0].egress] == [("nic0.0", "rail0.0")]


@pytest.mark.parametrize("fabric", ["{kind: fat_tree, leaf_size: 2}", "{kind: fat_tree3, leaf_size: 1, pod_size: 2}",
                                    "{kind: multi_plane, leaf_size: 2, spines: 2}", "{kind: single_switch}",
                                    "{kind: dragonfly, leaf_size: 1, group_size: 2, global_links: 1}",
                                    "{kind: torus, torus_dims: [2, 2]}"])
def test_nic_ports_from_the_layout_equal_those_from_the_graph_on_every_fabric(fabric):
    # the layout finds the ports among its edges in the order they were laid; the graph looks at every
    # neighbour of every NIC. 4 dgx-a100 nodes: 32 NICs, each with one port each way onto its switch
    t = topo(fabric)
    from_layout = nics(t)
    assert len(from_layout) == 32
    assert all(len(n.egress) == 1 and len(n.ingress) == 1 for n in from_layout)
    t.graph  # noqa: B018 — build the graph: nics() now reads it
    assert nics(t) == from_layout


def test_a_run_on_a_generated_fabric_never_imports_networkx():
    code = ("import sys; from emulator.scenario import load_scenario; from emulator.run.simulation import simulate; "
            "from emulator.outputs.summary import summarize; summarize(simulate(load_scenario('scenarios/quickstart.yaml'))); "
            "print('networkx' in sys.modules)")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root, env=env)
    assert out.stdout.strip() == "False"
