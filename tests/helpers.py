"""Shared test helpers: small custom graphs and scenarios built in code."""
import json
import os
from contextlib import contextmanager

from emulator.scenario import ClusterSpec, FabricSpec, Scenario


def write_graph(folder, nodes, links):
    path = os.path.join(str(folder), "graph.json")
    with open(path, "w") as fh:
        json.dump({"nodes": nodes, "links": links}, fh)
    return path


def star(folder, n, bw=100e9, lat=1e-6):
    """n GPUs on one switch; each cable bw each way, lat per link."""
    nodes = [{"id": f"g{i}", "kind": "gpu"} for i in range(n)] + [{"id": "s", "kind": "switch"}]
    links = []
    for i in range(n):
        links += [{"src": f"g{i}", "dst": "s", "bandwidth": bw, "latency": lat},
                  {"src": "s", "dst": f"g{i}", "bandwidth": bw, "latency": lat}]
    return write_graph(folder, nodes, links)


def custom_scenario(graph, name="t"):
    return Scenario(name=name, cluster=ClusterSpec(nodes=1, node=None, fabric=FabricSpec(kind="custom", graph=graph)))


class HandClock:
    """A virtual clock moved by hand (live-session tests): ``compute(dt)`` is the local rank's
    measured compute, waits jump it (``advance_to``)."""

    mode = "virtual"
    hidden_s = 0.0

    def __init__(self):
        self.t = 0.0

    def now(self):
        return self.t

    def compute(self, dt):
        self.t += dt

    def advance_to(self, t):
        gap = t - self.t
        if gap <= 0:
            return 0.0
        self.t = t
        return gap

    @contextmanager
    def hidden(self):
        yield


# A 1 GB all-reduce over two ranks, and four one-GPU nodes on a 4:1 fat tree (two leaves of two,
# 100 GB/s NICs, no latency): alone each all-reduce takes S / 50 GB/s = 20 ms (tests/test_jobs*.py).
ALLREDUCE_TRACE = {"format": "emulator-trace", "version": 1, "ranks": 2, "ops": [
    {"id": r, "rank": r, "kind": "collective", "op": "all_reduce", "group": [0, 1], "bytes": 1e9, "deps": []}
    for r in range(2)]}
UPLINK_MIX = """\
cluster:
  nodes: 4
  node: {gpu: A100-SXM4-80GB, gpus_per_node: 1, intra_bandwidth: "1000 GB/s", nics: 1,
          nic_bandwidth: "100 GB/s"}
  fabric: {kind: fat_tree, leaf_size: 2, oversubscription: 4, latency: "0 s"}
jobs:
"""


def uplink_mix(folder, name: str, jobs: list[str]) -> str:
    """A scenario ``name`` of ``jobs`` (one flow-mapping line each) on UPLINK_MIX's cluster, with
    ar.json (ALLREDUCE_TRACE) beside it; returns its path."""
    with open(os.path.join(str(folder), "ar.json"), "w") as fh:
        json.dump(ALLREDUCE_TRACE, fh)
    path = os.path.join(str(folder), f"{name}.yaml")
    with open(path, "w") as fh:
        fh.write(f"name: {name}\n" + UPLINK_MIX + "".join(f"  - {j}\n" for j in jobs))
    return path


def free_net(tmp_path, p):
    """A scenario of p GPUs on one switch, 1 GB/s links with no latency: pipelines whose messages cost ~nothing."""
    nodes = [{"id": f"g{i}", "kind": "gpu"} for i in range(p)] + [{"id": "s", "kind": "switch"}]
    links = [d for i in range(p) for d in ({"src": f"g{i}", "dst": "s", "bandwidth": 1e9, "latency": 0},
                                           {"src": "s", "dst": f"g{i}", "bandwidth": 1e9, "latency": 0})]
    return custom_scenario(write_graph(tmp_path, nodes, links))
