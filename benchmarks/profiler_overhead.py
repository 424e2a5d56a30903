"""The PyTorch profiler's host cost per recorded aten op (record_shapes=True), on this machine.

    python benchmarks/profiler_overhead.py    # needs torch (pip install .[live])

A profiled step's host time between two kernel launches includes the profiler's own work on
every aten op it records; emulator/importers/profile.py subtracts PROFILER_OP_S per op before it
models where the GPU waits for the host. This measures it: a CPU loop of small matmuls, GELUs and
adds (forward and backward, one thread), timed with and without
``torch.profiler.profile(activities=[CPU], record_shapes=True)``; the difference over the ops the
profiler recorded. CUPTI's cost per CUDA launch needs a GPU and is not measured here.
Writes benchmarks/results/profiler_overhead.json.
"""
from __future__ import annotations

import json
import os
import platform
import time

import torch
from torch.profiler import ProfilerActivity, profile

from emulator.outputs.atomic import write_text

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "profiler_overhead.json")


def _step(x: torch.Tensor, w: torch.Tensor) -> None:
    y = x
    for _ in range(50):
        y = torch.nn.functional.gelu(y @ w) + 1.0
    y.sum().backward()


def _time(x: torch.Tensor, w: torch.Tensor, n: int = 20) -> float:
    t = time.perf_counter()
    for _ in range(n):
        _step(x, w)
    return (time.perf_counter() - t) / n


def main() -> None:
    torch.set_num_threads(1)
    x, w = torch.randn(64, 64), torch.randn(64, 64, requires_grad=True)
    for _ in range(5):
        _step(x, w)
    base = min(_time(x, w) for _ in range(5))
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        profiled = min(_time(x, w) for _ in range(5))
    ops = len(prof.events()) / (5 * 20)
    result = {"step_s": base, "profiled_step_s": profiled, "ops_per_step": ops,
              "overhead_per_op_s": (profiled - base) / ops, "torch": torch.__version__,
              "machine": platform.processor() or platform.machine()}
    write_text(OUT, json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(f"profiler cost per recorded op: {result['overhead_per_op_s'] * 1e6:.2f} us "
          f"({ops:.0f} ops a step; {base * 1e3:.2f} ms without, {profiled * 1e3:.2f} ms with)")


if __name__ == "__main__":
    main()
