"""NVLink domains: the network's view of a cluster whose NVLink switches span several nodes.

A GB200 or GB300 NVL72 rack is 18 compute trays of 4 GPUs (a scenario's node is one tray,
``cluster.nodes`` counts trays) whose 72 GPUs all reach each other through the rack's NVLink
switch trays at the full NVLink 5 rate: one NVLink domain (``cluster.node.nvlink_domain``). The
NICs stay per tray (4 per tray, one per GPU) and join the domains.

The network sees each domain as one node: ``network_cluster`` turns a cluster of trays into one
of domains, with ``nvlink_domain`` GPUs and (trays per domain) × ``nics`` NICs each. So every key
that is per node inside the network is per domain: ``intra_bandwidth`` and ``intra_efficiency``
(each GPU's port on the domain's switch), ``intra_latency``, ``step_latency_intra`` (one step
between two GPUs of the domain, also of different trays), ``nvls_busbw`` (NVLink SHARP over the
domain's switches), and the ``hierarchical`` and ``tree`` all-reduces count the domain as
"inside" (reduce-scatter inside the domain, the NICs between domains). This is NCCL's own view
with multi-node NVLink (MNNVL): it fuses the topologies of every rank of an NVLink clique into one
system, as it does for the GPUs of one host (NCCL 5067397c src/graph/topo.cc, ncclTopoGetSystem:
"if (comm->MNNVL) { // MNNVL clique support nLocalRanks = comm->clique.size; ...}"), and counts
NVLink domains as its nodes (src/init.cc, initNvlDomainInfo: ``nNvlDomains = comm->nNodes``), so
its rings, trees and NVLS run inside the domain over NVLink and use the NICs only between domains.

Ranks fill trays in order and trays fill domains in order: rank r is on tray r // gpus_per_node
and in domain r // nvlink_domain. A cluster need not fill its last domain (20 trays with
nvlink_domain 72: one domain of 72 GPUs and one of 8): the last one has the GPUs that remain.
The fabric's ``leaf_size`` counts trays; in the network view a leaf holds whole domains, the
trays rounded up to domains (at least one).
"""
from __future__ import annotations

import dataclasses
import math

from emulator.scenario.spec import ClusterSpec, NodeSpec


def domain_size(node: NodeSpec) -> int:
    """GPUs of one NVLink domain: ``nvlink_domain``, or the node's own GPUs."""
    return node.domain


def nodes_per_domain(node: NodeSpec) -> int:
    """Nodes (trays) of one NVLink domain: 18 in a GB200 NVL72 rack, 1 for an NVSwitch node."""
    return max(1, node.domain // node.gpus_per_node)


def spans_nodes(node: NodeSpec | None) -> bool:
    """Whether ``node``'s NVLink domain holds more than one node (an NVL72 rack)."""
    return node is not None and node.domain > node.gpus_per_node


def network_node(node: NodeSpec) -> NodeSpec:
    """One NVLink domain as one node: ``nvlink_domain`` GPUs and the NICs of all its trays."""
    if not spans_nodes(node):
        return node
    k = nodes_per_domain(node)
    return dataclasses.replace(node, gpus_per_node=node.domain, nics=node.nics * k)


def domains(cluster: ClusterSpec) -> int:
    """NVLink domains the cluster's GPUs occupy (the last one may be partial)."""
    node = cluster.node
    if node is None:
        return cluster.nodes
    return math.ceil(cluster.nodes * node.gpus_per_node / node.domain)


def network_cluster(cluster: ClusterSpec) -> ClusterSpec:
    """The cluster as the network sees it: one node per NVLink domain (itself where a domain is a node)."""
    node = cluster.node
    if node is None or not spans_nodes(node):
        return cluster
    k = nodes_per_domain(node)
    fabric = dataclasses.replace(cluster.fabric, leaf_size=max(1, math.ceil(cluster.fabric.leaf_size / k)))
    return dataclasses.replace(cluster, nodes=domains(cluster), node=network_node(node), fabric=fabric)
