"""GPUs: per-rank devices whose streams are in-order lanes.

A stream holds at most one running op; the next op of the stream is released when
the previous one ends (the engine counts this as one of the op's prerequisites).
This module owns what a GPU knows about itself: its spec and its slowdown factor
(a straggler runs every compute op ``slowdown`` times longer), and the time of a
compute op from the pure cost functions in ``emulator.devices.compute``.
"""
from __future__ import annotations

from emulator.program import OFF_SM_STREAMS, Op
from emulator.scenario.spec import GpuSpec


class Gpu:
    """One simulated GPU (rank)."""

    __slots__ = ("rank", "spec", "slowdown")

    def __init__(self, rank: int, spec: GpuSpec | None, slowdown: float = 1.0) -> None:
        self.rank = rank
        self.spec = spec
        self.slowdown = slowdown

    def compute_time(self, op: Op) -> float:
        """Duration of a compute op: its fixed duration, else the roofline of its flops/bytes."""
        if op.duration is not None:
            if op.stream in OFF_SM_STREAMS:  # the host's time, or a copy engine's: not the GPU's SMs
                return op.duration
            return op.duration * self.slowdown
        if self.spec is None:
            raise ValueError(f"op {op.id} (rank {op.rank}) gives flops/bytes but the cluster names no GPU type "
                             "to cost them; give the op a duration or the cluster a gpu")
        from emulator.devices.compute import roofline_time

        return roofline_time(op.flops, op.bytes, self.spec) * self.slowdown
