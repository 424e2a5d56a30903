"""Fidelity of live emulation against a real 4-process gloo run on this machine (slow: opt-in).

Runs benchmarks/live_gloo_calibration.py end to end, as a user would on the day: first it
calibrates the gloo loopback transport under load into a temporary scenario (a calibration
from an earlier session is stale: this shared 2-core machine's loaded gloo latency drifts by up
to 50% within an hour), then it compares examples/train_mlp.py at two model sizes (hidden 256
and 512: 0.53 and 2.1 MB of gradients) as the real job (4 gloo processes) and as 1 real process
+ 3 emulated ranks on that scenario, beside 3 compute-only copies of the script so the local
rank's compute shares the 2 cores as in the real run. Single runs jitter by ±10-20%, so each
side runs 5 times (100 iterations), interleaved, and the medians are compared.

Measured on 2026-12-02, three comparisons, each after its own calibration (README, Live
emulation): hidden 256 / 512 at −5.5% / −8.6%, −4.6% / −2.7%, and in this test's own run
−10.3% / −10.3% (failed, just outside); in the next session, on a slower spell of the machine,
−2.4% / −14.4% (failed at 512). The emulated job runs ~6% fast with a spread of several points
between runs, so this check passes on most runs, not all. Takes 4-7 minutes; set EMULATOR_SLOW=1.
"""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.skipif(not os.environ.get("EMULATOR_SLOW"),
                                reason="slow (about 4 minutes, real gloo processes): set EMULATOR_SLOW=1")


def test_emulated_iteration_time_within_10_percent_of_real_gloo(tmp_path):
    pytest.importorskip("torch", reason="emulator live needs PyTorch (pip install '.[live]')")
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import live_gloo_calibration as bench

    scenario = str(tmp_path / "live-gloo-loopback.yaml")
    cal = bench.calibrate(scenario=scenario)
    assert cal["alpha_s"] > 0 and cal["bandwidth_B_per_s"] > 0, cal
    # median of 5 interleaved runs of 100 iterations each side; error = emulated / real − 1
    rows = bench.fidelity(100, [256, 512], reps=5, scenario=scenario)
    errors = {r["hidden"]: r["contended_error"] for r in rows}
    assert all(abs(e) < 0.10 for e in errors.values()), errors
