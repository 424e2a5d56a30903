"""The PyTorch profiler's host cost per recorded aten op (record_shapes=True), on this machine.

    python benchmarks/profiler_overhead.py [--rounds 9] [--out FILE]   # needs torch (pip install .[live])

A profiled step's host time between two kernel launches includes the profiler's own work on
every op it records; emulator/importers/profile.py subtracts PROFILER_OP_S per op before it
models where the GPU waits for the host. This measures it: a CPU loop of small matmuls, GELUs and
adds (forward and backward, one thread), timed without and with
``torch.profiler.profile(activities=[CPU], record_shapes=True)`` (no with_stack, no memory, no
CUDA activity), over the ops the profiler recorded. The ops are counted as the importer counts
them: the ``cpu_op`` events of the exported trace (emulator/importers/kineto_reader.py; aten ops,
nested ones included, and autograd's backward nodes and engine records).

Each round times the loop unprofiled, then in a fresh profiler session (its first step a warm-up
outside the timing), each the fastest of ``REPEATS`` runs of ``STEPS`` steps, in the thread's own CPU
time (``time.thread_time``: the profiler records on the thread that runs the op, and another process's
turn on a shared core does not count, as it would in wall time); the rounds interleave so a busy
moment hits both. The figure is the median over the
rounds of (profiled - unprofiled) / ops, with the figure of the fastest steps of all rounds, the
rounds' range and the load average beside it. In wall time, one round on a busy 2-core machine
read 1.5-3x the quiet figure, and one session timing every profiled step (its event buffer
growing) read high too; sharing the caches and cores still lifts the CPU time a little. CUPTI's cost per CUDA
launch needs a GPU and is not measured here (benchmarks/gpu_profile_check.py --cross measures it).
Writes benchmarks/results/profiler_overhead.json (or --out).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time

import torch
from torch.profiler import ProfilerActivity, profile

from emulator.outputs.atomic import write_text

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "profiler_overhead.json")
STEPS, REPEATS = 10, 3


def _step(x: torch.Tensor, w: torch.Tensor) -> None:
    y = x
    for _ in range(50):
        y = torch.nn.functional.gelu(y @ w) + 1.0
    y.sum().backward()


def _time(x: torch.Tensor, w: torch.Tensor) -> float:
    """The fastest of REPEATS runs of STEPS steps, s of this thread's CPU time a step."""
    best = float("inf")
    for _ in range(REPEATS):
        t = time.thread_time()
        for _ in range(STEPS):
            _step(x, w)
        best = min(best, (time.thread_time() - t) / STEPS)
    return best


def _cpu_ops(prof: profile) -> int:
    """The ``cpu_op`` events of the session's exported trace, as the importer counts them."""
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            return sum(1 for e in json.load(f)["traceEvents"] if e.get("cat") == "cpu_op")
    finally:
        os.remove(path)


def _round(x: torch.Tensor, w: torch.Tensor) -> tuple[float, float, float]:
    """(unprofiled s a step, profiled s a step, recorded ops a step) of one round."""
    base = _time(x, w)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        _step(x, w)  # the session's first step: the profiler's own warm-up
        profiled = _time(x, w)
    return base, profiled, _cpu_ops(prof) / (1 + REPEATS * STEPS)


def measure(rounds: int) -> dict:
    """Interleaved rounds, unprofiled then profiled; the median per-op cost and its spread."""
    torch.set_num_threads(1)
    x, w = torch.randn(64, 64), torch.randn(64, 64, requires_grad=True)
    for _ in range(5):
        _step(x, w)
    load = os.getloadavg()[0]
    runs = [_round(x, w) for _ in range(rounds)]
    per_op = sorted((p - b) / n for b, p, n in runs)
    base, profiled = min(b for b, _, _ in runs), min(p for _, p, _ in runs)
    ops = statistics.median(n for _, _, n in runs)
    return {"overhead_per_op_s": statistics.median(per_op), "overhead_per_op_fastest_s": (profiled - base) / ops,
            "overhead_per_op_rounds_s": [per_op[0], per_op[-1]], "rounds": rounds,
            "step_s": statistics.median(b for b, _, _ in runs),
            "profiled_step_s": statistics.median(p for _, p, _ in runs), "ops_per_step": ops,
            "load_average_1min": [round(load, 2), round(os.getloadavg()[0], 2)], "cpus": os.cpu_count(),
            "conditions": "activities=[CPU], record_shapes=True, no with_stack/profile_memory; one thread, its CPU time; "
                          "ops: cpu_op events of the exported trace; median over interleaved rounds of "
                          "(profiled - unprofiled) / ops, each a fresh session after one warm-up step",
            "torch": torch.__version__, "machine": platform.processor() or platform.machine()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=9, help="interleaved rounds (default 9)")
    ap.add_argument("--out", default=OUT, help="the JSON to write (default benchmarks/results/profiler_overhead.json)")
    a = ap.parse_args()
    result = measure(a.rounds)
    write_text(a.out, json.dumps(result, indent=2, sort_keys=True) + "\n")
    lo, hi = result["overhead_per_op_rounds_s"]
    print(f"profiler cost per recorded op: {result['overhead_per_op_s'] * 1e6:.2f} us, median of {a.rounds} rounds "
          f"(fastest steps {result['overhead_per_op_fastest_s'] * 1e6:.2f} us, rounds {lo * 1e6:.2f}-{hi * 1e6:.2f}; "
          f"{result['ops_per_step']:.0f} ops a step; {result['step_s'] * 1e3:.2f} ms without, "
          f"{result['profiled_step_s'] * 1e3:.2f} ms with; load {result['load_average_1min']})")


if __name__ == "__main__":
    main()
