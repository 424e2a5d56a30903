"""The arrival-skew model of a live run's emulated ranks: how late a collective starts after a rank arrives.

Pure functions (no torch, no SimPy). Real ranks never arrive at a collective together:
time-slicing and OS noise spread their arrivals, the more the longer they computed since
they last synchronised. The model (measured by ``benchmarks/live_skew_calibration.py``):
each rank's arrival spreads independently around the mean with standard deviation

    σ(c) = a + b·c,    c = the compute since the last synchronisation (s),

so a collective of n ranks starts, in expectation, e_n·σ(c) after a given rank arrives,
where e_n = E[max of n standard normals] (e_1 = 0, e_2 = 1/√π ≈ 0.5642, e_3 = 3/(2√π) ≈ 0.8463,
e_4 ≈ 1.0294; Tippett 1925, Biometrika 17, table of the mean range).

With k of the n members real (``emulator live --real K``), their arrivals are measured and the
latest of them is already in the start time; the n − k emulated members add the rest of the
expected maximum: each arrives ``lag`` = (e_n − e_k)·σ(c) after its mirror. With one real
rank, e_1 = 0 and the lag is e_n·σ(c). Deterministic: no random draws.
"""
from __future__ import annotations

import math
from functools import lru_cache


@lru_cache(maxsize=None)
def expected_max(n: int) -> float:
    """E[max of n independent standard normals] (0 for n ≤ 1), by quadrature of n·x·φ(x)·Φ(x)^(n−1)."""
    if n <= 1:
        return 0.0
    lo, hi, steps = -10.0, 10.0 + math.sqrt(2.0 * math.log(n)), 8000
    h = (hi - lo) / steps
    total = 0.0
    for i in range(steps + 1):  # Simpson's rule: weights 1, 4, 2, 4, ..., 4, 1
        x = lo + i * h
        pdf = math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
        cdf = 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))
        f = n * x * pdf * cdf ** (n - 1)
        total += f * (1 if i in (0, steps) else 4 if i % 2 else 2)
    return total * h / 3.0


def spread(base_s: float, slope: float, compute_s: float) -> float:
    """σ(c) = a + b·c (s): the standard deviation of a rank's arrival after ``compute_s`` of compute."""
    return base_s + slope * max(compute_s, 0.0)


def lag(base_s: float, slope: float, compute_s: float, members: int, real_members: int = 1) -> float:
    """How long after its mirror an emulated member of a collective arrives (s): (e_n − e_k)·σ(c),
    n = ``members``, k = ``real_members`` (whose own skew is measured); 0 when no member is emulated."""
    if members <= real_members:
        return 0.0
    return (expected_max(members) - expected_max(max(real_members, 1))) * spread(base_s, slope, compute_s)
