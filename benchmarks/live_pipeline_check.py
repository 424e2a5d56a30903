"""A live 4-stage pipeline (stage 0 real, stages 1-3 emulated) against `emulator run` on the measured compute.

`emulator live scenarios/live-pipeline-4stage.yaml -- python examples/train_pipeline.py` runs
stage 0 for real; the emulated stages run 1F1B on the forward and backward times F, B
measured on stage 0 (the record's ``pipeline``). With ``--schedule interleaved-1f1b``
(scenarios/live-pipeline-interleaved.yaml, 2 model chunks per stage) F and B are per chunk,
and stage 0 also receives activations from stage 3 and sends it gradients. The live bubble
is stage 0's blocked time per iteration (its exposed communication: waiting for its
receives, and the transfers), the mean over iterations 3.. .

`emulator run` gets the same layout as a Program: per stage its schedule's tasks
(``emulator.live.pipeline.program``), each a compute op, a blocking receive before it, a send
on the stage's send stream after it, the transfers costed on the same fabric. Two ways:
- *simple* (``run_bubble_ms``): every stage's tasks take the last iteration's medians F, B;
  the bubble is the iteration − v·M·(F + B).
- *measured* (``run_bubble_measured_ms``, the check): iteration by iteration, stage 0 gets its
  own measured compute between its transfers (from the record: the time between two
  transfers' issues less the waits in it; its optimizer step is the stretch after the last),
  the emulated stages the F, B they ran on (the previous iteration's medians); the bubble is
  the iteration − stage 0's compute. The mean over the same iterations.
With equal stages: bubble ≈ (p − 1)·(F + B) (per chunk) plus the transfers on the critical path.

Usage: .venv/bin/python benchmarks/live_pipeline_check.py [--reps R] [--iters N] [--microbatches M]
       [--clock wall|virtual] [--schedule 1f1b|interleaved-1f1b] [--hidden H] [--slow STAGE:FACTOR]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
SCENARIOS = {"1f1b": os.path.join(ROOT, "scenarios", "live-pipeline-4stage.yaml"),
             "interleaved-1f1b": os.path.join(ROOT, "scenarios", "live-pipeline-interleaved.yaml")}
VIRTUAL = {"1f1b": 1, "interleaved-1f1b": 2}  # the scenarios' parallel.virtual_stages
SKIP = 2


def live_pipeline(iters: int, microbatches: int, clock: str = "wall", name: str = "1f1b",
                  script_args: tuple[str, ...] = (), slow: dict[int, float] | None = None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        sets = [f"{{kind: gpu_slowdown, target: 'gpu:{r}', factor: {f}}}" for r, f in sorted((slow or {}).items())]
        cmd = [sys.executable, "-m", "emulator", "live", SCENARIOS[name], "--clock", clock, "--out", tmp,
               *(["--set", f"cluster.overrides=[{', '.join(sets)}]"] if sets else []), "--",
               "python", os.path.join(ROOT, "examples", "train_pipeline.py"), "--iters", str(iters),
               "--microbatches", str(microbatches), "--schedule", name, "--virtual", str(VIRTUAL[name]), *script_args]
        subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        with open(os.path.join(tmp, "record.json")) as fh:
            record = json.load(fh)
    from emulator.live.report import iterations

    rows = iterations(record)
    return {"iteration_s": statistics.mean(r["time_s"] for r in rows[SKIP:]),
            "bubble_s": statistics.mean(r["exposed_comm_s"] for r in rows[SKIP:]),
            "bubbles_s": [r["exposed_comm_s"] for r in rows],
            "compute_s": statistics.mean(r["compute_s"] for r in rows[SKIP:]),
            "fwd_s": record["pipeline"]["fwd_s"], "bwd_s": record["pipeline"]["bwd_s"],
            "record": record,
            "act_bytes": next(c["bytes"] for c in record["comms"] if c["op"] == "send")}


def run_pipeline(fwd: float, bwd: float, microbatches: int, nbytes: float, stages: int = 4,
                 name: str = "1f1b", others: tuple[float, float] | None = None,
                 stage0: list[float] | None = None, slow: dict[int, float] | None = None) -> float:
    """`emulator run` on the schedule's Program with compute F, B: stage 0's iteration time.
    ``others``: the stages 1..'s F, B instead; ``slow``: stage → factor on its F, B (a
    ``gpu_slowdown``); ``stage0``: stage 0's compute before each of its
    transfers and after the last, instead of its F and B."""
    from dataclasses import replace

    from emulator.live.pipeline import program
    from emulator.program import COMPUTE, RECV, SEND, Op, Program
    from emulator.run.simulation import run_program
    from emulator.scenario import load_scenario

    ops: list[Op] = []

    def add(**kw) -> Op:
        op = Op(id=len(ops), **kw)
        ops.append(op)
        return op

    virtual = VIRTUAL[name]
    for s in range(stages):
        last: Op | None = None
        steps = program(name, s, stages, microbatches, virtual)
        if s == 0 and stage0 is not None:  # the measured stretches of compute between its transfers
            comms = [st for st in steps if st[0] != "compute"]
            assert len(stage0) == len(comms) + 1, (len(stage0), len(comms))
            steps = [x for c, st in zip(stage0, comms) for x in (("compute", c), st)] + [("compute", stage0[-1])]
        for kind, arg in steps:
            if kind == "compute" and isinstance(arg, float):
                last = add(rank=s, kind=COMPUTE, duration=max(arg, 0.0), name="measured")
                continue
            if kind == "compute":
                f, b = (fwd, bwd) if s == 0 or others is None else others
                f, b = f * (slow or {}).get(s, 1.0), b * (slow or {}).get(s, 1.0)
                last = add(rank=s, kind=COMPUTE, duration=f if arg == "F" else b, name=str(arg))
                continue
            phase, dst, mb, chunk = arg  # type: ignore[misc]
            tag = 2 * chunk + (phase == "B")  # one FIFO per message stream (phase, receiving chunk)
            if kind == "recv":
                src = (s - 1) % stages if phase == "F" else (s + 1) % stages
                add(rank=s, kind=RECV, stream="compute", peer=src, bytes=nbytes, tag=tag, name=f"recv {phase}{mb}.{chunk}")
            else:
                assert last is not None
                add(rank=s, kind=SEND, stream="send", peer=dst, bytes=nbytes, tag=tag, deps=(last.id,),
                    name=f"send {phase}{mb}.{chunk}")
    scen = load_scenario(SCENARIOS[name])
    scen = replace(scen, simulation=replace(scen.simulation, iterations=1))
    res = run_program(Program(stages, ops), scen, record_links=False)
    return max(sp.end_s for sp in res.spans if sp.rank == 0)


def pipeline(reps: int, iters: int = 12, microbatches: int = 8, clock: str = "wall", name: str = "1f1b",
             script_args: tuple[str, ...] = (), slow: dict[int, float] | None = None) -> list[dict]:
    rows = []
    for _ in range(reps):
        live = live_pipeline(iters, microbatches, clock, name, script_args, slow)
        it = run_pipeline(live["fwd_s"], live["bwd_s"], microbatches, live["act_bytes"], name=name, slow=slow)
        bubble = it - VIRTUAL[name] * microbatches * (live["fwd_s"] + live["bwd_s"])
        per = per_iteration(live["record"], microbatches, name, slow)
        row = {"schedule": name, "uptime": _load(), "fwd_ms": live["fwd_s"] * 1e3, "bwd_ms": live["bwd_s"] * 1e3,
               "live_iteration_ms": live["iteration_s"] * 1e3, "live_bubble_ms": live["bubble_s"] * 1e3,
               "run_iteration_ms": it * 1e3, "run_bubble_ms": bubble * 1e3,
               "bubble_error": live["bubble_s"] / bubble - 1,
               "run_bubble_measured_ms": per * 1e3, "bubble_error_measured": live["bubble_s"] / per - 1}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def per_iteration(record: dict, microbatches: int, name: str, slow: dict[int, float] | None = None) -> float:
    """`emulator run`'s stage-0 bubble, iteration by iteration, on exactly what each live iteration ran
    on: stage 0 its measured compute between its transfers (from the record: the time between two
    transfers' issues, less the waits in it); the emulated stages the F, B they ran on (the previous
    iteration's medians, the live rule). The mean over the iterations the live bubble averages."""
    from emulator.live.report import iterations

    fb = record["pipeline"]["measured_s"]
    nbytes = next(c["bytes"] for c in record["comms"] if c["op"] == "send")
    waits = [(w["start_s"], w["end_s"]) for w in record["waits"]]

    def busy(lo: float, hi: float) -> float:
        return hi - lo - sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in waits)

    bubbles = []
    for i, row in enumerate(iterations(record)):
        if i < SKIP:
            continue
        lo, hi = row["start_s"], row["end_s"]
        marks = [lo] + [c["issue_s"] for c in record["comms"] if c["op"] in ("send", "recv")
                        and lo <= c["issue_s"] < hi] + [hi]
        stage0 = [busy(a, b) for a, b in zip(marks, marks[1:])]
        prev = next((f, b) for f, b in reversed(fb[:i]) if f is not None and b is not None)
        it = run_pipeline(prev[0], prev[1], microbatches, nbytes, name=name, others=prev, stage0=stage0, slow=slow)
        bubbles.append(it - sum(stage0))
    return statistics.mean(bubbles)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--iters", type=int, default=12)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--clock", choices=("wall", "virtual"), default="wall")
    p.add_argument("--schedule", choices=tuple(SCENARIOS), default="1f1b")
    p.add_argument("--hidden", type=int, default=512, help="the script's --hidden (its compute per micro-batch)")
    p.add_argument("--slow", metavar="STAGE:FACTOR", action="append", default=[],
                   help="a gpu_slowdown override on an emulated stage, in both the live run and `emulator run`")
    args = p.parse_args()
    slow = {int(a): float(b) for a, b in (x.split(":") for x in args.slow)}
    pipeline(args.reps, args.iters, args.microbatches, args.clock, args.schedule, ("--hidden", str(args.hidden)), slow)


def _load() -> str:
    """The machine's load averages (1, 5, 15 min) when a run ended: the check shares 2 cores."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
