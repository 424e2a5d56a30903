"""Flow plans: what a collective or a transfer asks of the fabric, before it runs.

A plan is a list of phases; a phase is a list of flows that start together; the next
phase starts when every flow of the phase is done. A flow is (links, weights, volume
per byte of the buffer S, latency). The collective algorithms (collectives.py) make
plans, link compression (compression.py) rewrites them, the engine hands their flows
to the fabric. Pure data: no SimPy.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FlowSpec:
    """One flow of a plan: each link crossed ``weights[i]`` times, ``volume`` bytes per byte of S."""

    links: tuple[int, ...]
    weights: tuple[float, ...]
    volume: float  # bytes moved per byte of S
    latency: float  # s


Plan = list[list[FlowSpec]]  # phases of flows
