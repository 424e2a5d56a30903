"""Executors: in-process, process pool and Dask give the same results; batching."""
import math

import pytest
from test_sweep import degrade, no_wall, write_tiny

from emulator.cli import main
from emulator.errors import EmulatorError
from emulator.studies.executor import LocalExecutor, auto_batch, batches, run_batch
from emulator.studies.store import ResultStore


def test_batches_and_auto_batch():
    assert batches("abcde", 2) == [[(0, "a"), (1, "b")], [(2, "c"), (3, "d")], [(4, "e")]]
    assert run_batch(math.isqrt, [(3, 16), (4, 99)]) == [(3, 4), (4, 9)]  # isqrt(16) = 4, isqrt(99) = 9
    # about 8 batches per worker, 1..8 items each: 200 // (8 × 2) = 12 → 8; 50 // 16 = 3; 5 // 16 = 0 → 1
    assert (auto_batch(200, 2), auto_batch(50, 2), auto_batch(5, 2)) == (8, 3, 1)


def test_local_executor_in_process_keeps_order():
    assert list(LocalExecutor(1).run(math.isqrt, [0, 1, 4, 9])) == [(0, 0), (1, 1), (2, 2), (3, 3)]
    with pytest.raises(EmulatorError, match="--jobs"):
        LocalExecutor(0)


def test_process_pool_returns_every_result_once():
    items = list(range(0, 4000, 7))
    got = dict(LocalExecutor(2, batch=16).run(math.isqrt, items))
    assert got == {i: math.isqrt(x) for i, x in enumerate(items)}


def _sweep(tmp_path, db, extra):
    path = write_tiny(str(tmp_path))
    values = ",".join(degrade(f) for f in (1, 0.5, 0.25, 0.125, 0.0625, 0.03125))
    assert main(["sweep", path, "--vary", f"cluster.overrides={values}", "--db", str(tmp_path / db), *extra]) == 0
    with ResultStore(str(tmp_path / db)) as store:
        return {r.key: (r.varied, no_wall(r.summary)) for r in store.rows()}


def test_jobs_2_equals_jobs_1(tmp_path):
    one = _sweep(tmp_path, "one.sqlite", ["--jobs", "1"])
    two = _sweep(tmp_path, "two.sqlite", ["--jobs", "2"])
    assert len(one) == 6 and one == two


def test_dask_path_equals_local_path(tmp_path):
    distributed = pytest.importorskip("distributed", reason="dask.distributed is not installed (pip install 'emulator[dask]')")
    local = _sweep(tmp_path, "local.sqlite", [])
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cluster:
        remote = _sweep(tmp_path, "dask.sqlite", ["--dask", cluster.scheduler_address])
        # resume through Dask too: nothing left to run
        again = _sweep(tmp_path, "dask.sqlite", ["--dask", cluster.scheduler_address])
    assert len(local) == 6 and remote == local and again == local


def test_unreachable_dask_scheduler_is_a_clear_error():
    pytest.importorskip("distributed", reason="dask.distributed is not installed")
    from emulator.studies.executor import DaskExecutor

    with pytest.raises(EmulatorError, match="cannot reach the Dask scheduler"):
        DaskExecutor("tcp://127.0.0.1:1", timeout="1s")
