"""The watchdog of `emulator live --real K` (emulator/live/watchdog.py): a real rank waiting for one
that never comes is a deadlock, reported (exit 2, the rank, the operation, the peer) within seconds,
with every process of the run stopped; and scripts that never reach the emulator are refused."""
import json
import os
import subprocess
import sys
import time

import pytest

from emulator import cli
from emulator.live.watchdog import Beacon, RankState, read_state, verdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable
HANG = os.path.join(ROOT, "tests", "data", "live", "hang.py")
WORLD = {"op": "all_reduce", "group": [0, 1, 2, 3], "on": [1], "peer": -1}


def _state(rank, waiting=None, init=True, code=None, stood=10.0):
    return RankState(rank, waiting, init, code, stood)


def test_a_rank_waiting_for_one_that_exited_is_a_deadlock():
    # rank 1 exited (code 0) without init_process_group while rank 0 waits for it in the all-reduce
    msg = verdict([_state(0, WORLD), _state(1, init=False, code=0)])
    assert msg == ("deadlock: real rank 0 waits in all_reduce over ranks [0, 1, 2, 3] for real rank 1, "
                   "which exited with code 0 without calling init_process_group")
    # it initialised, but never issued the all-reduce
    assert verdict([_state(0, WORLD), _state(1, code=0)]).endswith("which exited with code 0 without issuing it")
    recv = {"op": "recv", "group": [0, 1], "on": [1], "peer": 1}
    assert verdict([_state(0, recv), _state(1, code=0)]) == (
        "deadlock: real rank 0 waits in recv from real rank 1, which exited with code 0 without sending it")


def test_no_deadlock_within_the_grace_or_without_the_exited_rank():
    # rank 1's last send may still be landing: 0.5 s < GRACE_S = 1 s after its exit
    assert verdict([_state(0, WORLD), _state(1, code=0, stood=0.5)]) is None
    assert verdict([_state(0, WORLD, stood=0.5), _state(1, code=0)]) is None
    # rank 0 waits on rank 2 only (a group of 0 and 2): rank 1's exit does not concern it
    assert verdict([_state(0, {**WORLD, "group": [0, 2], "on": [2]}), _state(1, code=0), _state(2, stood=0.1)]) is None
    assert verdict([_state(0), _state(1, code=0)]) is None  # rank 0 computes


def test_every_rank_waiting_unpaired_is_a_deadlock_but_a_matched_wait_is_not():
    recv = {"op": "recv", "group": [0, 1], "on": [1], "peer": 1}
    crossed = [_state(0, recv), _state(1, {**WORLD, "on": [0]})]
    assert verdict(crossed) == ("deadlock: every real rank has waited 3 s or more, and the waits do not pair up: "
                                "real rank 0 waits in recv from real rank 1; real rank 1 waits in all_reduce over "
                                "ranks [0, 1, 2, 3]")
    assert verdict([_state(0, recv, stood=2.0), crossed[1]]) is None  # 2 s < QUIET_S = 3 s: states may lag
    send = {"op": "send", "group": [0, 1], "on": [0], "peer": 0}
    assert verdict([_state(0, recv), _state(1, send)]) is None  # a slow transfer, both ends in it
    assert verdict([_state(0, WORLD), _state(1, {**WORLD, "on": [0]})]) is None  # the same collective
    both_recv = [_state(0, recv), _state(1, {**recv, "on": [0], "peer": 0})]
    assert verdict(both_recv).startswith("deadlock: every real rank")


def test_the_beacon_writes_each_wait_and_clears_it(tmp_path):
    path = str(tmp_path / "state-1.json")
    b = Beacon(path, 1)
    assert read_state(path, 1) == (None, False, 0)  # nothing written yet
    b.init()
    with b.blocked("recv", (0, 1), (0, 1), peer=0):
        waiting, init, seq = read_state(path, 1)
        assert waiting == {"op": "recv", "group": [0, 1], "on": [0], "peer": 0} and init and seq == 2
        with b.blocked("all_reduce", (0, 1), (0, 1)):  # nested: the outer wait stands
            assert read_state(path, 1)[0]["op"] == "recv"
    assert read_state(path, 1) == (None, True, 3)


def _scenario(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("name: small\ncluster: {nodes: 1, node: dgx-a100}\n")
    return str(path)


def _live(tmp_path, args, script):
    cmd = [PY, "-m", "emulator", "live", _scenario(tmp_path), *args, "--clock", "virtual", "--out",
           str(tmp_path / "out"), "--", "python", *script]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    return proc, time.monotonic() - t0


@pytest.mark.parametrize("case, expected", [
    ("noinit", "real rank 0 waits in all_reduce over ranks [0, 1, 2, 3] for real rank 1, which exited with code 0 "
               "without calling init_process_group"),
    ("crossed", "real rank 0 waits in recv from real rank 1; real rank 1 waits in all_reduce over ranks [0, 1, 2, 3]"),
])
def test_a_live_hang_ends_with_exit_2_naming_rank_operation_and_peer(tmp_path, case, expected):
    pytest.importorskip("torch", reason="emulator live needs PyTorch (pip install '.[live]')")
    proc, wall = _live(tmp_path, ["--world", "4", "--real", "2"], [HANG, case])
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert expected in last and last.endswith("every process of the run was stopped"), last
    assert wall < 60  # the start (two torch imports) plus GRACE_S or QUIET_S, not gloo's 10 minutes


def test_a_script_without_init_process_group_is_refused(tmp_path):
    pytest.importorskip("torch", reason="emulator live needs PyTorch (pip install '.[live]')")
    script = tmp_path / "sleep.py"
    script.write_text("import time\ntime.sleep(0.2)\n")
    proc, _ = _live(tmp_path, ["--world", "4"], [str(script)])
    assert proc.returncode == 2
    assert "the script never called torch.distributed.init_process_group" in proc.stderr
    assert not (tmp_path / "out" / "summary.json").exists()


def test_two_real_ranks_time_from_when_both_are_up(tmp_path):
    """The real ranks' clocks start when the last of them is ready (``Peers.origin``), not when the
    launcher started them: a 0.5 s sleep is 0.5 s of compute, not 0.5 s plus two torch imports."""
    pytest.importorskip("torch", reason="emulator live needs PyTorch (pip install '.[live]')")
    script = tmp_path / "sleep.py"
    script.write_text("import time\nimport torch.distributed as dist\ndist.init_process_group()\ntime.sleep(0.5)\n")
    proc, _ = _live(tmp_path, ["--world", "4", "--real", "2", "--json"], [str(script)])
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    # one iteration (no optimizer step): the script's end, ≥ the 0.5 s sleep; the start is out
    assert 0.5 <= summary["iteration_time_s"] < 0.9


def test_world_zero_is_refused(tmp_path, capsys):
    assert cli.main(["live", _scenario(tmp_path), "--world", "0", "--", "python", HANG, "noinit"]) == 2
    assert "--world: expected 1..8 (the GPUs of small), got 0" in capsys.readouterr().err


def test_the_rank_that_ended_the_run_is_named_not_one_the_launcher_stopped():
    from emulator.live.launcher import _first_failed

    # rank 1 exited with its own code 3; the launcher then stopped rank 0 (SIGTERM: -15)
    assert _first_failed([-15, 3]) == 1
    assert _first_failed([0, -15, 3, 4]) == 2  # the first own failure, in rank order
    assert _first_failed([-9, -15]) == 0  # only stopped ranks (the launcher was terminated): the first
    assert _first_failed([0, 0]) == 0


def test_a_rank_exiting_before_init_is_reported_with_its_own_code(tmp_path):
    pytest.importorskip("torch", reason="emulator live needs PyTorch (pip install '.[live]')")
    script = tmp_path / "exit3.py"
    script.write_text("import os, sys, time\nif os.environ['RANK'] == '1':\n    sys.exit(3)\ntime.sleep(60)\n")
    proc, wall = _live(tmp_path, ["--world", "4", "--real", "2"], [str(script)])
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "the script (real rank 1) exited with code 3 before the run was recorded" in last, last
    assert wall < 50  # rank 0's 60 s sleep was stopped


def _gone(pid):
    """Whether a process has ended (a zombie, not yet reaped by whoever inherited it, has ended)."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as fh:
            return any(line.startswith("State:") and "Z" in line.split()[1] for line in fh)
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc are Linux's")
@pytest.mark.parametrize("real", [1, 2])
def test_a_killed_launcher_leaves_no_rank_behind(tmp_path, real):
    pytest.importorskip("torch", reason="emulator live needs PyTorch (pip install '.[live]')")
    import signal

    pids = tmp_path / "pids"
    pids.mkdir()
    script = tmp_path / "sleep.py"
    script.write_text(f"import os, time\nopen(os.path.join({str(pids)!r}, str(os.getpid())), 'w').close()\n"
                      "time.sleep(120)\n")
    cmd = [PY, "-m", "emulator", "live", _scenario(tmp_path), "--world", "4", "--real", str(real), "--clock",
           "virtual", "--out", str(tmp_path / "out"), "--", "python", str(script)]
    launcher = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 90
        while len(os.listdir(pids)) < real and time.monotonic() < end:
            time.sleep(0.1)
        ranks = [int(p) for p in os.listdir(pids)]
        assert len(ranks) == real, "the ranks never started"
        launcher.kill()  # SIGKILL: the launcher cannot stop its ranks itself
        launcher.wait()
        end = time.monotonic() + 5
        while not all(map(_gone, ranks)) and time.monotonic() < end:
            time.sleep(0.05)
        left = [r for r in ranks if not _gone(r)]
        for r in left:  # do not leave them to the machine
            os.kill(r, signal.SIGKILL)
        assert not left, f"ranks {left} outlived the launcher by 5 s"
    finally:
        if launcher.poll() is None:
            launcher.kill()
