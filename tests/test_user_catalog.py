"""A calibrated node written by `emulator calibrate` can be named by a scenario."""
import os

import pytest

from emulator.cli import main
from emulator.scenario import load_scenario

DATA = os.path.join(os.path.dirname(__file__), "data", "nccl")


def test_calibrated_node_is_named_through_cluster_catalog(tmp_path, capsys):
    out = tmp_path / "my.yaml"
    assert main(["calibrate", "--nccl-log", os.path.join(DATA, "dgx-a100-2gpu.log"), "--nccl-log",
                 os.path.join(DATA, "all_reduce_perf-dgx-a100-8gpu.log"), "--base", "dgx-a100",
                 "--name", "my-dgx", "--out", str(out)]) == 0
    capsys.readouterr()
    sc_path = tmp_path / "sc.yaml"
    sc_path.write_text("name: c\ncluster:\n  nodes: 1\n  node: my-dgx\n  catalog: my.yaml\n")
    sc = load_scenario(str(sc_path))
    # the logs were written from nccl.csv: busbw 230 GB/s on 300 GB/s NVLink → efficiency 230/300
    assert sc.cluster.node.name == "my-dgx"
    assert sc.cluster.node.intra_efficiency == pytest.approx(230 / 300, rel=2e-3)
    # launch 6.05 us and 1.975 us per step (1.675 us + two 0.15 us links)
    assert sc.cluster.node.collective_launch == pytest.approx(6.05e-6, rel=1e-3)
    assert sc.cluster.node.step_latency_intra == pytest.approx(1.675e-6, rel=1e-3)


def test_unknown_node_in_user_catalog_suggests_names(tmp_path):
    (tmp_path / "cat.yaml").write_text("nodes:\n  box:\n    gpu: A100-SXM4-80GB\n    gpus_per_node: 2\n"
                                       "    intra: nvswitch\n    intra_bandwidth: 100 GB/s\n"
                                       "    intra_latency: 1 us\n    intra_efficiency: 0.8\n    nics: 0\n"
                                       "    nic_bandwidth: 100 Gb/s\n    nic_latency: 1 us\n    nic_efficiency: 0.9\n")
    (tmp_path / "sc.yaml").write_text("name: c\ncluster:\n  nodes: 1\n  node: bax\n  catalog: cat.yaml\n")
    from emulator.errors import ScenarioError

    with pytest.raises(ScenarioError, match='did you mean "box"'):
        load_scenario(str(tmp_path / "sc.yaml"))


def test_incomplete_user_catalog_entry_names_what_is_missing(tmp_path):
    (tmp_path / "cat.yaml").write_text("nodes:\n  box:\n    gpu: A100-SXM4-80GB\n    gpus_per_node: 2\n")
    (tmp_path / "sc.yaml").write_text("name: c\ncluster:\n  nodes: 1\n  node: box\n  catalog: cat.yaml\n")
    from emulator.errors import ScenarioError

    with pytest.raises(ScenarioError, match="cluster.catalog: .*cat.yaml: box: missing .*intra"):
        load_scenario(str(tmp_path / "sc.yaml"))


def test_kineto_fitted_gemm_efficiency_reaches_the_compute_model(tmp_path, capsys):
    import json

    from test_kineto import hand_trace

    from emulator.devices import compute

    trace = tmp_path / "one.json"
    trace.write_text(json.dumps(hand_trace()))
    out = tmp_path / "cat.yaml"
    assert main(["calibrate", "--kineto", str(trace), "--base", "dgx-a100", "--name", "box", "--out", str(out)]) == 0
    capsys.readouterr()
    (tmp_path / "sc.yaml").write_text("name: c\ncluster:\n  nodes: 1\n  node: box\n  catalog: cat.yaml\n")
    gpu = load_scenario(str(tmp_path / "sc.yaml")).cluster.node.gpu
    # the hand trace's one GEMM: 4194304 FLOP in 40 us on a 312 TFLOP/s A100 → 3.3608e-4 of peak
    assert gpu.gemm_efficiency == pytest.approx(4194304 / 40e-6 / 312e12, rel=1e-5)
    assert compute.gemm_max(gpu) == gpu.gemm_efficiency
    # a big GEMM is now costed at that efficiency: 2·4096³ FLOP / (312e12 · 3.3608e-4 · e_tile · k/(k+64)) + 4 us
    e = gpu.gemm_efficiency * compute.tile_efficiency(4096, 4096, gpu) * 4096 / (4096 + 64)
    assert compute.gemm_time(4096, 4096, 4096, gpu) == pytest.approx(2 * 4096**3 / (312e12 * e) + 4e-6, rel=1e-9)
