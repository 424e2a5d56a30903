"""Topologies: a networkx DiGraph of GPUs, NICs and switches, plus link arrays.

Nodes carry ``kind`` (gpu | nic | switch); GPUs also ``rank`` and ``node``.
Edges are directed links with ``bandwidth`` (raw line rate, B/s), ``efficiency``
(achieved fraction, calibrated per link class), ``latency`` (s) and ``cls``
(nvlink | pcie | nic | fabric | custom). A full-duplex cable is two edges.

A node of the network is an NVLink domain: one server, or the several servers of a rack whose
GPUs share NVLink switches (``nvlink_domain``, an NVL72 rack; network/domain.py).

Builders are small named plug-ins (``BUILDERS``): the node interior (NVSwitch or
PCIe switch: every GPU has a port of the intra-node rate each way; GPU i uses NIC
i·nics/g) and the fabric joining the NICs (single switch, two-level leaf/spine
fat-tree with an oversubscription ratio, three-level fat-tree of pods, rail-optimized,
multi-plane rails, dragonfly, ring/torus, custom file).

Today's AI-cluster fabrics (issue #16):
- ``fat_tree3``: leaves of ``leaf_size`` nodes, pods of ``pod_size`` leaves, each pod
  with ``spines`` spines (leaf–spine as in ``fat_tree``), and spine k of every pod
  joined to the ``cores`` core switches of plane k. A spine–core link has
  ``link_bandwidth``, or by default pod_size × the leaf–spine rate / cores (the
  core level is non-blocking; the leaf level carries the oversubscription);
- ``multi_plane``: NIC i of every node on plane i, each plane its own leaf/spine
  network (``spines`` per plane) that meets no other plane; a transfer between NICs
  of different planes first crosses the node's NVLink to the GPU of the right plane
  (NCCL's PXN);
- ``dragonfly``: a router per ``leaf_size`` nodes (all their NICs), ``group_size``
  routers per group joined all-to-all (local links), and ``global_links`` links
  between every pair of groups (link m of groups i, j on router (rel·h + m) mod a of
  each, rel the other group's index among the rest); every link has
  ``link_bandwidth``, by default the NIC rate.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Callable

from emulator.network.domain import network_cluster
from emulator.scenario.spec import ClusterSpec, NodeSpec

if TYPE_CHECKING:  # imported where a graph is made (to_networkx, load_graph): it costs ~0.1 s
    import networkx as nx


class Layout:
    """A generated network as plain dicts: what the builders lay out, and all a run needs.

    It records nodes and directed edges with their attributes, in the order networkx would
    (a node at its first mention; an edge at its first adding, later adds update it), so that
    ``to_networkx`` gives the very graph the builders used to make, with the same node, edge
    and neighbour order. A run never asks for it: link ids come from ``edges``, routes from
    the structured router; only faults, custom routing and tests do.
    """

    def __init__(self) -> None:  # noqa: D107
        self.nodes: dict[str, dict[str, Any]] = {}
        self.edges: dict[tuple[str, str], dict[str, Any]] = {}

    def add_node(self, name: str, **attrs: object) -> None:
        node = self.nodes.get(name)
        if node is None:
            self.nodes[name] = attrs
        else:
            node.update(attrs)

    def add_edge(self, u: str, v: str, **attrs: object) -> None:
        nodes = self.nodes
        if u not in nodes:
            nodes[u] = {}
        if v not in nodes:
            nodes[v] = {}
        edge = self.edges.get((u, v))
        if edge is None:
            self.edges[u, v] = attrs
        else:
            edge.update(attrs)

    def add_cable(self, a: str, b: str, attrs: dict[str, Any]) -> None:
        """``add_edge(a, b, **attrs)`` then ``add_edge(b, a, **attrs)`` (each edge its own dict)."""
        nodes, edges = self.nodes, self.edges
        if a not in nodes:
            nodes[a] = {}
        if b not in nodes:
            nodes[b] = {}
        ab, ba = (a, b), (b, a)
        if ab not in edges and ba not in edges:  # a new cable (always, in the generated fabrics)
            edges[ab] = attrs.copy()
            edges[ba] = attrs.copy()
            return
        for key in (ab, ba):
            edge = edges.get(key)
            if edge is None:
                edges[key] = attrs.copy()
            else:
                edge.update(attrs)

    def has_edge(self, u: str, v: str) -> bool:
        return (u, v) in self.edges

    def __contains__(self, name: object) -> bool:
        return name in self.nodes

    def to_networkx(self) -> nx.DiGraph:
        import networkx as nx

        g = nx.DiGraph()
        g.add_nodes_from((n, dict(d)) for n, d in self.nodes.items())
        g.add_edges_from((u, v, dict(d)) for (u, v), d in self.edges.items())
        return g


@dataclass
class Topology:
    """The built network: its nodes and links, and flat link arrays indexed by link id.

    ``source`` is a generated ``Layout`` (plain dicts) or a custom graph's networkx graph;
    ``graph`` gives the networkx graph either way, made from the layout on first use.
    """

    source: nx.DiGraph | Layout
    gpus: list[str]  # graph node of each rank, in rank order
    kind: str  # the fabric builder that made it
    gpus_per_node: int = 0
    nics_per_node: int = 0
    leaf_size: int = 0
    spines: int = 0
    torus_dims: tuple[int, ...] = ()
    link_ids: dict[tuple[str, str], int] = field(default_factory=dict)
    links: list[tuple[str, str]] = field(default_factory=list)
    capacity: list[float] = field(default_factory=list)  # B/s, bandwidth × efficiency
    latency: list[float] = field(default_factory=list)  # s
    cls: list[str] = field(default_factory=list)
    failed: frozenset[tuple[str, str]] = frozenset()  # links (edges) that carry nothing (failed)
    routing: str = "spray"  # spray | ecmp_hash (emulator.network.routing)
    seed: int = 0  # seed of the ECMP hash
    pod_size: int = 0  # leaves per pod (fat_tree3)
    cores: int = 0  # core switches per spine position (fat_tree3)
    group_size: int = 0  # routers per group (dragonfly)
    global_links: int = 0  # links between two groups (dragonfly)
    intra_switch: str = "nvsw"  # name prefix of a node's switch: nvsw (NVSwitch) or pcie
    # GPUs of one server (a scenario's node: an NVL72 compute tray); 0: gpus_per_node. gpus_per_node is
    # that of the network's node, the NVLink domain (network/domain.py)
    server_gpus: int = 0

    @property
    def graph(self) -> nx.DiGraph:
        """The network as a networkx graph (built from the layout the first time it is asked for)."""
        if isinstance(self.source, Layout):
            self.source = self.source.to_networkx()
        return self.source

    def node_items(self) -> list[tuple[str, dict[str, Any]]]:
        """Every node with its attributes, in graph order (without building a graph)."""
        if isinstance(self.source, Layout):
            return list(self.source.nodes.items())
        return list(self.source.nodes(data=True))

    def node_data(self, name: str) -> dict[str, Any]:
        if isinstance(self.source, Layout):
            return self.source.nodes[name]
        data: dict[str, Any] = self.source.nodes[name]
        return data

    def index(self) -> None:
        """(Re)build the flat link arrays from the graph, in a deterministic order."""
        edges = self.source.edges if isinstance(self.source, Layout) else None
        self.links = sorted(edges) if edges is not None else sorted(self.graph.edges())
        self.link_ids = dict(zip(self.links, range(len(self.links))))
        g = edges if edges is not None else self.graph.edges
        data = list(map(g.__getitem__, self.links))
        self.capacity = [d["bandwidth"] * d.get("efficiency", 1.0) for d in data]
        self.latency = list(map(itemgetter("latency"), data))
        self.cls = [d.get("cls", "custom") for d in data]

    def node_of(self, rank: int) -> int:
        """The server (node) index of a rank; -1 on a custom graph."""
        if self.gpus_per_node:  # a generated cluster: ranks fill the nodes in order (build_nodes)
            return rank // self.gpus_per_node
        node: int = self.graph.nodes[self.gpus[rank]].get("node", -1)  # networkx attributes are untyped
        return node

    def nic_of(self, rank: int) -> str:
        node = rank // self.gpus_per_node
        local = rank % self.gpus_per_node
        return f"nic{node}.{local * self.nics_per_node // self.gpus_per_node}"


def _link(g: Layout, a: str, b: str, bw: float, lat: float, eff: float, cls: str) -> None:
    """A full-duplex cable: two directed edges."""
    g.add_cable(a, b, {"bandwidth": bw, "latency": lat, "efficiency": eff, "cls": cls})


def build_nodes(g: Layout, nodes: int, spec: NodeSpec, gpus_total: int = 0) -> list[str]:
    """Servers: GPUs on an NVSwitch or PCIe switch, and their NICs. Returns GPU names.
    With ``gpus_total`` the last node holds only the GPUs that remain (a partly filled NVLink domain)."""
    cls = "nvlink" if spec.intra == "nvswitch" else "pcie"
    # every GPU's cables have the same attributes (as _link gives them; each edge gets its own copy)
    intra = {"bandwidth": spec.intra_bandwidth, "latency": spec.intra_latency, "efficiency": spec.intra_efficiency,
             "cls": cls}
    # GPU↔NIC over PCIe: never the bottleneck of its own NIC (the NIC port is)
    pcie = {"bandwidth": spec.nic_bandwidth, "latency": 0.0, "efficiency": 1.0, "cls": "pcie"}
    gpn, nics = spec.gpus_per_node, spec.nics
    cable = g.add_cable
    gpus = []
    for n in range(nodes):
        sw = f"{'nvsw' if cls == 'nvlink' else 'pcie'}{n}"
        g.add_node(sw, kind="switch", node=n)
        for i in range(nics):
            g.add_node(f"nic{n}.{i}", kind="nic", node=n)
        for i in range(gpn):
            r = n * gpn + i
            if gpus_total and r >= gpus_total:
                break
            name = f"gpu{r}"
            g.add_node(name, kind="gpu", rank=r, node=n, local=i)
            gpus.append(name)
            cable(name, sw, intra)
            if nics:
                cable(name, f"nic{n}.{i * nics // gpn}", pcie)
    return gpus


def _nic_port(g: Layout, nic: str, sw: str, spec: NodeSpec) -> None:
    _link(g, nic, sw, spec.nic_bandwidth, spec.nic_latency, spec.nic_efficiency, "nic")


def single_switch(g: Layout, c: ClusterSpec, spec: NodeSpec, topo: Topology) -> None:
    """Every NIC on one switch."""
    if c.nodes == 1:
        return
    g.add_node("sw", kind="switch")
    for n in range(c.nodes):
        for i in range(spec.nics):
            _nic_port(g, f"nic{n}.{i}", "sw", spec)


def _leaves(c: ClusterSpec) -> tuple[int, int]:
    leaf = max(1, min(c.fabric.leaf_size, c.nodes))
    return leaf, math.ceil(c.nodes / leaf)


def _spine_links(g: Layout, c: ClusterSpec, spec: NodeSpec, switches: list[str],
                 down_bw: float, topo: Topology) -> None:
    """Join ``switches`` through ``spines`` spines so that up = down / oversubscription."""
    spines = c.fabric.spines or max(1, spec.nics)
    topo.spines = spines
    if c.fabric.link_bandwidth:
        up_each = c.fabric.link_bandwidth / c.fabric.oversubscription
    else:
        up_each = down_bw / c.fabric.oversubscription / spines
    for k in range(spines):
        g.add_node(f"spine{k}", kind="switch")
        for s in switches:
            _link(g, s, f"spine{k}", up_each, c.fabric.latency, spec.nic_efficiency, "fabric")


def fat_tree(g: Layout, c: ClusterSpec, spec: NodeSpec, topo: Topology) -> None:
    """Two-level leaf/spine: ``leaf_size`` nodes per leaf; uplinks = downlinks / oversub.

    There are ``spines`` spines, by default ``nics`` (an even ECMP split makes their
    number immaterial; a hashed one does not);
    each leaf–spine link has bandwidth leaf_size·nics·nic_bw / (oversub·spines),
    or ``link_bandwidth``/oversub when the scenario gives a fabric link rate.
    """
    leaf, leaves = _leaves(c)
    topo.leaf_size = leaf
    names = []
    for j in range(leaves):
        names.append(f"leaf{j}")
        g.add_node(f"leaf{j}", kind="switch")
    for n in range(c.nodes):
        for i in range(spec.nics):
            _nic_port(g, f"nic{n}.{i}", f"leaf{n // leaf}", spec)
    if leaves > 1:
        _spine_links(g, c, spec, names, leaf * spec.nics * spec.nic_bandwidth, topo)


def rail(g: Layout, c: ClusterSpec, spec: NodeSpec, topo: Topology) -> None:
    """Rail-optimized: NIC i of each node in a group of ``leaf_size`` nodes on rail switch i."""
    leaf, groups = _leaves(c)
    topo.leaf_size = leaf
    names = []
    for grp in range(groups):
        for i in range(spec.nics):
            names.append(f"rail{grp}.{i}")
            g.add_node(f"rail{grp}.{i}", kind="switch")
    for n in range(c.nodes):
        for i in range(spec.nics):
            _nic_port(g, f"nic{n}.{i}", f"rail{n // leaf}.{i}", spec)
    if len(names) > 1:
        _spine_links(g, c, spec, names, leaf * spec.nic_bandwidth, topo)


def _switches(g: Layout, names: list[str]) -> None:
    for name in names:
        g.add_node(name, kind="switch")


def fat_tree3(g: Layout, c: ClusterSpec, spec: NodeSpec, topo: Topology) -> None:
    """Three levels: leaves, pods of ``pod_size`` leaves with ``spines`` spines each, cores."""
    leaf, leaves = _leaves(c)
    topo.leaf_size, topo.pod_size = leaf, c.fabric.pod_size
    _switches(g, [f"leaf{j}" for j in range(leaves)])
    for n in range(c.nodes):
        for i in range(spec.nics):
            _nic_port(g, f"nic{n}.{i}", f"leaf{n // leaf}", spec)
    pods = math.ceil(leaves / c.fabric.pod_size)
    spines = c.fabric.spines or max(1, spec.nics)
    topo.spines, topo.cores = spines, c.fabric.cores or c.fabric.pod_size
    if leaves == 1:
        return
    up = c.fabric.link_bandwidth or leaf * spec.nics * spec.nic_bandwidth / spines
    up /= c.fabric.oversubscription
    core_bw = c.fabric.link_bandwidth or c.fabric.pod_size * up / topo.cores
    _switches(g, [f"spine{p}.{k}" for p in range(pods) for k in range(spines)])
    if pods > 1:
        _switches(g, [f"core{k}.{m}" for k in range(spines) for m in range(topo.cores)])
    for j in range(leaves):
        for k in range(spines):
            _link(g, f"leaf{j}", f"spine{j // c.fabric.pod_size}.{k}", up, c.fabric.latency, spec.nic_efficiency,
                  "fabric")
    if pods == 1:
        return
    for p in range(pods):
        for k in range(spines):
            for m in range(topo.cores):
                _link(g, f"spine{p}.{k}", f"core{k}.{m}", core_bw, c.fabric.latency, spec.nic_efficiency, "fabric")


def multi_plane(g: Layout, c: ClusterSpec, spec: NodeSpec, topo: Topology) -> None:
    """One leaf/spine network per NIC index (plane); planes never meet."""
    leaf, leaves = _leaves(c)
    topo.leaf_size = leaf
    spines = c.fabric.spines or 1
    topo.spines = spines
    up = (c.fabric.link_bandwidth or leaf * spec.nic_bandwidth / spines) / c.fabric.oversubscription
    for i in range(spec.nics):
        _switches(g, [f"plane{i}.leaf{j}" for j in range(leaves)])
        _switches(g, [f"plane{i}.spine{k}" for k in range(spines)] if leaves > 1 else [])
        for n in range(c.nodes):
            _nic_port(g, f"nic{n}.{i}", f"plane{i}.leaf{n // leaf}", spec)
        if leaves == 1:
            continue
        for j in range(leaves):
            for k in range(spines):
                _link(g, f"plane{i}.leaf{j}", f"plane{i}.spine{k}", up, c.fabric.latency, spec.nic_efficiency,
                      "fabric")


def dragonfly_gateway(src_group: int, dst_group: int, m: int, topo: Topology) -> int:
    """The router (index in ``src_group``) that holds global link ``m`` towards ``dst_group``."""
    rel = dst_group if dst_group < src_group else dst_group - 1
    return (rel * topo.global_links + m) % topo.group_size


def dragonfly(g: Layout, c: ClusterSpec, spec: NodeSpec, topo: Topology) -> None:
    """Groups of all-to-all routers, every pair of groups joined by ``global_links`` links."""
    leaf, routers = _leaves(c)
    a, h = c.fabric.group_size, c.fabric.global_links
    topo.leaf_size, topo.group_size, topo.global_links = leaf, a, h
    groups = math.ceil(routers / a)
    bw, lat, eff = c.fabric.link_bandwidth or spec.nic_bandwidth, c.fabric.latency, spec.nic_efficiency
    for n in range(c.nodes):
        r = n // leaf
        for i in range(spec.nics):
            _nic_port(g, f"nic{n}.{i}", f"df{r // a}.{r % a}", spec)
    for grp in range(groups):
        for x in range(a):
            g.add_node(f"df{grp}.{x}", kind="switch")
            for y in range(x):
                _link(g, f"df{grp}.{x}", f"df{grp}.{y}", bw, lat, eff, "fabric")
    for gi in range(groups):
        for gj in range(gi):
            for m in range(h):
                ri, rj = dragonfly_gateway(gi, gj, m, topo), dragonfly_gateway(gj, gi, m, topo)
                _link(g, f"df{gi}.{ri}", f"df{gj}.{rj}", bw, lat, eff, "fabric")


def torus(g: Layout, c: ClusterSpec, spec: NodeSpec, topo: Topology) -> None:
    """Nodes on a ring or torus: a router per node joins its NICs and its neighbours.

    Each neighbour link has ``link_bandwidth`` or, by default, the node's NIC
    bandwidth spread over its links (so injection equals the NIC total): a
    dimension of size 1 has no link, one of size 2 a single neighbour (+1 and −1
    are the same node: one cable), a larger one two (``torus_links``). So
    ``[4, 1]`` is ``[4]``, ``[2, 2]`` the same 4-cycle as a 4-node ring, and a
    2-node ring one cable of the whole NIC total, as ``single_switch`` gives.
    """
    dims = c.fabric.torus_dims or (c.nodes,)
    topo.torus_dims = tuple(dims)
    links = torus_links(tuple(dims))
    default_bw = spec.nics * spec.nic_bandwidth / max(1, links)
    bw = c.fabric.link_bandwidth or default_bw
    for n in range(c.nodes):
        g.add_node(f"tr{n}", kind="switch", node=n)
        for i in range(spec.nics):
            _nic_port(g, f"nic{n}.{i}", f"tr{n}", spec)
    for n in range(c.nodes):
        coords = unravel(n, dims)
        for d, size in enumerate(dims):
            if size < 2:
                continue
            nxt = list(coords)
            nxt[d] = (coords[d] + 1) % size
            m = ravel(nxt, dims)
            if m != n and not g.has_edge(f"tr{n}", f"tr{m}"):
                _link(g, f"tr{n}", f"tr{m}", bw, c.fabric.latency, spec.nic_efficiency, "fabric")


def torus_links(dims: tuple[int, ...]) -> int:
    """Neighbour cables of one router of a torus: 0 per dimension of size 1, 1 per size 2, else 2."""
    return sum(min(size - 1, 2) for size in dims)


def unravel(n: int, dims: tuple[int, ...]) -> list[int]:
    out = []
    for size in reversed(dims):
        out.append(n % size)
        n //= size
    return out[::-1]


def ravel(coords: list[int], dims: tuple[int, ...]) -> int:
    r = 0
    for size, x in zip(dims, coords):
        r = r * size + x
    return r


BUILDERS: dict[str, Callable[[Layout, ClusterSpec, NodeSpec, Topology], None]] = {
    "single_switch": single_switch,
    "fat_tree": fat_tree,
    "rail": rail,
    "fat_tree3": fat_tree3,
    "multi_plane": multi_plane,
    "dragonfly": dragonfly,
    "ring": torus,
    "torus": torus,
}


def build_topology(cluster: ClusterSpec) -> Topology:
    """Build the cluster's topology (custom graphs come from their file)."""
    if cluster.fabric.kind == "custom":
        topo = load_graph(cluster.fabric.graph or "")
        topo.routing, topo.seed = cluster.fabric.routing, cluster.fabric.seed
        return topo
    spec = cluster.node
    if spec is None:
        raise ValueError(f"fabric kind {cluster.fabric.kind!r} needs a node type (only a custom graph has none)")
    g = Layout()
    # an NVLink domain of several nodes (an NVL72 rack) is one node of the network (network/domain.py)
    net = network_cluster(cluster)
    dom = net.node
    assert dom is not None
    gpus = build_nodes(g, net.nodes, dom, cluster.nodes * spec.gpus_per_node)
    topo = Topology(g, gpus, cluster.fabric.kind, dom.gpus_per_node, dom.nics,
                    routing=cluster.fabric.routing, seed=cluster.fabric.seed,
                    intra_switch="nvsw" if spec.intra == "nvswitch" else "pcie", server_gpus=spec.gpus_per_node)
    if cluster.fabric.kind not in BUILDERS:
        raise ValueError(f"unknown fabric kind {cluster.fabric.kind!r}; known: {', '.join(sorted(BUILDERS))}, custom")
    BUILDERS[cluster.fabric.kind](g, net, dom, topo)
    topo.index()
    return topo


def load_graph(path: str) -> Topology:
    """A custom graph file (JSON or YAML): ``nodes`` [{id, kind}] and directed ``links``
    [{src, dst, bandwidth, latency}]. Plain numbers are SI; unit strings are accepted.
    Ranks map to the gpu nodes in file order. Links are exactly as given (efficiency 1), each
    directed link once.
    """
    from emulator.errors import EmulatorError
    from emulator.scenario.units import parse_si

    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        if path.endswith((".yaml", ".yml")):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise EmulatorError(f"{path}: cannot read the graph file: {exc}") from None
    except Exception as exc:  # yaml errors
        raise EmulatorError(f"{path}: cannot parse the graph file: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list) or not isinstance(data.get("links"), list):
        raise EmulatorError(f"{path}: a graph file is an object with lists 'nodes' and 'links'")
    import networkx as nx

    g = nx.DiGraph()
    gpus: list[str] = []
    for i, node in enumerate(data["nodes"]):
        if not isinstance(node, dict) or "id" not in node or node.get("kind") not in ("gpu", "nic", "switch"):
            raise EmulatorError(f"{path}: nodes[{i}]: expected {{id, kind: gpu | nic | switch}}, got {node!r}")
        nid = str(node["id"])
        if nid in g:
            raise EmulatorError(f"{path}: nodes[{i}]: duplicate id {nid!r}")
        attrs = {"kind": node["kind"]}
        if node["kind"] == "gpu":
            attrs["rank"] = len(gpus)
            gpus.append(nid)
        g.add_node(nid, **attrs)
    listed: dict[tuple[str, str], int] = {}  # (src, dst) → index of the entry that gave it
    for i, link in enumerate(data["links"]):
        where = f"{path}: links[{i}]"
        if not isinstance(link, dict) or not {"src", "dst", "bandwidth"} <= set(link):
            raise EmulatorError(f"{where}: expected {{src, dst, bandwidth, latency}}, got {link!r}")
        src, dst = str(link["src"]), str(link["dst"])
        for end in (src, dst):
            if end not in g:
                raise EmulatorError(f"{where}: unknown node {end!r}")
        try:
            bw = parse_si(link["bandwidth"], "bandwidth")
            lat = parse_si(link.get("latency", 0), "time")
        except ValueError as exc:
            raise EmulatorError(f"{where}: {exc}") from None
        if bw <= 0:
            raise EmulatorError(f"{where}: bandwidth must be positive, got {link['bandwidth']!r}")
        if (src, dst) in listed:  # one entry per direction: parallel cables are one link of their total rate
            raise EmulatorError(f"{where}: the link {src} -> {dst} is already links[{listed[src, dst]}]; expected "
                                "each directed link once (give parallel cables as one link of their total bandwidth)")
        listed[src, dst] = i
        g.add_edge(src, dst, bandwidth=bw, latency=lat, efficiency=1.0, cls="custom")
    if not gpus:
        raise EmulatorError(f"{path}: the graph has no gpu nodes")
    topo = Topology(g, gpus, "custom")
    topo.index()
    return topo
