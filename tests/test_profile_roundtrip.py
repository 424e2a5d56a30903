"""Profile → catalog → predict: `emulator calibrate --kineto` per-shape kernels feed the workload builder.

A one-GPU Kineto profile (record_shapes) of a small GPT's layer, head and their backward is
synthesised with a known time per GEMM shape. Calibrating from it writes every shape and its
time into the GPU's ``kernels``; a run of the same layout then costs each GEMM op at the
profiled time (plus the GPU's launch gap, which a Kineto kernel duration does not include).
Another layout is then predicted from the same profile: PP 2 keeps every GEMM shape (all
measured); TP 2 halves them (none measured: the roofline with the profile's fitted GEMM
efficiency costs them).
"""
from __future__ import annotations

import argparse
import json
import math

import pytest

from emulator.outputs.summary import summarize
from emulator.run import simulation
from emulator.scenario import load_scenario
from emulator.tools.calibrate import add_arguments, calibrate_command
from emulator.workload import layer as Ly

MODEL = dict(layers=2, hidden=1024, heads=16, ffn_hidden=4096, seq_len=1024, vocab=32768)
LAUNCH = 4e-6  # the dgx-a100 GPU's launch_overhead (catalog.yaml), added per kernel by the compute model


def _profiled_time(b: int, m: int, n: int, k: int) -> float:
    """The 'measured' kernel time of a GEMM shape: 2bmnk at 200 TFLOP/s plus 3 us, and 7% more when
    k < 128 (any deterministic rule serves: it only has to differ from the emulator's model)."""
    return 2.0 * b * m * n * k / 200e12 + 3e-6 + (0.07 * 2.0 * b * m * n * k / 200e12 if k < 128 else 0.0)


def _layer_gemms(tp: int) -> list[Ly.Kernel]:
    from emulator.scenario.spec import ModelSpec

    L = Ly.layer_shape(ModelSpec(**MODEL).resolved(), 2, t=tp)
    steps = (Ly.forward_steps(L) + Ly.backward_steps(L) + Ly.head_forward(L, MODEL["vocab"])
             + Ly.head_backward(L, MODEL["vocab"]))
    return [k for k in Ly.kernels(steps) if k.kind == "gemm"]


def _x(cat, name, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 9, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _trace() -> tuple[dict, dict[tuple[int, int, int, int], float]]:
    """ProfilerStep#1 with one aten::mm (bmm when batched) per GEMM of the layer, its launch and kernel."""
    times: dict[tuple[int, int, int, int], float] = {}
    ev, ts = [], 1000.0
    kerns = _layer_gemms(1)
    for i, k in enumerate(kerns):
        dims = (k.batch, k.m, k.n, k.k)
        t = times.setdefault(dims, _profiled_time(*dims))
        bf = ["c10::BFloat16", "c10::BFloat16"]
        if k.batch == 1:
            ev.append(_x("cpu_op", "aten::mm", ts, 2, **{"Input Dims": [[k.m, k.k], [k.k, k.n]], "Input type": bf}))
        else:
            ev.append(_x("cpu_op", "aten::bmm", ts, 2, **{"Input Dims": [[k.batch, k.m, k.k], [k.batch, k.k, k.n]],
                                                          "Input type": bf}))
        ev.append(_x("cuda_runtime", "cudaLaunchKernel", ts + 0.5, 1, correlation=i + 1))
        ev.append({"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16", "pid": 0, "tid": 7, "ts": ts + 1,
                   "dur": t * 1e6, "args": {"stream": 7, "correlation": i + 1}})
        ts += 2 + t * 1e6
    ev.insert(0, _x("user_annotation", "ProfilerStep#1", 999, ts - 999 + 10))
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
            "traceEvents": ev}, times


def _calibrate(tmp_path) -> dict[tuple[int, int, int, int], float]:
    trace, times = _trace()
    (tmp_path / "layer.json").write_text(json.dumps(trace))
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    report = calibrate_command(parser.parse_args(["--kineto", str(tmp_path / "layer.json"), "--base", "dgx-a100",
                                                  "--name", "profiled", "--out", str(tmp_path / "cat.yaml")]))
    assert f"per-shape kernels: {len(times)} GEMM shapes measured" in report
    return times


def _run(tmp_path, tp: int, pp: int):
    text = (f"name: rt\ncluster:\n  nodes: 1\n  node: profiled\n  catalog: cat.yaml\n"
            f"model: {json.dumps(MODEL)}\n"
            f"training: {{global_batch: {8 * 2 // tp // pp * 2}, micro_batch: 2}}\n"
            f"parallel: {{tp: {tp}, pp: {pp}}}\nsimulation: {{detail: op}}\n")
    (tmp_path / f"rt{tp}{pp}.yaml").write_text(text)
    return simulation.simulate(load_scenario(str(tmp_path / f"rt{tp}{pp}.yaml")))


def test_profile_round_trip_reproduces_per_op_times(tmp_path):
    times = _calibrate(tmp_path)
    text = (tmp_path / "cat.yaml").read_text()
    assert "kernels:" in text and "kernel_table: none" in text  # the A100 base has no built-in table
    result = _run(tmp_path, 1, 1)
    by_name = {k.name: (k.batch, k.m, k.n, k.k) for k in _layer_gemms(1)}
    checked = 0
    for op in result.program.expanded().ops:
        short = op.name.split(".", 3)[-1] if op.name.count(".") >= 3 else op.name
        if op.costed and short in by_name:
            profiled = times[by_name[short]]
            # the op's time is the profiled kernel time plus the launch gap, exactly (within 2%: 6 digits)
            assert op.duration - LAUNCH == pytest.approx(profiled, rel=0.02)
            assert op.duration - LAUNCH == pytest.approx(profiled, rel=1e-5)
            assert op.costed[0] == op.duration  # all of it measured
            checked += 1
    assert checked >= len(by_name)  # every GEMM of the layer and the head, each micro-batch


def test_predict_other_layouts_from_the_profile(tmp_path):
    _calibrate(tmp_path)
    same_shapes = summarize(_run(tmp_path, 1, 2))["compute_source"]
    halved = summarize(_run(tmp_path, 2, 1))["compute_source"]
    # PP 2 keeps every GEMM shape: all GEMM time is measured; the rest (element-wise kernels,
    # the optimizer) is the roofline's. TP 2 changes every GEMM's n or k: nothing is measured.
    assert same_shapes["measured"] > 0.5 and same_shapes["interpolated"] == 0.0
    assert halved["measured"] == 0.0 and halved["interpolated"] > 0.0
    # TP 2's QKV GEMM (1, 2048, 1536, 1024) lies between the profiled proj (1, 2048, 1024, 1024) and
    # qkv (1, 2048, 3072, 1024): w = ln(1536/1024)/ln(3) = 0.36907, rate = r_proj^(1-w) · r_qkv^w
    from emulator.devices import kernels as K
    from emulator.scenario import catalog

    gpu = catalog.gpu("profiled-gpu", str(tmp_path / "cat.yaml"))
    hit = K.lookup(gpu, "gemm", "bf16", (1, 2048, 1536, 1024))
    r1 = 2.0 * 2048 * 1024 * 1024 / _profiled_time(1, 2048, 1024, 1024)
    r2 = 2.0 * 2048 * 3072 * 1024 / _profiled_time(1, 2048, 3072, 1024)
    w = math.log(1.5) / math.log(3)
    assert hit.source == "interpolated" and hit.rate == pytest.approx(r1 ** (1 - w) * r2 ** w, rel=1e-5)
