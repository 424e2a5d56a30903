"""A live 4-stage pipeline (stage 0 real, stages 1-3 emulated) against `emulator run` on the measured compute.

`emulator live scenarios/live-pipeline-4stage.yaml -- python examples/train_pipeline.py` runs
stage 0 for real; the emulated stages run 1F1B on the forward and backward times F, B
measured on stage 0 (the record's ``pipeline``). With ``--schedule interleaved-1f1b``
(scenarios/live-pipeline-interleaved.yaml, 2 model chunks per stage) F and B are per chunk,
and stage 0 also receives activations from stage 3 and sends it gradients. The live bubble is stage 0's blocked
time per iteration (its exposed communication: waiting for gradients, and the transfers).
`emulator run` gets the same layout as a Program: per stage its schedule's tasks
(``emulator.live.pipeline.program``), each a compute op of F or B, a blocking receive before
it, an eager send (own stream) after it, the transfers costed on the same fabric; its stage-0
bubble is the iteration − v·M·(F + B). With equal stages: bubble ≈ (p − 1)·(F + B) (per chunk)
plus the transfers on the critical path.

Usage: .venv/bin/python benchmarks/live_pipeline_check.py [--reps R] [--iters N] [--microbatches M]
       [--clock wall|virtual] [--schedule 1f1b|interleaved-1f1b]
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


def live_pipeline(iters: int, microbatches: int, clock: str = "wall", name: str = "1f1b") -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "emulator", "live", SCENARIOS[name], "--clock", clock, "--out", tmp, "--",
               "python", os.path.join(ROOT, "examples", "train_pipeline.py"), "--iters", str(iters),
               "--microbatches", str(microbatches), "--schedule", name, "--virtual", str(VIRTUAL[name])]
        subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        with open(os.path.join(tmp, "record.json")) as fh:
            record = json.load(fh)
    from emulator.live.report import iterations

    rows = iterations(record)[SKIP:]
    return {"iteration_s": statistics.mean(r["time_s"] for r in rows),
            "bubble_s": statistics.mean(r["exposed_comm_s"] for r in rows),
            "compute_s": statistics.mean(r["compute_s"] for r in rows),
            "fwd_s": record["pipeline"]["fwd_s"], "bwd_s": record["pipeline"]["bwd_s"],
            "act_bytes": next(c["bytes"] for c in record["comms"] if c["op"] == "send")}


def run_pipeline(fwd: float, bwd: float, microbatches: int, nbytes: float, stages: int = 4,
                 name: str = "1f1b") -> float:
    """`emulator run` on the schedule's Program with compute F, B: stage 0's iteration time."""
    from dataclasses import replace

    from emulator.live.pipeline import program
    from emulator.program import COMPUTE, RECV, SEND, Op, Program
    from emulator.scenario import load_scenario
    from emulator.simulation import run_program

    ops: list[Op] = []

    def add(**kw) -> Op:
        op = Op(id=len(ops), **kw)
        ops.append(op)
        return op

    virtual = VIRTUAL[name]
    for s in range(stages):
        last: Op | None = None
        for kind, arg in program(name, s, stages, microbatches, virtual):
            if kind == "compute":
                last = add(rank=s, kind=COMPUTE, duration=fwd if arg == "F" else bwd, name=str(arg))
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


def pipeline(reps: int, iters: int = 12, microbatches: int = 8, clock: str = "wall", name: str = "1f1b") -> list[dict]:
    rows = []
    for _ in range(reps):
        live = live_pipeline(iters, microbatches, clock, name)
        it = run_pipeline(live["fwd_s"], live["bwd_s"], microbatches, live["act_bytes"], name=name)
        bubble = it - VIRTUAL[name] * microbatches * (live["fwd_s"] + live["bwd_s"])
        row = {"schedule": name, "uptime": _load(), "fwd_ms": live["fwd_s"] * 1e3, "bwd_ms": live["bwd_s"] * 1e3,
               "live_iteration_ms": live["iteration_s"] * 1e3, "live_bubble_ms": live["bubble_s"] * 1e3,
               "run_iteration_ms": it * 1e3, "run_bubble_ms": bubble * 1e3,
               "bubble_error": live["bubble_s"] / bubble - 1}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--iters", type=int, default=12)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--clock", choices=("wall", "virtual"), default="wall")
    p.add_argument("--schedule", choices=tuple(SCENARIOS), default="1f1b")
    args = p.parse_args()
    pipeline(args.reps, args.iters, args.microbatches, args.clock, args.schedule)


def _load() -> str:
    """The machine's load averages (1, 5, 15 min) when a run ended: the check shares 2 cores."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
