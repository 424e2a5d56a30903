"""Live pipelines with interleaved 1F1B: the emulated stages' timing (pure, hand-computed), the real
stage's session driven through a whole iteration, the example script's order, refusals, and the
scenario run under `emulator live`."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest
from helpers import HandClock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable

# p = 2, v = 2, m = 4, F = 1, B = 2 per chunk, free transfers. Virtual stages: s0c0, s1c0, s0c1, s1c1 (the
# loss). Task k: chunk (k // 2) % 2 (backward: 1 - that), micro-batch (k // 4) * 2 + k % 2; warm-up 4 on
# stage 0, 2 on stage 1. Stage 0: F(0,c0) 0-1, F(1,c0) 1-2, F(0,c1) 2-3 (stage 1's F(0,c0) 1-2), F(1,c1) 3-4,
# F(2,c0) 4-5, B(0,c1) 6-8 (stage 1: F(0,c1) 3-4, B(0,c1) 4-6), F(3,c0) 8-9, B(1,c1) 9-11 (stage 1 F(1,c1) 6-7,
# B 7-9), F(2,c1) 11-12 (stage 1 F(2,c0) 9-10), B(0,c0) 12-14 (stage 1 B(0,c0) 10-12), F(3,c1) 14-15 (stage 1
# F(3,c0) 12-13), B(1,c0) 15-17 (stage 1 B(1,c0) 13-15), B(2,c1) 18-20 (stage 1 F(2,c1) 15-16, B 16-18),
# B(3,c1) 21-23 (stage 1 F(3,c1) 18-19, B 19-21), B(2,c0) 23-25 (stage 1 B(2,c0) 21-23), B(3,c0) 25-27
# (stage 1 B(3,c0) 23-25). Stage 0 ends at 27 = 24 of compute (8 x (1 + 2)) + a bubble of 3 =
# (p - 1)/(v m) of the ideal 24, half the 1F1B bubble (p - 1)(vF + vB) = 6.
SENT = {("F", 1, 0, 0): 1.0, ("F", 1, 1, 0): 2.0, ("F", 1, 0, 1): 3.0, ("F", 1, 1, 1): 4.0, ("F", 1, 2, 0): 5.0,
        ("B", 1, 0, 0): 8.0, ("F", 1, 3, 0): 9.0, ("B", 1, 1, 0): 11.0, ("F", 1, 2, 1): 12.0, ("F", 1, 3, 1): 15.0,
        ("B", 1, 2, 0): 20.0, ("B", 1, 3, 0): 23.0}
POSTED = {("F", 0, 0, 1): 2.0, ("F", 0, 1, 1): 3.0, ("B", 0, 0, 1): 5.0, ("B", 0, 1, 1): 9.0, ("F", 0, 2, 1): 11.0,
          ("B", 0, 0, 0): 12.0, ("F", 0, 3, 1): 14.0, ("B", 0, 1, 0): 15.0, ("B", 0, 2, 1): 17.0,
          ("B", 0, 3, 1): 20.0, ("B", 0, 2, 0): 23.0, ("B", 0, 3, 0): 25.0}
ARRIVES = {("F", 0, 0, 1): 2.0, ("F", 0, 1, 1): 3.0, ("B", 0, 0, 1): 6.0, ("B", 0, 1, 1): 9.0, ("F", 0, 2, 1): 11.0,
           ("B", 0, 0, 0): 12.0, ("F", 0, 3, 1): 14.0, ("B", 0, 1, 0): 15.0, ("B", 0, 2, 1): 18.0,
           ("B", 0, 3, 1): 21.0, ("B", 0, 2, 0): 23.0, ("B", 0, 3, 0): 25.0}


def test_interleaved_emulated_stage_sends_arrive_when_its_program_sends_them():
    from emulator.live.pipeline import emulated

    # the real stage's sends and posts as worked out above: every receive of stage 0 completes when stage 1's
    # own program sends it, or when stage 0 posted it if later (F(2,c1): stage 1 sent at 10, posted at 11)
    assert emulated("interleaved-1f1b", 2, 4, 2, SENT, POSTED, 1.0, 2.0, 0.0) == ARRIVES
    # only what the real stage sent is known: without its gradient for (0, c1) (sent at 8), stage 1 stops
    # before B(0,c0); the receives it can still serve: activations 0, 1 of chunk 1 and gradients of chunk 1
    # for micro-batches 0, 1 (stage 1's F(2,c0) needs stage 0's activation sent at 5, not held back)
    partial = {k: t for k, t in SENT.items() if k != ("B", 1, 0, 0)}
    done = emulated("interleaved-1f1b", 2, 4, 2, partial, POSTED, 1.0, 2.0, 0.0)
    assert done == {k: ARRIVES[k] for k in [("F", 0, 0, 1), ("F", 0, 1, 1), ("B", 0, 0, 1), ("B", 0, 1, 1),
                                            ("F", 0, 2, 1)]}


def test_interleaved_with_transfers_from_the_last_stage():
    from emulator.live.pipeline import emulated

    # p = 3, v = 2, m = 3 (= p: every forward first, Megatron's rule), F = 1, B = 2, hop 0.5. Stage 0 sends
    # activations of chunk 0 at 1, 2, 3 (micro-batches 0, 1, 2); a receive ends 0.5 after both sides are there.
    # Stage 1: F(0,c0) 1.5-2.5; F(1,c0) max(2, 2.5) + 0.5 = 3.0-4.0; F(2,c0) max(3, 4) + 0.5 = 4.5-5.5.
    # Stage 2: F(0,c0) max(2.5, 0) + 0.5 = 3.0-4.0, sent to stage 0's chunk 1 (posted at 3): max(4, 3) + 0.5 =
    # 4.5; F(1,c0) max(4, 4) + 0.5 = 4.5-5.5: 6.0; F(2,c0) max(5.5, 5.5) + 0.5 = 6.0-7.0: 7.5
    sent = {("F", 1, i, 0): 1.0 + i for i in range(3)}
    posted = {("F", 0, i, 1): 3.0 for i in range(3)}
    done = emulated("interleaved-1f1b", 3, 3, 2, sent, posted, 1.0, 2.0, 0.5)
    assert done == {("F", 0, 0, 1): 4.5, ("F", 0, 1, 1): 6.0, ("F", 0, 2, 1): 7.5}


def test_an_emulated_stages_sends_queue_on_its_send_stream():
    from emulator.live.pipeline import emulated

    # 1F1B, p = 3, m = 3, F = 1, B = 2, hop 1; stage 0 sends activations at 2, 6, 10 and posts the receives
    # of gradients 0, 1, 2 at 14, 19, 21. Each stage's sends go on one stream, in program order, each
    # starting when it is ready, the one before is done and the receiver is there (`emulator run`'s rule).
    # Stage 1 (F0 F1 B0 F2 B1 B2): F0 3-4, F1 7-8, B0 (stage 2's B0 6-8, sent 8-9) 9-11, F2 (stage 0's sent
    # 11-12) 12-13, B1 (stage 2's, sent 13-14) 14-16, B2. Its stream: F0 4-5, F1 8-9, B0 to stage 0, which
    # posted at 14: 14-15; F2, ready at 13, waits for it: 15-16 (without the stream: 13-14); B1 to stage 0
    # (posted 19): 19-20. Stage 2: F2 16-17, B2 17-19, sent 19-20; stage 1's B2 20-22, to stage 0: 22-23
    # (without the stream: stage 2 F2 14-15, B2 15-17, stage 1 B2 18-20, 21-22).
    sent = {("F", 1, i, 0): t for i, t in enumerate([2.0, 6.0, 10.0])}
    posted = {("B", 0, i, 0): t for i, t in enumerate([14.0, 19.0, 21.0])}
    assert emulated("1f1b", 3, 3, 1, sent, posted, 1.0, 2.0, 1.0) == {("B", 0, 0, 0): 15.0, ("B", 0, 1, 0): 20.0,
                                                                     ("B", 0, 2, 0): 23.0}


def test_a_slowed_stage_and_slower_links_act_on_the_emulated_program():
    from emulator.live.pipeline import emulated

    # 1F1B, p = 3, m = 1, F = 1, B = 2; stage 0 sends at 1 and posts its receive at 1.
    sent, posted = {("F", 1, 0, 0): 1.0}, {("B", 0, 0, 0): 1.0}
    # free transfers: stage 1 F 1-2, stage 2 F 2-3, B 3-5, stage 1 B 5-7: 7
    assert emulated("1f1b", 3, 1, 1, sent, posted, 1.0, 2.0, 0.0) == {("B", 0, 0, 0): 7.0}
    # gpu_slowdown x2 on stage 2: its F 2-4, B 4-8; stage 1 B 8-10: 10
    assert emulated("1f1b", 3, 1, 1, sent, posted, 1.0, 2.0, 0.0, slow={2: 2.0}) == {("B", 0, 0, 0): 10.0}
    # transfers 0.5 between stages 0 and 1, 2 between 1 and 2: stage 1 F 1.5-2.5; stage 2 F 4.5-5.5,
    # B 5.5-7.5; stage 1 B 9.5-11.5; stage 0 has it at 12
    hops = {(0, 1): 0.5, (1, 0): 0.5, (1, 2): 2.0, (2, 1): 2.0}
    assert emulated("1f1b", 3, 1, 1, sent, posted, 1.0, 2.0, hops) == {("B", 0, 0, 0): 12.0}


class _Cost:
    engine_runs = 0

    def __init__(self, hop):
        self.hop = hop

    def p2p(self, src, dst, nbytes):
        return self.hop


def test_a_slowed_stage_is_not_also_a_late_copy():
    from emulator.live.pipeline import Pipeline
    from emulator.live.session import Session

    # 1F1B, 2 stages, 1 micro-batch, F = 1, B = 2 known, free transfers, gpu_slowdown x2 on stage 1. Stage 0
    # computes 10, sends at 10; stage 1 F 10-12, B 12-16: stage 0 has its gradient at 16. (Were stage 1 also
    # a symmetric straggler copy, lagging (2 - 1) x 10 of stage 0's compute, the receive would start at 20.)
    pipe = Pipeline("1f1b", 2, slow={1: 2.0})
    pipe.fwd, pipe.bwd = 1.0, 2.0
    s = Session(HandClock(), _Cost(0.0), 2, slow={1: 2.0}, pipeline=pipe)
    s.clock.t = 10.0
    s.issue("send", (0, 1), 1e3, peer=1)
    rec = s.issue("recv", (0, 1), 1e3, peer=1)
    assert (rec.start_s, rec.end_s) == (16.0, 16.0)


def _drive(session, name, stages, m, v, fwd, bwd):
    """Run the real stage 0's program on the session: compute advances the clock, a send is issued, a
    receive is issued and waited for."""
    from emulator.live.pipeline import program

    for kind, arg in program(name, 0, stages, m, v):
        if kind == "compute":
            session.clock.t += fwd if arg == "F" else bwd
            continue
        phase, dst, _, _ = arg
        peer = dst if kind == "send" else (1 if phase == "B" else stages - 1)
        rec = session.issue(kind, (0, peer), 1e3, peer=peer)
        session.wait(rec)
    session.step()


def test_real_stage_waits_out_the_interleaved_bubble():
    from emulator.live.pipeline import Pipeline
    from emulator.live.session import Session

    pipe = Pipeline("interleaved-1f1b", 2, 2)
    s = Session(HandClock(), _Cost(0.0), 2, pipeline=pipe)
    # iteration 1: F = 1 is measured between the first two sends (one forward between them); B = 2F is
    # assumed, m = 4 guessed (the smallest multiple of p above p that fits): the worked example, 27
    _drive(s, "interleaved-1f1b", 2, 4, 2, 1.0, 2.0)
    assert s.steps == [27.0] and s.blocked_s == 3.0
    assert (pipe.fwd, pipe.bwd, pipe.microbatches) == (1.0, 2.0, 4)  # measured: 1 F and 3 B samples per iteration
    # iteration 2 from 27, on what iteration 1 measured: the same 27 again
    _drive(s, "interleaved-1f1b", 2, 4, 2, 1.0, 2.0)
    assert s.steps == [27.0, 54.0] and s.blocked_s == 6.0
    assert not pipe.notes


def test_a_script_that_leaves_the_schedule_is_noted_not_modelled():
    from emulator.live.pipeline import Pipeline
    from emulator.live.session import Session

    pipe = Pipeline("interleaved-1f1b", 2, 2)
    s = Session(HandClock(), _Cost(0.0), 2, pipeline=pipe)
    s.clock.t = 1.0
    s.issue("send", (0, 1), 1e3, peer=1)
    rec = s.issue("recv", (0, 1), 1e3, peer=1)  # interleaved stage 0 sends 2 activations before its first receive
    assert rec.start_s == 1.0  # the symmetric rule
    assert "recv #2 of an iteration (peer 1) does not follow parallel.schedule interleaved-1f1b" in pipe.notes[0]
    assert "does not follow" in " ".join(s.to_dict()["notes"])


def test_the_real_stages_send_reaches_stage_1_one_transfer_later():
    from emulator.live.pipeline import Pipeline
    from emulator.live.session import Session

    # 1F1B, 2 stages, 1 micro-batch, F = 1, B = 2 known, each transfer 0.5. Stage 0 sends at 1; stage 1
    # receives it at 1.5, F 1.5-2.5, B 2.5-4.5, sends back at 4.5; stage 0 (posted at 1) has it at 5.0.
    # (The transfer was counted twice before: the send's arrival 1.5 taken as the time the sender got
    # there, then 0.5 more: 5.5.)
    pipe = Pipeline("1f1b", 2)
    pipe.fwd, pipe.bwd = 1.0, 2.0
    s = Session(HandClock(), _Cost(0.5), 2, pipeline=pipe)
    s.clock.t = 1.0
    s.issue("send", (0, 1), 1e3, peer=1)
    rec = s.issue("recv", (0, 1), 1e3, peer=1)
    assert (rec.start_s, rec.end_s) == (4.5, 5.0)


def test_example_script_order_is_the_schedule():
    pytest.importorskip("torch", reason="the example imports PyTorch")
    from emulator.workload.schedules import schedule

    spec = importlib.util.spec_from_file_location("train_pipeline", os.path.join(ROOT, "examples", "train_pipeline.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for p, v, m in [(2, 2, 4), (4, 2, 8), (4, 2, 4), (3, 3, 6)]:
        for s in range(p):
            assert mod.interleaved_order(s, p, m, v) == [tuple(t) for t in schedule("interleaved-1f1b", s, p, m, v)]


def test_pipeline_layouts_live_cannot_run_are_refused(tmp_path, capsys):
    pytest.importorskip("torch", reason="emulator live needs PyTorch (pip install '.[live]')")
    from emulator import cli

    scen = os.path.join(ROOT, "scenarios", "live-pipeline-interleaved.yaml")
    script = os.path.join(ROOT, "examples", "train_pipeline.py")
    assert cli.main(["live", scen, "--real", "2", "--clock", "virtual", "--out", str(tmp_path / "o"), "--",
                     "python", script, "--iters", "1"]) == 2
    err = capsys.readouterr().err
    assert "live-pipeline-interleaved.yaml: parallel.pp = 4: a live pipeline needs the live world to be the " \
           "pipeline" in err and "got --world 4 --real 2 --rank 0" in err
    assert cli.main(["live", scen, "--world", "4", "--set", "parallel.schedule=1f1b", "--set",
                     "parallel.virtual_stages=1", "--set", "parallel.pp=2", "--clock", "virtual", "--out",
                     str(tmp_path / "o"), "--", "python", script, "--iters", "1"]) == 2
    assert "got --world 4 --real 1 --rank 0" in capsys.readouterr().err


def test_live_interleaved_pipeline_runs_and_waits(tmp_path):
    pytest.importorskip("torch", reason="emulator live needs PyTorch (pip install '.[live]')")
    scen = os.path.join(ROOT, "scenarios", "live-pipeline-interleaved.yaml")
    out = tmp_path / "out"
    cmd = [PY, "-m", "emulator", "live", scen, "--clock", "virtual", "--out", str(out), "--", "python",
           os.path.join(ROOT, "examples", "train_pipeline.py"), "--schedule", "interleaved-1f1b", "--virtual", "2",
           "--iters", "3", "--microbatches", "4", "--hidden", "64", "--batch", "8"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    record = json.loads((out / "record.json").read_text())
    pipe = record["pipeline"]
    assert (pipe["schedule"], pipe["virtual_stages"], pipe["microbatches"]) == ("interleaved-1f1b", 2, 4)
    comms = record["comms"]
    # per iteration (m = 4, v = 2): 8 activations to stage 1, 4 gradients to stage 3 (chunk 1's backward),
    # 8 gradients from stage 1, 4 activations from stage 3 (chunk 1's forward)
    count = {(c["op"], tuple(c["group"])): 0 for c in comms}
    for c in comms:
        count[c["op"], tuple(c["group"])] += 1
    assert count == {("send", (0, 1)): 24, ("send", (0, 3)): 12, ("recv", (1, 0)): 24, ("recv", (3, 0)): 12}
    # iterations 2 and 3: every receive ends when the emulated stages, fed the run's own sends and posts
    # (issue times), running on the F, B measured in the iteration before, deliver it
    from emulator.live.pipeline import emulated, program

    hop = next(c["end_s"] - c["start_s"] for c in comms if c["op"] == "send")
    steps = record["steps_s"]
    order = [(kind, arg) for kind, arg in program("interleaved-1f1b", 0, 4, 4, 2) if kind != "compute"]
    for i in (1, 2):
        mine = [c for c in comms if steps[i - 1] <= c["issue_s"] < steps[i]]
        assert [c["op"] for c in mine] == [kind for kind, _ in order] and len(mine) == 24
        sent = {key: c["issue_s"] for c, (kind, key) in zip(mine, order) if kind == "send"}
        posted = {key: c["issue_s"] for c, (kind, key) in zip(mine, order) if kind == "recv"}
        fwd, bwd = pipe["measured_s"][i - 1]
        done = emulated("interleaved-1f1b", 4, 4, 2, sent, posted, fwd, bwd, hop, steps[i - 1])
        assert [c["end_s"] for c, (kind, _) in zip(mine, order) if kind == "recv"] == \
            pytest.approx([done[key] for kind, key in order if kind == "recv"], abs=1e-9)
    assert not [n for n in record["notes"] if "does not follow" in n]


@pytest.mark.parametrize("name,virtual", [("1f1b", 1), ("interleaved-1f1b", 2)])
def test_live_stages_keep_emulator_runs_rules(name, virtual):
    """The real stage driven with uneven compute between its transfers, on the scenario's fabric: its
    iteration ends when `emulator run` (the engine) ends stage 0 on the same Program
    (benchmarks/live_pipeline_check.py builds it), to 1e-9."""
    from emulator.live.cost import CommCost
    from emulator.live.pipeline import Pipeline, program
    from emulator.live.session import Session
    from emulator.scenario import load_scenario

    spec = importlib.util.spec_from_file_location("live_pipeline_check",
                                                  os.path.join(ROOT, "benchmarks", "live_pipeline_check.py"))
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    cost = CommCost(load_scenario(check.SCENARIOS[name]), 4)
    nbytes, fwd, bwd = 65536.0, 1e-3, 2e-3
    comms = [step for step in program(name, 0, 4, 8, virtual) if step[0] != "compute"]
    stretches = [(0.3e-3, 1.1e-3, 2.5e-3, 0.0, 4e-3)[i % 5] for i in range(len(comms) + 1)]
    pipe = Pipeline(name, 4, virtual)
    pipe.fwd, pipe.bwd = fwd, bwd
    s = Session(HandClock(), cost, 4, pipeline=pipe)
    for c, (kind, (phase, dst, _, _)) in zip(stretches, comms):
        s.clock.t += c
        peer = dst if kind == "send" else (1 if phase == "B" else 3)
        s.wait(s.issue(kind, (0, peer), nbytes, peer=peer))
    s.clock.t += stretches[-1]
    s.sync("optimizer")
    run = check.run_pipeline(fwd, bwd, 8, nbytes, name=name, stage0=stretches)
    assert s.clock.t == pytest.approx(run, abs=1e-9)
    assert s.blocked_s > 0.01  # a bubble: the check is not trivially met


@pytest.mark.parametrize("name,why", [
    ("zb-v", "zb-v places two chunks a rank in a V (stage 0 holds the first and the last virtual stage) and "
             "splits backwards into input- and weight-gradient passes"),
    ("dualpipev", "dualpipev places two chunks a rank in a V (stage 0 holds the first and the last virtual "
                  "stage) and runs a forward and a backward as one overlapped pair"),
    ("dualpipe", "dualpipe runs two directions (every rank holds two stages: stage 0 is also the reverse "
                 "direction's last, fed by stage 1)"),
])
def test_v_and_dualpipe_schedules_are_refused_by_name(name, why):
    from emulator.live.pipeline import Pipeline, refusal

    head = f"parallel.schedule: a live pipeline supports gpipe, 1f1b, interleaved-1f1b, got '{name}': "
    got = refusal(4, name, 4, 1, 0)
    assert got is not None and got.startswith(head + why) and got.endswith("`emulator run` simulates it")
    with pytest.raises(ValueError, match="a live pipeline supports"):
        Pipeline(name, 4, 2 if name != "dualpipe" else 1)
    assert refusal(1, name, 1, 1, 0) is None  # no pipeline: nothing to refuse


def test_the_launcher_refuses_a_dualpipe_pipeline_before_it_starts(tmp_path, capsys):
    pytest.importorskip("torch", reason="emulator live needs PyTorch (pip install '.[live]')")
    from emulator import cli

    scen = os.path.join(ROOT, "scenarios", "live-pipeline-4stage.yaml")
    script = os.path.join(ROOT, "examples", "train_pipeline.py")
    for name in ("zb-v", "dualpipev", "dualpipe"):
        assert cli.main(["live", scen, "--set", f"parallel.schedule={name}", "--clock", "virtual", "--out",
                         str(tmp_path / name), "--", "python", script, "--iters", "1"]) == 2
        err = capsys.readouterr().err
        assert f"live-pipeline-4stage.yaml: parallel.schedule: a live pipeline supports gpipe, 1f1b, " \
               f"interleaved-1f1b, got '{name}': {name} " in err
        assert not (tmp_path / name).exists()  # refused before any output
