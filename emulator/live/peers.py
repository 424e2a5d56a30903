"""The real ranks of ``emulator live --real K``: a real process group among the K processes.

Each real process (world rank k < K) joins a real ``ProcessGroupGloo`` (CPU) or
``ProcessGroupNCCL`` (CUDA tensors, when CUDA is present) of the K real ranks,
rendezvousing on a ``TCPStore`` at EMULATOR_LIVE_MASTER (host:port) that the
launcher picked. A subgroup of real ranks gets its own real group the first time
one of its collectives runs (its members reach it in the same program order);
all on the same store, under a prefix named after the members.

``exchange`` is how mixed groups agree on their start: each real member hands in its
arrival time and gets the latest, over the real group of the group's real members.
"""
from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

TIMEOUT = timedelta(minutes=10)


class Peers:
    """The local real rank's view of the other real ranks."""

    def __init__(self, rank: int, real: int, master: str) -> None:
        host, _, port = master.rpartition(":")
        self.rank = rank
        self.real = real
        self.store = dist.TCPStore(host, int(port), real, rank == 0, timeout=TIMEOUT)
        self._groups: dict[tuple[tuple[int, ...], str], Any] = {}

    def origin(self) -> float:
        """Real rank 0's ``time.perf_counter()`` once every real rank has joined the store (its
        constructor waits for them): the common origin of the real ranks' clocks."""
        if self.rank == 0:
            self.store.set("emulator-live/t0", repr(time.perf_counter()))
        return float(self.store.get("emulator-live/t0").decode())

    def group(self, members: tuple[int, ...], device: str = "cpu") -> Any:
        """The real process group of ``members`` (world ranks < K, this rank among them)."""
        key = (tuple(sorted(members)), device)
        pg = self._groups.get(key)
        if pg is None:
            ranks = key[0]
            prefix = dist.PrefixStore(f"emulator-live/{device}/" + ",".join(map(str, ranks)), self.store)
            me = ranks.index(self.rank)
            if device == "cuda":
                pg = dist.ProcessGroupNCCL(prefix, me, len(ranks), dist.ProcessGroupNCCL.Options())  # type: ignore[attr-defined]
            else:
                pg = dist.ProcessGroupGloo(prefix, me, len(ranks), TIMEOUT)  # type: ignore[attr-defined]
            self._groups[key] = pg
        return pg

    def exchange(self, members: tuple[int, ...], value: float) -> float:
        """The largest ``value`` over the real ``members`` (a real all-reduce MAX, blocking)."""
        if len(members) < 2:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MAX  # type: ignore[assignment]  # c10d takes the enum value
        self.group(members).allreduce([t], opts).wait()
        return float(t.item())
