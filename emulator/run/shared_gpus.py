"""Shared GPUs: the kernels running at once on a GPU whose compute runs on several streams.

A rank with one compute stream never runs two kernels at once, and the engine times its
kernels ahead of the clock. Where a rank computes on several streams, or its compute slows
while its communication is resident (the catalog's ``comm_overlap_slowdown``), its kernels go
through a ``emulator.devices.sharing.SharedGpu`` each: they share the GPU, and the next
kernel end is one SimPy timeout, rescheduled (a stale one is ignored) whenever a kernel starts
or the GPU's speed changes.
"""
from __future__ import annotations

from typing import Callable

import simpy

from emulator.devices.sharing import SharedGpu


class SharedGpus:
    """The GPUs whose kernels share them; ``done(finished, now)`` is told of each batch of kernel ends."""

    def __init__(self, env: simpy.Environment, overlap: dict[int, float],
                 done: Callable[[list[int], float], None]) -> None:
        self.env = env
        self.overlap = overlap  # GPU → its compute slowdown while communication is resident
        self.done = done
        self._share: dict[int, SharedGpu] = {}  # world rank → its running kernels
        self._version: dict[int, int] = {}
        self._resident: dict[int, int] = {}  # GPU → its communication ops resident now
        self._counted: set[int] = set()  # the comm ops counted there

    def start(self, gpu: int, i: int, work: float, now: float) -> None:
        """Kernel ``i`` of ``work`` s (at full speed) starts on ``gpu``, sharing it with its running kernels."""
        share = self._of(gpu)
        share.add(now, i, work)
        self._schedule(gpu, share, now)

    def _of(self, gpu: int) -> SharedGpu:
        share = self._share.get(gpu)
        if share is None:
            share = self._share[gpu] = SharedGpu()
        return share

    def _schedule(self, gpu: int, share: SharedGpu, now: float) -> None:
        """(Re)schedule the GPU's next kernel end; an earlier schedule becomes stale."""
        version = self._version.get(gpu, 0) + 1
        self._version[gpu] = version
        at = share.next_end()
        if at is not None:
            self.env.timeout(max(0.0, at - now), (gpu, version)).callbacks.append(self._ended)

    def _ended(self, event: simpy.Event) -> None:
        """A shared GPU's scheduled kernel end (ignored when a later start rescheduled it)."""
        gpu, version = event.value  # type: ignore[misc]  # simpy types every value Optional[Any]
        if self._version[gpu] != version:
            return
        now = self.env.now
        share = self._share[gpu]
        finished = share.finish(now)
        self._schedule(gpu, share, now)
        self.done(finished, now)

    def resident(self, i: int, gpu: int, now: float, delta: int) -> None:
        """Collective ``i`` of ``gpu`` becomes resident (``delta`` 1: issued) or leaves (−1: done).
        While any is resident, a GPU with a ``comm_overlap_slowdown`` f computes at 1/f.

        Resident is the NCCL kernel's whole interval, from its issue (it then spins on its SMs
        waiting for the other members) to its end, as the factor is measured (the kernel's
        interval in a Kineto trace). Collectives only: the factor is measured on them;
        point-to-point kernels run on fewer channels, and a pipeline posts its receive a task
        ahead, so counting them would put nearly all of a stage's compute under a collective's
        factor."""
        f = self.overlap.get(gpu)
        if f is None:
            return
        if delta > 0:
            self._counted.add(i)
        elif i in self._counted:
            self._counted.discard(i)
        else:
            return
        before = self._resident.get(gpu, 0)
        after = self._resident[gpu] = before + delta
        if (before == 0) != (after == 0):
            share = self._of(gpu)
            share.set_speed(now, 1.0 / f if after else 1.0)
            self._schedule(gpu, share, now)
