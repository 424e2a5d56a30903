"""Executors: run a function over many items and yield each result as it finishes.

An executor never touches the results store; the caller (one process) writes each
result as it arrives, so parallelism never costs durability.

- :class:`LocalExecutor` — ``jobs == 1`` runs in this process, in order; ``jobs > 1``
  uses a pool of worker processes (``concurrent.futures.ProcessPoolExecutor`` with the
  ``forkserver`` start method where the platform has it, else ``spawn``: never a plain
  fork of a parent that holds an open SQLite connection).
- :class:`DaskExecutor` — a dask.distributed cluster (``tcp://scheduler:8786``, or a
  ``Client``); futures are collected with ``as_completed``.

Items are sent in batches of ``batch`` to amortise the per-task overhead; results
still come back one item at a time. ``fn`` must be a module-level function
(picklable); it should catch the errors it wants recorded, since any exception it
raises stops the whole run.
"""
from __future__ import annotations

import multiprocessing
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any, Callable, Iterator, Protocol, Sequence

from emulator.errors import EmulatorError

Fn = Callable[[Any], Any]


class Executor(Protocol):
    def run(self, fn: Fn, items: Sequence[Any]) -> Iterator[tuple[int, Any]]:
        """Yield (index into items, fn(item)) in completion order."""
        ...


def run_batch(fn: Fn, batch: list[tuple[int, Any]]) -> list[tuple[int, Any]]:
    """Worker side: fn over one batch of (index, item)."""
    return [(i, fn(item)) for i, item in batch]


def batches(items: Sequence[Any], size: int) -> list[list[tuple[int, Any]]]:
    """[(index, item)] in consecutive groups of ``size`` (the last may be shorter)."""
    size = max(1, size)
    indexed = list(enumerate(items))
    return [indexed[i:i + size] for i in range(0, len(indexed), size)]


def auto_batch(n: int, workers: int) -> int:
    """A batch size giving each worker about 8 batches, at most 8 items each."""
    return max(1, min(8, n // max(1, 8 * workers)))


def _context() -> multiprocessing.context.BaseContext:
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


class LocalExecutor:
    """This process (jobs=1) or a pool of ``jobs`` worker processes."""

    def __init__(self, jobs: int = 1, batch: int | None = None) -> None:
        if jobs < 1:
            raise EmulatorError(f"--jobs: expected a positive number of worker processes, got {jobs}")
        self.jobs = jobs
        self.batch = batch

    def run(self, fn: Fn, items: Sequence[Any]) -> Iterator[tuple[int, Any]]:
        if not items:
            return
        if self.jobs == 1:
            for i, item in enumerate(items):
                yield i, fn(item)
            return
        workers = min(self.jobs, len(items))
        size = self.batch or auto_batch(len(items), workers)
        pool = ProcessPoolExecutor(max_workers=workers, mp_context=_context())
        try:
            pending = {pool.submit(run_batch, fn, b) for b in batches(items, size)}
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    yield from fut.result()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


class DaskExecutor:
    """A dask.distributed cluster, by scheduler address or an existing ``Client``."""

    def __init__(self, address: Any, batch: int | None = None, timeout: str = "10s") -> None:
        try:
            from distributed import Client
        except ImportError:
            raise EmulatorError("--dask needs dask.distributed: pip install 'emulator[dask]' "
                                "(or pip install 'dask[distributed]')") from None
        self.batch = batch
        self.own = not isinstance(address, Client)
        if self.own:
            try:
                self.client = Client(address, timeout=timeout)
            except (OSError, TimeoutError, ValueError) as exc:
                raise EmulatorError(f"--dask {address}: cannot reach the Dask scheduler ({exc})") from None
        else:
            self.client = address

    def close(self) -> None:
        if self.own:
            self.client.close()

    def run(self, fn: Fn, items: Sequence[Any]) -> Iterator[tuple[int, Any]]:
        from distributed import as_completed

        if not items:
            return
        workers = max(1, sum(self.client.nthreads().values()))
        size = self.batch or auto_batch(len(items), workers)
        futures = [self.client.submit(run_batch, fn, b, pure=False) for b in batches(items, size)]
        try:
            for fut in as_completed(futures):
                yield from fut.result()
        finally:
            self.client.cancel([f for f in futures if not f.done()])
