"""Live emulation with several real ranks (`--real K`), stragglers on emulated ranks, and overrides
applied or refused by name."""
import json
import os
import subprocess
import sys

import pytest
from helpers import HandClock, custom_scenario, star

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable


# -- pure parts -----------------------------------------------------------------------------
def test_mirror_rules():
    from emulator.live.mirror import is_real, mirrors, real_members, weights

    # K = 2 real ranks in a world of 4: the emulated 2, 3 mirror 0, 1 (r mod K)
    assert mirrors((0, 1, 2, 3), 2) == {0: 0, 1: 1, 2: 0, 3: 1}
    assert weights((0, 1, 2, 3), 2) == {0: 2, 1: 2}
    # a DP stride of a tp=2 grid on 8 ranks with K = 2 (one TP group real): only rank 0 is real in (0, 2, 4, 6)
    assert real_members((0, 2, 4, 6), 2) == (0,)
    assert weights((0, 2, 4, 6), 2) == {0: 4}
    assert is_real((0, 1), 2) and not is_real((0, 2), 2)
    with pytest.raises(ValueError, match="no real member"):
        mirrors((2, 3), 2)


def test_straggler_on_an_emulated_rank_delays_the_collectives_it_joins(tmp_path):
    from emulator.live.cost import CommCost
    from emulator.live.session import Session

    clock = HandClock()
    s = Session(clock, CommCost(custom_scenario(star(tmp_path, 4, bw=1e9, lat=1e-5)), 4), 4, slow={2: 3.0})
    # a ring all-reduce of 1 MB on a star of 4 (1 GB/s, 10 us per link): 2*3*20 us + 1.5 * 1e6/1e9 = 1.62 ms
    comm = 1.62e-3
    clock.compute(0.010)
    a = s.issue("all_reduce", (0, 1, 2, 3), 1e6)
    # rank 2 computes 3 x 10 ms: it arrives 20 ms after the local rank; the all-reduce starts then
    assert (a.issue_s, a.start_s, a.end_s) == (pytest.approx(0.010), pytest.approx(0.030), pytest.approx(0.030 + comm))
    s.sync("backward")
    assert clock.now() == pytest.approx(0.030 + comm) and s.lag[2] == pytest.approx(0.0)  # level after the wait
    # the next iteration: again 3 x the compute + the all-reduce = 31.62 ms (emulator run: the straggler's
    # compute, then the all-reduce), against 11.62 ms without it
    clock.compute(0.010)
    b = s.issue("all_reduce", (0, 1, 2, 3), 1e6)
    s.sync("backward")
    assert b.end_s - a.end_s == pytest.approx(0.030 + comm)
    # a group without rank 2 does not wait for it; rank 2 keeps its lag (10 ms x 2 = 20 ms)
    clock.compute(0.010)
    c = s.issue("all_reduce", (0, 1), 1e6)
    assert c.start_s == pytest.approx(c.issue_s)
    s.sync("x")
    assert s.lag[2] == pytest.approx(0.020)
    # compute between the issue and the wait overlaps the collective; the straggler does it 3x slower after
    # its own arrival: issued at t with lag 20 + 2 x 10 = 40 ms, rank 2 arrives at t + 40 ms; the local rank
    # computes 5 ms, then waits until the end (t + 40 + 1.62 ms); rank 2 is done at t + 40 + 15 ms,
    # so it lags 15 - 1.62 = 13.38 ms behind
    clock.compute(0.010)
    d = s.issue("all_reduce", (0, 1, 2, 3), 1e6)
    assert d.start_s - d.issue_s == pytest.approx(0.040)
    clock.compute(0.005)
    s.sync("backward")
    assert clock.now() == pytest.approx(d.end_s)
    assert s.lag[2] == pytest.approx(0.015 - comm)


class _WakingClock(HandClock):
    """A hand clock whose waits end ``wake`` late, as a process wakes after its wait (the wall
    clock's overshoot, the arrival exchange among the real ranks)."""

    def __init__(self, wake):
        super().__init__()
        self.wake = wake

    def advance_to(self, t):
        return super().advance_to(t + self.wake)


def test_a_straggler_pays_its_mirrors_wake_up(tmp_path):
    # The all-reduce of above (1.62 ms); rank 2 computes 3x. Every wait ends 1 ms after its
    # collective. Iteration 1: compute 10 ms, rank 2 arrives at 30 ms, the all-reduce ends at
    # 31.62 ms, the local rank goes on at 32.62 ms, and so does rank 2, its copy: lag 0 (going on
    # at 31.62 ms it would lag -1 ms). Iteration 2: the local rank computes 10 ms (to 42.62 ms),
    # rank 2 30 ms, so it arrives at 32.62 + 30 = 62.62 ms: 20 ms = (3 - 1) x 10 ms after its mirror,
    # the lengthening `emulator run` gives (its ranks pay no wake-up, with the straggler or without).
    from emulator.live.cost import CommCost
    from emulator.live.session import Session

    clock = _WakingClock(0.001)
    s = Session(clock, CommCost(custom_scenario(star(tmp_path, 4, bw=1e9, lat=1e-5)), 4), 4, slow={2: 3.0})
    clock.compute(0.010)
    a = s.issue("all_reduce", (0, 1, 2, 3), 1e6)
    s.sync("backward")
    assert a.end_s == pytest.approx(0.03162) and clock.now() == pytest.approx(0.03262)
    assert s.lag[2] == pytest.approx(0.0)
    clock.compute(0.010)
    b = s.issue("all_reduce", (0, 1, 2, 3), 1e6)
    assert (b.issue_s, b.start_s) == (pytest.approx(0.04262), pytest.approx(0.06262))


class _OvershootClock(HandClock):
    """A hand clock whose sleeps wake ``wake`` late but report the blocked time asked for, as the
    wall clock does (``Clock.advance_to``): the overshoot then counts as the rank's own time."""

    def __init__(self, wake):
        super().__init__()
        self.wake = wake

    def advance_to(self, t):
        gap = t - self.now()
        super().advance_to(t + self.wake)
        return max(gap, 0.0)


def test_a_wait_records_when_the_rank_went_on(tmp_path):
    # compute 10 ms, the all-reduce of 1 MB on the star (1.62 ms) ends at 11.62 ms, the rank wakes
    # 0.5 ms later: the wait is 10 -> 11.62 ms, and the rank went on at 12.12 ms (what
    # benchmarks/live_real_check.py's phases keep apart from the compute a straggler stretches)
    from emulator.live.cost import CommCost
    from emulator.live.session import Session

    clock = _OvershootClock(0.0005)
    s = Session(clock, CommCost(custom_scenario(star(tmp_path, 4, bw=1e9, lat=1e-5)), 4), 4)
    clock.compute(0.010)
    s.issue("all_reduce", (0, 1, 2, 3), 1e6)
    s.sync("backward")
    (w,) = s.to_dict()["waits"]
    assert (w["start_s"], w["end_s"], w["resumed_s"]) == (pytest.approx(0.010), pytest.approx(0.01162),
                                                          pytest.approx(0.01212))


def _scenario(tmp_path, overrides):
    graph = star(tmp_path, 4, bw=1e9, lat=1e-5)
    path = tmp_path / "s.yaml"
    path.write_text(f"name: star\ncluster:\n  fabric: {{kind: custom, graph: {graph}}}\n  overrides:\n"
                    + "".join(f"    - {o}\n" for o in overrides))
    return str(path)


def test_the_pace_hint_marks_each_end_of_a_wait(tmp_path):
    """EMULATOR_LIVE_PACE (benchmarks' in-step neighbours): one datagram each time the local rank
    ends a wait on communication, none while it computes, and no error when nobody listens."""
    import socket
    import tempfile

    from emulator.live.cost import CommCost
    from emulator.live.run import _pace
    from emulator.live.session import Session

    clock = HandClock()
    s = Session(clock, CommCost(custom_scenario(star(tmp_path, 4, bw=1e9, lat=1e-5)), 4), 4)
    ends: list[float] = []
    s.on_synced.append(lambda: ends.append(clock.now()))
    clock.compute(0.010)
    s.issue("all_reduce", (0, 1, 2, 3), 1e6)
    assert ends == []  # issued, not waited on
    s.sync("backward")
    # the ring all-reduce of 1 MB on a star of 4 (1 GB/s, 10 us a link) ends at
    # 10 ms + 2*3*20 us + 1.5 * 1e6 / 1e9 s = 10 + 0.12 + 1.5 = 11.62 ms: the one end of a wait
    assert ends == pytest.approx([0.01162], rel=1e-9)
    with tempfile.TemporaryDirectory(dir="/tmp") as d:  # a short path: AF_UNIX allows ~100 bytes
        path = os.path.join(d, "rank0")
        _pace(path)()  # nobody listens yet: dropped, no error
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        sock.settimeout(5.0)
        _pace(path)()
        assert sock.recv(16) == b"w"
        sock.close()


def test_overrides_are_applied_or_refused_by_name(tmp_path):
    from emulator.errors import EmulatorError
    from emulator.live.faults import live_faults
    from emulator.network.topology import build_topology
    from emulator.scenario import load_scenario

    def check(overrides, world=4, real=1):
        scen = load_scenario(_scenario(tmp_path, overrides))
        return live_faults(scen, build_topology(scen.cluster), world, real)

    slow, notes = check(["{kind: gpu_slowdown, target: 'gpu:2', factor: 1.5}",
                         "{kind: link_degrade, target: 'g3->s', factor: 0.5}"])
    assert slow == {2: 1.5}
    assert notes[0].startswith("cluster.overrides[0] (gpu_slowdown gpu:2): applied")
    assert notes[1].startswith("cluster.overrides[1] (link_degrade g3->s): applied")
    with pytest.raises(EmulatorError, match=r"overrides\[0\] \(gpu_slowdown gpu:1\): rank 1 is a real process"):
        check(["{kind: gpu_slowdown, target: 'gpu:1', factor: 2}"], real=2)
    with pytest.raises(EmulatorError, match=r"overrides\[0\] \(gpu_slowdown gpu:3\): GPU 3 is outside the live world"):
        check(["{kind: gpu_slowdown, target: 'gpu:3', factor: 2}"], world=2)
    with pytest.raises(EmulatorError, match=r"overrides\[0\] \(link_fail g1->s\): a fault in the middle of the run"):
        check(["{kind: link_fail, target: 'g1->s', at: 0.1 s, until: 0.2 s}"])


def test_a_link_degrade_reaches_the_emulated_cost(tmp_path):
    from emulator.live.cost import CommCost
    from emulator.scenario import load_scenario

    (tmp_path / "a").mkdir()
    base = CommCost(load_scenario(_scenario(tmp_path / "a", ["{kind: link_degrade, target: 'g0->s', factor: 1.0}"])), 4)
    slow = CommCost(load_scenario(_scenario(tmp_path, ["{kind: link_degrade, target: 'g0<->s', factor: 0.5}"])), 4)
    t0 = base.collective("all_reduce", (0, 1, 2, 3), 1e6)
    t1 = slow.collective("all_reduce", (0, 1, 2, 3), 1e6)
    # the ring runs at its slowest link: 1.5 * 1e6 / 0.5e9 = 3 ms of bandwidth term, against 1.5 ms
    assert t0 == pytest.approx(1.62e-3, rel=1e-9)
    assert t1 - t0 == pytest.approx(1.5e-3, rel=1e-9)


# -- end to end (needs torch) ---------------------------------------------------------------
def test_two_real_ranks_mirror_data_for_the_emulated_two(tmp_path):
    pytest.importorskip("torch", reason="emulator live needs PyTorch (pip install '.[live]')")
    scen = _scenario(tmp_path, [])
    out = tmp_path / "out"
    cmd = [PY, "-m", "emulator", "live", scen, "--world", "4", "--real", "2", "--clock", "virtual", "--out",
           str(out), "--", "python", os.path.join(ROOT, "tests", "data", "live", "several_real.py"),
           str(tmp_path / "data")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    d = [json.loads((tmp_path / f"data{k}").read_text()) for k in (0, 1)]
    # ranks hold x = rank + 1; the emulated 2, 3 hold 1, 2 (mirrors of 0, 1): SUM = 1 + 2 + 1 + 2 = 6
    assert d[0]["all_reduce_sum"] == d[1]["all_reduce_sum"] == 6.0
    assert d[0]["all_reduce_max"] == 2.0
    assert d[0]["all_gather"] == d[1]["all_gather"] == [1.0, 2.0, 1.0, 2.0]
    assert d[0]["broadcast_from_3"] == d[1]["broadcast_from_3"] == 2.0  # rank 3 mirrors rank 1
    # reduce-scatter of (rank+1) * [1, 2, 3, 4]: member j gets (1 + 2 + 1 + 2) * (j + 1) = 6 (j + 1)
    assert (d[0]["reduce_scatter"], d[1]["reduce_scatter"]) == (6.0, 12.0)
    # all-to-all of 10 (rank+1) + [0, 1, 2, 3]: rank j gets block j of each member's input (2, 3 mirror 0, 1)
    assert d[0]["all_to_all"] == [10.0, 20.0, 10.0, 20.0]
    assert d[1]["all_to_all"] == [11.0, 21.0, 11.0, 21.0]
    assert d[0]["pair_sum"] == d[1]["pair_sum"] == 3.0  # the real pair alone: 1 + 2
    assert d[1]["recv_from_0"] == 42.0  # a real send between real ranks
    summary = json.loads((out / "summary.json").read_text())
    assert summary["live"]["real"] == 2 and [r["rank"] for r in summary["live"]["real_ranks"]] == [0, 1]
    record = json.loads((out / "record.json").read_text())
    streams = {c["stream"] for c in record["comms"]}
    assert "real [0,1]" in streams and "real p2p" not in streams and "comm world[4]" in streams


def test_bad_real_and_refused_overrides_exit_2(tmp_path, capsys):
    from emulator import cli

    script = os.path.join(ROOT, "examples", "train_mlp.py")
    scen = _scenario(tmp_path, [])
    assert cli.main(["live", scen, "--world", "4", "--real", "3", "--", "python", script]) == 2
    assert "--real: expected a divisor of the world size 4" in capsys.readouterr().err
    pytest.importorskip("torch", reason="emulator live needs PyTorch (pip install '.[live]')")
    bad = _scenario(tmp_path, ["{kind: gpu_slowdown, target: 'gpu:0', factor: 2}"])
    assert cli.main(["live", bad, "--world", "4", "--clock", "virtual", "--out", str(tmp_path / "o"), "--",
                     "python", script, "--iters", "1"]) == 2
    assert "(gpu_slowdown gpu:0): rank 0 is a real process" in capsys.readouterr().err


def test_cuda_tensor_without_cuda_is_a_clear_error():
    torch = pytest.importorskip("torch", reason="emulator live needs PyTorch (pip install '.[live]')")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: benchmarks/live_gpu_check.py checks the GPU path")
    from emulator.live import backend

    class _FakeCuda:
        device = torch.device("cuda")

    with pytest.raises(RuntimeError, match="a CUDA tensor was handed to a collective, but this machine has no CUDA"):
        backend._device([_FakeCuda()])


def test_emulated_pipeline_stages_send_when_their_1f1b_program_would():
    from emulator.live.pipeline import emulated_stages

    # 4 stages, 1F1B, F = 1, B = 2, no transfer time; the real stage 0 sent activations 0..3 at 1, 2, 3, 4
    # and posted the receive of gradient 0 at 4. Stage 1 runs F0 1-2, F1 2-3, F2 3-4; stage 2 F0 2-3, F1 3-4;
    # stage 3 F0 3-4, B0 4-6; stage 2 B0 6-8; stage 1 B0 8-10: stage 0 gets gradient 0 at 10, a bubble of
    # 10 - 4 = 6 = (p - 1)(F + B) - (p - 1)F
    assert emulated_stages("1f1b", 4, [1.0, 2.0, 3.0, 4.0], {0: 4.0}, 1.0, 2.0, 0.0) == {0: 10.0}
    # with a transfer of 0.5 per hop: stage 1 F0 1.5-2.5; stage 2 F0 3-4; stage 3 F0 4.5-5.5, B0 5.5-7.5;
    # stage 2 F1 4.5-5.5 (its input sent by stage 1 at 4), B0 8-10; stage 1 F2 4.5-5.5, B0 10.5-12.5;
    # the transfer to stage 0 (posted at 4) ends at 12.5 + 0.5 = 13
    assert emulated_stages("1f1b", 4, [1.0, 2.0, 3.0, 4.0], {0: 4.0}, 1.0, 2.0, 0.5) == {0: 13.0}
    # what stage 0 has not posted yet is not known; GPipe: all forwards first, gradient 3 comes back first
    assert emulated_stages("1f1b", 4, [1.0, 2.0, 3.0, 4.0], {}, 1.0, 2.0, 0.0) == {}
    # 2 stages: stage 1 runs F0 1-2, F1 2-3, then B1 3-5: gradient 1 (stage 0's first receive, posted at 2) at 5
    assert emulated_stages("gpipe", 2, [1.0, 2.0], {1: 2.0}, 1.0, 2.0, 0.0) == {1: 5.0}


def test_live_pipeline_waits_for_the_emulated_stages(tmp_path):
    pytest.importorskip("torch", reason="emulator live needs PyTorch (pip install '.[live]')")
    scen = os.path.join(ROOT, "scenarios", "live-pipeline-4stage.yaml")
    out = tmp_path / "out"
    cmd = [PY, "-m", "emulator", "live", scen, "--clock", "virtual", "--out", str(out), "--", "python",
           os.path.join(ROOT, "examples", "train_pipeline.py"), "--iters", "3", "--microbatches", "4",
           "--hidden", "64", "--batch", "8"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    record = json.loads((out / "record.json").read_text())
    assert record["pipeline"]["schedule"] == "1f1b" and record["pipeline"]["fwd_s"] > 0
    recvs = [c for c in record["comms"] if c["op"] == "recv"]
    sends = [c for c in record["comms"] if c["op"] == "send"]
    assert len(recvs) == len(sends) == 3 * 4  # 4 gradients in, 4 activations out, per iteration
    # gradient 0 of each iteration comes after stages 1-3 ran F and B: the transfer starts later than the
    # receive was posted, by at least (p - 1) F (the forwards of stages 1..3 alone)
    fwd = record["pipeline"]["fwd_s"]
    first = recvs[0::4]
    assert all(c["start_s"] - c["issue_s"] >= 2 * fwd for c in first[1:])
    assert "pipeline: stage 0 real, stages 1..3 emulated" in " ".join(record["notes"])
