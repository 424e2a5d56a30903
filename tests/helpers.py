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
