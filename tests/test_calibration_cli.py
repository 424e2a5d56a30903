"""Tests of emulator/tools/calibrate.py: `emulator calibrate` from nccl-tests logs and a Kineto profile."""
from __future__ import annotations

import argparse
import json
import os

import pytest
import yaml

from emulator.errors import EmulatorError
from emulator.tools.calibrate import CalibrationError, add_arguments, calibrate_command, fit_latency, parse_nccl_log

NCCL = os.path.join(os.path.dirname(__file__), "data", "nccl")
LOG2 = os.path.join(NCCL, "dgx-a100-2gpu.log")
LOG8 = os.path.join(NCCL, "all_reduce_perf-dgx-a100-8gpu.log")


def run(*argv: str) -> str:
    parser = argparse.ArgumentParser(prog="emulator calibrate")
    add_arguments(parser)
    return calibrate_command(parser.parse_args(list(argv)))


def test_parse_nccl_log():
    log = parse_nccl_log(LOG8)
    assert (log.op, log.gpus, log.hosts, len(log.rows)) == ("all_reduce", 8, 1, 31)  # 8 B .. 8 GiB, x2
    assert log.steps == 14  # 2(n-1)
    first, last = log.rows[0], log.rows[-1]
    assert (first.size, first.count, first.dtype, first.time_s) == (8, 2, "float", pytest.approx(33.70e-6))
    assert last.busbw == pytest.approx(229.88e9)  # out-of-place busbw column of the 8 GiB row
    assert parse_nccl_log(LOG2).op == "all_reduce"  # from its "Collective test starting" line


def test_fit_latency_two_points():
    # (2, 10 us) and (14, 33.7 us): per step (33.7 - 10) / 12 = 1.975 us, launch 10 - 2 x 1.975 = 6.05 us
    launch, per = fit_latency([(2, 10e-6), (14, 33.7e-6)], launch_default=0.0)
    assert per == pytest.approx(1.975e-6) and launch == pytest.approx(6.05e-6)
    # one step count: keep the default launch, per step = (33.7 - 6) / 14 = 1.97857 us
    launch, per = fit_latency([(14, 33.7e-6)], launch_default=6e-6)
    assert launch == 6e-6 and per == pytest.approx(27.7e-6 / 14)


def test_calibrate_recovers_dgx_a100(tmp_path):
    out = tmp_path / "my.yaml"
    text = run("--nccl-log", LOG2, "--nccl-log", LOG8, "--base", "dgx-a100", "--name", "my-a100", "--out", str(out))
    assert "wrote node 'my-a100'" in text
    entry = yaml.safe_load(out.read_text())["nodes"]["my-a100"]
    from emulator.scenario.catalog import entry_fields  # the catalog's own key table and unit parsing
    from emulator.scenario.schema import NODE_KEYS

    f = entry_fields("my-a100", entry, NODE_KEYS)
    # busbw reaches 229.88 GB/s of the 300 GB/s NVLink line rate: 230/300 within 0.1 %
    assert f["intra_efficiency"] == pytest.approx(230 / 300, rel=1e-3)
    # launch 6.05 us; per step 1.975 us, of which 2 x 0.15 us are the two link latencies
    assert f["collective_launch"] == pytest.approx(6.05e-6, abs=1e-9)
    assert f["step_latency_intra"] + 2 * f["intra_latency"] == pytest.approx(1.975e-6, abs=1e-9)
    assert f["step_latency_intra"] == pytest.approx(1.675e-6, abs=1e-9)
    assert entry["gpu"] == "A100-SXM4-80GB" and f["gpus_per_node"] == 8
    assert f["nic_efficiency"] == pytest.approx(24 / 25)  # no inter-node log: the base's value stays


def test_calibrate_kineto_gemm(tmp_path):
    from test_kineto import hand_trace

    p = tmp_path / "one.json"
    p.write_text(json.dumps(hand_trace()))
    text = run("--kineto", str(p), "--base", "dgx-a100")
    # aten::mm [64,128] x [128,256]: 2 x 64 x 256 x 128 = 4194304 FLOP in 40 us = 104.8576 GFLOP/s,
    # of the A100's 312 TFLOP/s: 3.3608e-4
    assert "GEMM efficiency 0.0003 of peak over 1 shapes" in text
    from emulator.scenario import catalog
    from emulator.tools.calibrate import fit_compute

    fit = fit_compute(str(p), catalog.node("dgx-a100").gpu)
    assert fit.gemm_efficiency == pytest.approx(4194304 / 40e-6 / 312e12)
    assert fit.memory_efficiency is None  # no elementwise op with recorded shapes


def test_calibrate_kineto_measures_the_hosts_launches(tmp_path):
    from test_kineto import hand_trace

    from emulator.tools.calibrate import fit_host

    p = tmp_path / "one.json"
    p.write_text(json.dumps(hand_trace()))
    # ProfilerStep#3 starts at 1000 us and launches at 1015, 1050, 1060, 1120 and 1122 us. The gaps, less the
    # profiler's 1.4 us for each aten op recorded between (aten::mm at 1010, record_param_comms at 1044) and less
    # the host's sync (cudaStreamSynchronize 1090-1110): 15 - 1.4, 35 - 1.4, 10, 60 - 20, 2 = 99.2 us, 5 launches
    fit = fit_host(str(p))
    assert fit is not None and fit.launches == 5 and fit.seconds == pytest.approx(99.2e-6, abs=1e-12)
    assert fit.host_launch == pytest.approx(19.84e-6, abs=1e-12)
    out = tmp_path / "cat.yaml"
    text = run("--kineto", str(p), "--base", "dgx-a100", "--out", str(out))
    assert "host_launch 19.8 us: the host issued the step's 5 launches in 0.0992 ms" in text
    assert "    host_launch: 19.84 us" in out.read_text()


@pytest.mark.parametrize("argv, message", [
    ((), "give at least one --nccl-log FILE or --kineto FILE"),
    (("--nccl-log", "/nonexistent.log"), "/nonexistent.log: cannot read"),
    (("--nccl-log", LOG8, "--base", "dgx-z9"), "dgx-z9"),
])
def test_bad_input_is_one_clear_error(argv, message):
    with pytest.raises(EmulatorError, match=message):
        run(*argv)


def test_log_without_table_or_op(tmp_path):
    bad = tmp_path / "perf.log"
    bad.write_text("# nThread 1 nGpus 8\nsegfault\n")
    with pytest.raises(CalibrationError, match="perf.log: no nccl-tests table"):
        parse_nccl_log(str(bad))
    text = open(LOG8).read()
    bad.write_text(text)  # a table, but neither a banner nor an operation in the file name
    with pytest.raises(CalibrationError, match="perf.log: cannot tell the operation"):
        parse_nccl_log(str(bad))


H200_TRACE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "traces", "h200-hf-gpt-1.3b",
                          "trace.json.gz")


def test_calibrate_kineto_from_another_gpu_is_refused():
    # the H200 trace against an A100's peak would read 0.5854 x 989.4 / 312 = 1.86 of it: refused, naming both
    with pytest.raises(CalibrationError, match=r"ran on NVIDIA H200 \(catalog GPU H200-SXM\), but --base dgx-a100's "
                                               r"GPU is A100-SXM4-80GB.*\(--base dgx-h200\)"):
        run("--kineto", H200_TRACE, "--base", "dgx-a100")
    text = run("--kineto", H200_TRACE, "--base", "dgx-h200")  # its own GPU: below 1
    assert "GEMM efficiency 0.5854 of peak" in text


def test_calibrate_kineto_never_writes_an_efficiency_above_one(tmp_path):
    from test_kineto import hand_trace

    trace = hand_trace()
    for e in trace["traceEvents"]:
        if e.get("name") == "aten::mm":  # 2 x 8192^3 = 1.09951e12 FLOP in the same 40 us: 2.74878e16 FLOP/s,
            e["args"]["Input Dims"] = [[8192, 8192], [8192, 8192]]  # / an A100's 312 TFLOP/s = 88.10
    p = tmp_path / "fast.json"
    p.write_text(json.dumps(trace))
    with pytest.raises(CalibrationError, match=r"GEMM kernels ran at 88.10 of GPU A100-SXM4-80GB's peak "
                                               r"\(312.0 TFLOP/s\), above 1"):
        run("--kineto", str(p), "--base", "dgx-a100", "--out", str(tmp_path / "c.yaml"))
    assert not (tmp_path / "c.yaml").exists()


def test_calibrate_kineto_from_another_part_of_the_same_chip(tmp_path):
    from test_kineto import hand_trace

    trace = hand_trace()
    trace["deviceProperties"] = [{"id": 0, "name": "NVIDIA A100-SXM4-40GB"}]
    p = tmp_path / "a100-40gb.json"
    p.write_text(json.dumps(trace))
    text = run("--kineto", str(p), "--base", "dgx-a100")
    # the A100 40 GB computes as the 80 GB part (312 TFLOP/s, 108 SMs): its GEMM efficiency is a fraction of the
    # same peak, 4194304 FLOP / 40 us / 312e12 = 3.3608e-4, carried over and said so
    assert "the trace ran on A100-SXM4-40GB, the base GPU's chip with its own memory" in text
    assert "GEMM efficiency 0.0003 of peak over 1 shapes" in text
