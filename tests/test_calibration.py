"""Calibration: the compute model reproduces ../shared/calibration/layers.csv.

Each row is one GPT-22B layer (h 6144, 64 heads, s 2048, b 4) on 8 A100 with tp 8; the
measured forward and backward times include the TP communication, costed here as the
engine does on dgx-a100 uncontended (nccl.csv): ring all-reduce 6.05 us + 2(n−1)·1.975 us
+ 2(n−1)/n·S/230 GB/s, all-gather and reduce-scatter 6.05 us + (n−1)·1.975 us + (n−1)/n·S/230 GB/s.
"""
import csv
import itertools
from pathlib import Path

import pytest

from emulator.devices import compute
from emulator.scenario import GpuSpec, ModelSpec
from emulator.workload import layer as Ly

CSV = Path(__file__).resolve().parents[2] / "shared" / "calibration" / "layers.csv"  # ../shared beside the repo
A100 = GpuSpec("A100-SXM4-80GB", 312e12, 2039e9, 80 * 2**30, 4e-6)  # hardware.csv A100-SXM4-80GB rows


def tp_comm_time(c: Ly.Comm, n: int = 8) -> float:
    if c.collective == "all_reduce":
        return 6.05e-6 + 2 * (n - 1) * 1.975e-6 + 2 * (n - 1) / n * c.bytes / 230e9
    return 6.05e-6 + (n - 1) * 1.975e-6 + (n - 1) / n * c.bytes / 230e9


def rows() -> list[dict]:
    if CSV.exists():
        with CSV.open() as f:
            return list(csv.DictReader(f))
    # The five rows of layers.csv, for machines without ../shared.
    data = [("no", "none", 7.7, 11.9), ("yes", "none", 7.2, 11.8), ("no", "full", 7.7, 19.5),
            ("no", "selective", 7.7, 13.2), ("yes", "selective", 7.2, 13.1)]
    return [dict(layers=48, hidden=6144, heads=64, seq_len=2048, vocab=51200, tp=8, micro_batch=4,
                 sequence_parallel=sp, recompute=rc, forward_ms=f, backward_ms=b) for sp, rc, f, b in data]


def predict(row: dict) -> tuple[float, float]:
    m = ModelSpec(layers=int(row["layers"]), hidden=int(row["hidden"]), heads=int(row["heads"]),
                  seq_len=int(row["seq_len"]), vocab=int(row["vocab"]))
    L = Ly.layer_shape(m, int(row["micro_batch"]), t=int(row["tp"]), sp=row["sequence_parallel"] == "yes")
    fwd = Ly.pass_time(Ly.forward_steps(L), A100, tp_comm_time)
    bwd = Ly.pass_time(Ly.backward_steps(L, row["recompute"]), A100, tp_comm_time)
    return fwd * 1e3, bwd * 1e3


def errors() -> list[float]:
    out = []
    for row in rows():
        f, b = predict(row)
        out += [f / float(row["forward_ms"]) - 1, b / float(row["backward_ms"]) - 1]
    return out


@pytest.mark.parametrize("row", rows(), ids=lambda r: f"sp={r['sequence_parallel']},rc={r['recompute']}")
def test_every_row_within_5_percent(row):
    f, b = predict(row)
    assert f == pytest.approx(float(row["forward_ms"]), rel=0.05)
    assert b == pytest.approx(float(row["backward_ms"]), rel=0.05)


def test_all_rows_within_3_percent():
    # what the fit achieves (worst row: selective backward, about −2.9%)
    assert max(abs(e) for e in errors()) < 0.03


def test_fit_is_reproducible(monkeypatch):
    """Least squares over E_GEMM_MAX (0.60–0.80, step 0.005) and E_MEM (0.80–0.90, step 0.01,
    bounded above at 0.90) with K_HALF fixed lands on compute.py's constants."""
    best = None
    for eg, em in itertools.product([0.60 + 0.005 * i for i in range(41)], [0.80 + 0.01 * i for i in range(11)]):
        monkeypatch.setattr(compute, "E_GEMM_MAX", eg)
        monkeypatch.setattr(compute, "E_MEM", em)
        score = sum(e * e for e in errors())
        if best is None or score < best[0]:
            best = (score, eg, em)
    assert best[1] == pytest.approx(0.695, abs=1e-9)
    assert best[2] == pytest.approx(0.90, abs=1e-9)


def test_sequence_parallel_saves_forward_time():
    # The measured SP saving (7.7 → 7.2 ms) comes from sharding the layernorm and
    # bias-dropout-add passes by t: the model reproduces a saving of 0.4–0.6 ms.
    r = rows()
    saving = predict(r[0])[0] - predict(r[1])[0]
    assert 0.4 < saving < 0.6
