"""Processor sharing of one GPU among its concurrent compute streams (pure bookkeeping, no SimPy).

A GPU has one set of SMs and one HBM: compute kernels on several of its streams that run at
the same time share it, they do not each run at full speed (issue #17: a trace with compute
on 3 streams of one GPU ran them 3× faster than the GPU can). The model is egalitarian
processor sharing: with n kernels running, each progresses at 1/n of its full speed, so the
GPU's total work rate never exceeds 1 and a kernel alone runs exactly its full-speed time
(single-stream results are unchanged). Work is measured in seconds at full speed, i.e. the
kernel's duration from ``emulator.devices.gpu`` (slowdown included).

While a communication kernel of the GPU is resident (NCCL holds SMs and HBM bandwidth), the
GPU runs compute at ``speed`` = 1 / the catalog's ``comm_overlap_slowdown`` (the engine sets
it): every running kernel then progresses at speed/n.

Processor sharing is the simplest work-conserving split; a real GPU may overlap a
memory-bound kernel with a compute-bound one better than this (ASSUMPTION: no
calibration row measures concurrent kernels).
"""
from __future__ import annotations

# Work (s at full speed) left by a kernel that finished: the rounding residue of a few
# subtractions of the elapsed share, far below any kernel's duration (≥ 1 ns).
_DONE = 1e-15


class SharedGpu:
    """The running compute kernels of one GPU and the work (s at full speed) each has left."""

    __slots__ = ("jobs", "last", "speed")

    def __init__(self) -> None:
        self.jobs: dict[int, float] = {}  # op → work left, in start order
        self.last = 0.0  # when ``jobs`` was last brought up to date
        self.speed = 1.0  # the GPU's compute speed now (1: full; less while communication is resident)

    def _settle(self, now: float) -> None:
        """Bring every job's work left up to ``now``: each did (now − last)·speed/n of work."""
        n = len(self.jobs)
        if n and now > self.last:
            share = (now - self.last) * self.speed / n
            jobs = self.jobs
            for op in jobs:
                jobs[op] -= share
        self.last = now

    def add(self, now: float, op: int, work: float) -> None:
        """Kernel ``op`` of ``work`` seconds (at full speed) starts at ``now``."""
        self._settle(now)
        self.jobs[op] = work

    def next_end(self) -> float | None:
        """When the next kernel ends if nothing else starts: last + (least work left)·n/speed."""
        if not self.jobs:
            return None
        return self.last + min(self.jobs.values()) * len(self.jobs) / self.speed

    def set_speed(self, now: float, speed: float) -> None:
        """The GPU computes at ``speed`` from ``now`` on (the work done until now at the old one)."""
        self._settle(now)
        self.speed = speed

    def finish(self, now: float) -> list[int]:
        """The kernels that end at ``now`` (the least work left, and any tied with it), in start order."""
        self._settle(now)
        least = min(self.jobs.values())
        done = [op for op, w in self.jobs.items() if w - least <= _DONE]
        for op in done:
            del self.jobs[op]
        return done
