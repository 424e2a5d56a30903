"""The names of a cluster: ``emulator topology SCENARIO`` lists its GPUs, NICs, switches and links.

These are the names that ``cluster.overrides`` targets (emulator/run/faults.py resolves them
against the same built topology): ``gpu:R`` and ``node:N`` for a slowdown; a link ``A->B``, a
cable ``A<->B`` (both directions) or a node name (every link touching it) for ``link_degrade``
and ``link_fail``. The topology is the one a run builds (``network.topology.build_topology``),
so a name listed here is a name a run accepts.

Links are grouped by class (nvlink, pcie, nic, fabric, custom) and by their rates: each group
gives its count, raw line rate, efficiency (the achieved fraction; the run uses rate ×
efficiency), and latency. A full-duplex cable (both directions with the same attributes) is
listed once as ``A<->B``; a one-way link (a custom graph may have them) as ``A->B``.
"""
from __future__ import annotations

import re
from typing import Any

from emulator.network.topology import Layout, Topology, build_topology
from emulator.scenario.spec import Scenario

KINDS = ("gpu", "nic", "switch")
_NUMBERED = re.compile(r"^(?P<prefix>.*?)(?P<num>\d+)$")


def _edge_data(topo: Topology, u: str, v: str) -> dict[str, Any]:
    data: dict[str, Any] = topo.source.edges[u, v] if isinstance(topo.source, Layout) else topo.graph.edges[u, v]
    return data


def listing(sc: Scenario) -> dict[str, Any]:
    """The cluster's named nodes and links, as plain data (``--json`` prints it as it is)."""
    topo = build_topology(sc.cluster)
    nodes: dict[str, list[dict[str, Any]]] = {k: [] for k in KINDS}
    rank_of = {name: r for r, name in enumerate(topo.gpus)}  # rank order (a custom graph: its file's order)
    g = topo.server_gpus or topo.gpus_per_node  # GPUs of the server `node:N` names (faults._ranks)
    for name, data in topo.node_items():
        kind = str(data.get("kind", "switch"))
        entry: dict[str, Any] = {"name": name}
        if kind == "gpu" and name in rank_of:
            entry["rank"] = rank_of[name]
            if g:
                entry["node"] = rank_of[name] // g
        nodes.setdefault(kind, []).append(entry)
    links = []
    # in the order the builders laid them out (gpu2 before gpu10); a custom graph: its file's order
    edges = list(topo.source.edges) if isinstance(topo.source, Layout) else list(topo.graph.edges())
    for u, v in edges:
        d = _edge_data(topo, u, v)
        links.append({"name": f"{u}->{v}", "src": u, "dst": v, "class": str(d.get("cls", "custom")),
                      "bandwidth_B_per_s": float(d["bandwidth"]), "efficiency": float(d.get("efficiency", 1.0)),
                      "latency_s": float(d["latency"])})
    return {"scenario": sc.name, "fabric": topo.kind, "gpus": nodes.pop("gpu"), "nics": nodes.pop("nic"),
            "switches": nodes.pop("switch"), "other_nodes": [e for rest in nodes.values() for e in rest],
            "links": links}


def _ranges(names: list[str]) -> list[str]:
    """Names with consecutive numbers folded: gpu0, gpu1, gpu2 → ``gpu0..gpu2``."""
    out: list[str] = []
    run: list[tuple[str, int, str]] = []

    def flush() -> None:
        if len(run) > 2:
            out.append(f"{run[0][2]}..{run[-1][2]}")
        else:
            out.extend(r[2] for r in run)
        run.clear()

    for name in names:
        m = _NUMBERED.match(name)
        if m is None:
            flush()
            out.append(name)
            continue
        prefix, num = m.group("prefix"), int(m.group("num"))
        if run and (prefix != run[-1][0] or num != run[-1][1] + 1):
            flush()
        run.append((prefix, num, name))
    flush()
    return out


def _cables(links: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(name, link) per cable: a link and its reverse with the same attributes as one ``A<->B``."""
    attrs = ("class", "bandwidth_B_per_s", "efficiency", "latency_s")
    by_pair = {(lk["src"], lk["dst"]): lk for lk in links}
    out, seen = [], set()
    for lk in links:
        pair = (lk["src"], lk["dst"])
        if pair in seen:
            continue
        back = by_pair.get((lk["dst"], lk["src"]))
        if back is not None and all(back[a] == lk[a] for a in attrs):
            seen.add((lk["dst"], lk["src"]))
            out.append((f"{lk['src']}<->{lk['dst']}", lk))
        else:
            out.append((lk["name"], lk))
    return out


def _rate(bps: float) -> str:
    return f"{bps * 8 / 1e9:g} Gb/s ({bps / 1e9:g} GB/s)"


def listing_text(data: dict[str, Any]) -> str:
    """The listing as a person reads it: nodes by kind with counts, then links by class and rate."""
    lines = [f"# {data['scenario']}: fabric {data['fabric']}, {len(data['gpus'])} GPUs, {len(data['nics'])} NICs, "
             f"{len(data['switches'])} switch{'es' * (len(data['switches']) != 1)}, {len(data['links'])} links "
             "(one direction each)",
             "# cluster.overrides targets: 'gpu:R' or 'node:N' (gpu_slowdown); a link 'A->B', a cable 'A<->B' or a "
             "node name, every link touching it (link_degrade, link_fail)"]
    for title, key in (("GPUs", "gpus"), ("NICs", "nics"), ("switches", "switches"), ("other nodes", "other_nodes")):
        entries = data[key]
        if not entries:
            continue
        lines.append(f"{title} ({len(entries)}): " + ", ".join(_ranges([e["name"] for e in entries])))
    groups: dict[tuple[str, float, float, float], list[str]] = {}
    for name, lk in _cables(data["links"]):
        groups.setdefault((lk["class"], lk["bandwidth_B_per_s"], lk["efficiency"], lk["latency_s"]), []).append(name)
    lines.append("links by class:")
    for (cls, bw, eff, lat), names in sorted(groups.items()):
        ways = sum(2 if "<->" in n else 1 for n in names)
        lines.append(f"  {cls} ({ways} links, {len(names)} cables): {_rate(bw)} × efficiency {eff:.4g}, "
                     f"latency {lat * 1e6:g} us")
        for name in names:
            lines.append(f"    {name}")
    return "\n".join(lines)
