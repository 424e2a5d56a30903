"""Tests of emulator/importers/kineto_overlap.py (the compute slowdown under resident NCCL kernels)
and of its use by `emulator calibrate --kineto` (tools/calibrate.py)."""
from __future__ import annotations

import argparse
import json
import os

import pytest
import yaml

from emulator.errors import EmulatorError
from emulator.importers.kineto_overlap import Kernel, kernels_of, measure_files, measure_overlap, weighted_quantile
from emulator.importers.native import TraceError
from emulator.scenario import catalog
from emulator.tools.calibrate import NothingToFit, add_arguments, calibrate_command, written_slowdown

TRACES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "traces")  # vendored real traces (READMEs there)
RESNET = os.path.join(TRACES, "resnet-ddp-a100-all-steps", "rank0-gpu.json.gz")  # every step, GPU side
DLRM = os.path.join(TRACES, "dlrm-8rank-v100")  # the 8 rank files as recorded

NCCL = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)"
# group name → (durations under comm, durations alone), in us
GROUPS = {
    "A": ([30, 33, 36], [20, 22, 24]),  # medians 33 / 22 = 1.5; weight 99 + 66 = 165
    "B": ([22, 24, 26], [20, 20, 20]),  # 24 / 20 = 1.2; weight 72 + 60 = 132
    "C": ([30, 30, 30], [30, 30, 30]),  # 30 / 30 = 1.0; + one alone on device 1 (below): weight 90 + 120 = 210
    "D": ([40, 40], [40, 40, 40]),  # only 2 under comm: no ratio
    "E": ([9, 9, 9], [5, 5, 5]),  # median alone 5 us < 10 us: no ratio (a 1-us clock's ticks)
}


def _kernel(name, ts, dur, stream, corr, device=0):
    return {"ph": "X", "cat": "kernel", "name": name, "pid": device, "tid": stream, "ts": ts, "dur": dur,
            "args": {"device": device, "stream": stream, "correlation": corr, "grid": [8, 1, 1], "block": [256, 1, 1]}}


def overlap_trace(groups: dict = GROUPS) -> dict:
    """NCCL resident on stream 20 over [1000, 1500] us; compute on stream 7: each group's
    under-comm instances back to back from 1010 us, its alone ones from 2000 us."""
    ev = []
    corr = 0

    def add(name, ts, dur, stream=7, device=0):
        nonlocal corr
        corr += 1
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 9, "tid": 1,
                   "ts": ts - 5, "dur": 1, "args": {"correlation": corr}})
        ev.append(_kernel(name, ts, dur, stream, corr, device))

    add(NCCL, 1000, 500, stream=20)
    t_under, t_alone = 1010, 2000
    for name, (under, alone) in groups.items():
        for d in under:
            add(name, t_under, d)
            t_under += d
        for d in alone:
            add(name, t_alone, d)
            t_alone += d
    assert t_under <= 1490  # every under-comm instance lies inside the NCCL kernel
    if "C" in groups:
        add("C", 1200, 30, device=1)  # another GPU's kernel during device 0's NCCL kernel: alone
    if "A" in groups:
        add("A", 1490, 20)  # [1490, 1510]: half under comm (10 of 20 us): neither side
    return {"schemaVersion": 1, "traceEvents": ev}


def test_hand_trace_factor_and_spread():
    fit = measure_overlap(kernels_of(overlap_trace()))
    assert [(g.key.split(" | ")[0], g.under, g.alone) for g in fit.groups] == [("A", 3, 3), ("B", 3, 3), ("C", 3, 4)]
    assert [g.ratio for g in fit.groups] == pytest.approx([1.5, 1.2, 1.0])
    assert [g.weight for g in fit.groups] == pytest.approx([165e-6, 132e-6, 210e-6])
    # ratios sorted with their weights: 1.0 (210), 1.2 (132), 1.5 (165); total 507 us
    # median: half = 253.5; 210 < 253.5, 210 + 132 = 342 >= 253.5 -> 1.2
    # q1: 126.75 -> 210 reaches it -> 1.0; q3: 380.25 -> 342 falls short, 507 -> 1.5
    assert (fit.factor, fit.q1, fit.q3) == pytest.approx((1.2, 1.0, 1.5))
    assert fit.kernels == 6 + 6 + 7  # A, B, C instances used
    # compute kernels: A 6 + 1 half-overlapped, B 6, C 7, D 5, E 6 = 31
    # under comm: A 3 + B 3 + C 3 + D 2 + E 3 = 14; alone: A 3 + B 3 + C 4 + D 3 + E 3 = 16
    assert (fit.compute, fit.under, fit.alone) == (31, 14, 16)
    assert fit.enough and fit.why_not() == ""


def test_ninety_percent_overlap_counts_as_under_comm():
    # NCCL [0, 100] us on stream 2; a 10-us kernel at [91, 101] overlaps 9 us = 90%: under comm;
    # one at [92, 102] overlaps 8 us = 80%: neither
    ks = [Kernel(0.0, 100e-6, 0, 2, "nccl", True), Kernel(91e-6, 10e-6, 0, 1, "k", False),
          Kernel(92e-6, 10e-6, 0, 1, "k", False)]
    fit = measure_overlap(ks)
    assert (fit.under, fit.alone, fit.compute) == (1, 0, 2)


def test_pooled_ranks_keep_their_own_nccl():
    # rank 0 has NCCL over [0, 1000] us; rank 1's kernels at the same times run alone
    ks = [Kernel(0.0, 1000e-6, 0, 2, "nccl", True)]
    ks += [Kernel(i * 100e-6, 20e-6, 0, 1, "k", False, rank=0) for i in range(3)]  # under comm, 20 us
    ks += [Kernel(i * 100e-6, 10e-6, 0, 1, "k", False, rank=1) for i in range(3)]  # alone, 10 us
    fit = measure_overlap(ks)
    assert fit.factor == pytest.approx(2.0)  # 20 / 10
    assert not fit.enough  # one group of the 3 needed
    assert fit.why_not().startswith("1 kernel groups (median alone >= 10 us)")


def test_weighted_quantile_is_order_free():
    # values 3, 1, 2 with weights 1, 1, 2 (total 4): sorted 1 (1), 2 (2), 3 (1); half 2 -> 1 + 2 = 3 >= 2 -> 2
    assert weighted_quantile([3, 1, 2], [1, 1, 2], 0.5) == 2
    assert weighted_quantile([1, 2, 3], [1, 2, 1], 0.25) == 1  # 1 >= 0.25 x 4 = 1
    assert measure_overlap(kernels_of(overlap_trace())) == measure_overlap(list(reversed(kernels_of(overlap_trace()))))


def test_not_enough_evidence():
    two = {k: GROUPS[k] for k in ("A", "B")}
    fit = measure_overlap(kernels_of(overlap_trace(two)))
    assert len(fit.groups) == 2 and not fit.enough
    # 2 groups; compute kernels A 7 + B 6 = 13, under 3 + 3 = 6, alone 3 + 3 = 6
    assert fit.why_not() == ("2 kernel groups (median alone >= 10 us) ran at least 3 times both under a resident "
                             "NCCL kernel (>= 90% overlap) and alone, 3 needed (of 13 compute kernels, 6 under "
                             "comm, 6 alone)")
    none = measure_overlap([Kernel(0.0, 1e-5, 0, 1, "k", False)])
    assert none.factor is None and none.groups == () and not none.enough


def test_bad_kernel_args_name_the_file(tmp_path):
    data = overlap_trace()
    data["traceEvents"][1]["args"]["stream"] = "seven"
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(data))
    with pytest.raises(TraceError, match=r"bad.json: kernel 'ncclKernel_AllReduce.*'stream' is 'seven', "
                                         "expected an integer"):
        measure_files([str(p)])


# ---------------------------------------------------------------------------- emulator calibrate


def run(*argv: str) -> str:
    parser = argparse.ArgumentParser(prog="emulator calibrate")
    add_arguments(parser)
    return calibrate_command(parser.parse_args(list(argv)))


def test_calibrate_round_trip_writes_the_field(tmp_path):
    trace, out = tmp_path / "ovl.json", tmp_path / "cat.yaml"
    trace.write_text(json.dumps(overlap_trace()))
    text = run("--kineto", str(trace), "--base", "dgx-a100", "--name", "ovl-a100", "--out", str(out))
    assert ("comm_overlap_slowdown 1.2000: duration-weighted median of 3 kernel groups' ratios "
            "(IQR 1.0000-1.5000), 19 kernels under a resident NCCL kernel or alone") in text
    assert "no compute efficiency" in text  # no aten op with shapes: the factor alone is written
    entry = yaml.safe_load(out.read_text())
    assert entry["gpus"]["ovl-a100-gpu"]["comm_overlap_slowdown"] == pytest.approx(1.2)
    node = catalog.node("ovl-a100", user=str(out))
    assert node.gpu.comm_overlap_slowdown == pytest.approx(1.2)
    assert node.gpu.peak_flops == catalog.node("dgx-a100").gpu.peak_flops  # the base's facts carry over
    assert "gemm_efficiency" not in entry["gpus"]["ovl-a100-gpu"]


def test_calibrate_leaves_the_field_out_without_evidence(tmp_path):
    from test_kineto import hand_trace

    trace, out = tmp_path / "one.json", tmp_path / "cat.yaml"
    trace.write_text(json.dumps(hand_trace()))
    text = run("--kineto", str(trace), "--base", "dgx-a100", "--out", str(out))
    # the hand trace's relu kernel overlaps its all-reduce, but once: no group has 3 on both sides
    assert "comm_overlap_slowdown left out: 0 kernel groups" in text
    gpu = yaml.safe_load(out.read_text())["gpus"]["dgx-a100-calibrated-gpu"]
    assert "comm_overlap_slowdown" not in gpu and "gemm_efficiency" in gpu
    two = tmp_path / "two.json"  # neither shapes nor enough overlap: the old error stands
    two.write_text(json.dumps(overlap_trace({k: GROUPS[k] for k in ("A", "B")})))
    with pytest.raises(NothingToFit, match="two.json: no kernel is launched under an aten op with shapes"):
        run("--kineto", str(two))


def test_a_factor_below_one_is_written_as_one():
    fit = measure_overlap(kernels_of(overlap_trace({"A": ([20] * 3, [25] * 3), "B": ([20] * 3, [25] * 3),
                                                     "C": ([20] * 3, [25] * 3)})))
    assert fit.factor == pytest.approx(0.8)  # 20 / 25 in every group
    base = catalog.node("dgx-a100").gpu
    assert written_slowdown(fit, base) == 1.0  # the catalog's range starts at 1 (none)


def test_resnet_ddp_trace_reproduces_the_readme_row():
    # the README's calibration table: ResNet-50 DDP rank 0 on A100, all 3 steps
    fit = measure_files([RESNET])
    assert (len(fit.groups), fit.kernels) == (23, 483)
    assert (round(fit.factor, 4), round(fit.q1, 4), round(fit.q3, 4)) == (1.0443, 0.9879, 1.1351)


@pytest.mark.parametrize("value, message", [
    ("'x'", "expected a number, got 'x'"),
    ("0.5", "expected a number from 1 to 10, got 0.5"),
])
def test_a_catalog_value_out_of_range_is_one_clear_error(tmp_path, value, message):
    p = tmp_path / "cat.yaml"
    p.write_text("gpus:\n  g:\n    peak_flops: 312 TFLOP/s\n    hbm_bandwidth: 2039 GB/s\n    memory: 80 GiB\n"
                 f"    comm_overlap_slowdown: {value}\n")
    with pytest.raises(EmulatorError, match=f"cat.yaml: g.comm_overlap_slowdown: {message}"):
        catalog.gpu("g", user=str(p))


def test_dlrm_ranks_pooled_reproduce_the_readme_rows():
    files = sorted(os.path.join(DLRM, f) for f in os.listdir(DLRM) if f.endswith(".json.gz"))
    assert all(not measure_files([f]).groups for f in files)  # no single rank has a usable group
    fit = measure_files(files)
    # linearize_index (12 under, 4 alone: 1.0, 289 us), split_embedding warp_per_row (5, 3: 1.0, 105 us),
    # volta_sgemm_64x32 (5, 3: 0.9, 76 us); total 470 us: 0.9 holds 76 < 117.5 (a quarter), so q1 = median = q3 = 1.0
    assert [round(g.ratio, 6) for g in fit.groups] == [1.0, 1.0, 0.9] and fit.kernels == 16 + 8 + 8
    assert (fit.factor, fit.q1, fit.q3) == (1.0, 1.0, 1.0)


def test_calibrate_out_to_a_folder_that_cannot_be_made_is_one_clear_error(tmp_path):
    trace = tmp_path / "ovl.json"
    trace.write_text(json.dumps(overlap_trace()))
    (tmp_path / "file").write_text("")  # a file where the output's folder should be
    with pytest.raises(EmulatorError, match=r"file/cat.yaml: cannot write"):
        run("--kineto", str(trace), "--out", str(tmp_path / "file" / "cat.yaml"))
