"""benchmarks/gpu_profile_check.py --cross without a GPU: it imports and explains itself, and its prediction
rows (the part that needs no GPU) run on the shipped H200 trace, here standing in for a lent GPU's."""
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import gpu_profile_check as G  # noqa: E402

SHARED = G.H200_TRACES[0]  # ../shared/traces/kineto/h200-hf-gpt-1.3b/trace.json.gz


def test_help_names_the_cross_mode(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["gpu_profile_check.py", "--help"])
    with pytest.raises(SystemExit) as done:
        G.main()
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "--cross" in out and "--json" in out and "--no-compile" in out


def test_cross_needs_a_json_path(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "argv", ["gpu_profile_check.py", "--cross", "--out", str(tmp_path)])
    with pytest.raises(SystemExit) as done:
        G.main()
    assert done.value.code == 2 and "--cross needs --json FILE" in capsys.readouterr().err


def test_the_lent_gpus_node_is_found_by_its_cuda_name():
    assert G.node_of("NVIDIA H100 80GB HBM3") == "dgx-h100"
    assert G.node_of("NVIDIA H200") == "dgx-h200"
    assert G.node_of("NVIDIA H200 NVL") is None  # no catalog GPU: --cross stops, naming it


@pytest.mark.skipif(not os.path.exists(SHARED), reason=f"needs {SHARED} (the shared H200 trace)")
def test_cross_rows_run_on_the_shipped_trace(tmp_path):
    # the H200 trace standing in for an H100's: the "round trip" and "H200 to lent" rows predict it on the H100
    # (translated from the H200), "to H200" on the H200 it ran on
    assert G.h200_trace() == SHARED
    rows = G.h200_rows(SHARED, "dgx-h100", None, str(tmp_path))
    trip, to_h200, back = rows
    assert [r["row"] for r in rows] == ["round trip", "to H200", "H200 to lent"]
    # on its own GPU: within 3% of the 261.35 ms measured (README: medians 262.2 and 260.5 ms)
    assert to_h200["translated_from"] is None and abs(to_h200["error"]) < 0.03
    assert G.H200_MEASURED_S == pytest.approx(0.26135)
    # on the H100: the same tensor cores and clocks, slower HBM (3.35 against 4.8 TB/s), so the memory-bound
    # half of the step runs longer and the step is longer than on the H200, never shorter
    assert trip["translated_from"] == back["translated_from"] == "H200-SXM"
    assert trip["predicted_s"] > to_h200["predicted_s"] and trip["error"] is None
    assert all(0 < r["mfu"] < 1 for r in rows)


def test_cross_prints_one_table_and_writes_its_json(tmp_path, monkeypatch, capsys):
    # the GPU's parts stubbed (no CUDA here): every training "measures" 300 ms and leaves the shipped H200 trace as
    # its profile, so the compiled rows (declared micro-batch 2, the trace's 4) are refused and kept as rows
    torch = pytest.importorskip("torch")
    import shutil

    import benchmarks.profiler_overhead as PO

    def train(c, steps, trace, compiled=False):
        if trace:
            shutil.copy(G.h200_trace(), trace)
        return 0.3, 50 * 2**30

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch._dynamo, "reset", lambda: None)
    monkeypatch.setattr(G, "train", train)
    monkeypatch.setattr(G, "_free", lambda: None)
    monkeypatch.setattr(G, "launch_cost", lambda n=G.LAUNCHES: {"launches": n, "plain_s": 0.1, "cuda_activity_s": 0.12,
                                                                "cpu_cuda_activity_s": 0.15, "per_launch_s": 1e-6,
                                                                "per_launch_and_op_s": 2.5e-6})
    monkeypatch.setattr(PO, "measure", lambda rounds: {"overhead_per_op_s": 1e-6})
    out = tmp_path / "cross.json"
    monkeypatch.setattr(sys, "argv", ["gpu_profile_check.py", "--cross", "--json", str(out), "--out", str(tmp_path)])
    G.main()
    doc = json.loads(out.read_text())
    rows = {r["row"]: r for r in doc["rows"]}
    assert doc["device"] == "NVIDIA H100 80GB HBM3" and doc["node"] == "dgx-h100"
    trip = rows["round trip"]
    assert trip["measured_s"] == 0.3 and trip["error"] == pytest.approx(trip["predicted_s"] / 0.3 - 1)
    assert rows["to H200"]["node"] == "dgx-h200" and rows["to H200"]["measured_s"] == G.H200_MEASURED_S
    assert "micro_batch is 2" in rows["compiled at mb 4"]["refused"]
    out = capsys.readouterr().out
    table = out[out.index("\nrow "):]  # the table after the progress lines (which show each stage's rows too)
    assert table.count("refused:") == 2 and table.count("dgx-h100") == 4 and "CUPTI per launch 1.00 us" in table
