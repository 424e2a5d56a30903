"""The network layer: topologies, routes, flow plans and the max-min fair fabric.

Owns the topology builders (topology.py), routing with ECMP (routing.py), flow plans
(flows.py), the collective algorithms that make them (collectives.py; NCCL's double
binary tree in tree.py, NCCL's tuning model for ``auto`` in tuning.py), link
compression (compression.py) and the fabric, the only SimPy code here: the flow-level fabric
(flow_fabric.py) and the fabric that runs flow plans on it, ahead of the clock where their links are free
(fabric.py).

May import: emulator.errors, emulator.program (Fold), emulator.scenario (specs, units),
and its own modules. Never workload/, the run stage or anything above.
"""
