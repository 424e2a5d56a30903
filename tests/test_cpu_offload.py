"""Megatron-Core's layer-wise CPU offloading through Transformer Engine (emulator/workload/cpu_offload.py): which
layers, TE's waits, the memory left on the GPU, the copies' time, and Megatron-Core's refusals."""
import json

import pytest

from emulator.errors import ScenarioError
from emulator.scenario import load_scenario_text
from emulator.studies.rank import estimate_iteration
from emulator.workload import models as M
from emulator.workload.activations import layer_activation_bytes
from emulator.workload.cpu_offload import finish_before, pass_with_copies, reload_at
from emulator.workload.memory import memory_report

BASE = """name: cpu
cluster: {nodes: 1, node: gb200-nvl72}
model: {preset: gpt3-1.3b}
training: {global_batch: 8, micro_batch: 1, attention: flash%s}
parallel: {tp: 1, pp: 1, dp: 4, zero: 1}
"""


def scenario(extra: str = ""):
    return load_scenario_text(BASE % extra, "cpu.yaml")


def test_tes_synchronisation_points():
    # L 24, K 5: layer 2's copy must be done before layer 24 − 5 + 2 = 21's forward; its reload starts as
    # layer 24 − 1 − 5 + 2 = 20's backward begins
    assert finish_before(2, 24, 5) == 21 and reload_at(2, 24, 5) == 20


def test_a_micro_batch_with_its_copies_by_hand():
    # 3 layers of 1 s forward and 2 s backward, the first 2 offloaded, 3 s a copy each way:
    # forward: layer 0 ends at 1, its copy 1-4; layer 1 starts when layer 0's copy is done (L − K + 0 = 1): 4-5,
    # its copy 5-8; layer 2 waits for it: 8-9. Backward: layer 2 9-11; layer 1's reload starts as layer 1's
    # backward begins (L − 1 − K + 1 = 1): 11-14, its backward 14-16; layer 0's reload 16-19, its backward 19-21
    assert pass_with_copies(1.0, 2.0, 3.0, 3, 2) == 21.0
    assert pass_with_copies(1.0, 2.0, 3.0, 3, 0) == 9.0  # 3 x 1 + 3 x 2


def test_the_gpu_keeps_l_minus_k_layers():
    sc = scenario()
    off = scenario(", cpu_offloading: true, cpu_offloading_num_layers: 10")
    m = M.resolve(sc.model)
    # one micro-batch in flight (pp 1) of all 24 layers; 10 of them go to the host
    per = layer_activation_bytes(m, 1, m.seq_len, 1, False, "none", True, 2, 1)
    plain, less = memory_report(sc), memory_report(off)
    assert plain.breakdown["activations"] - less.breakdown["activations"] == pytest.approx(10 * per)
    assert less.host_bytes == pytest.approx(10 * per) and plain.host_bytes == 0.0


def test_the_copies_and_their_waits_in_the_run(capsys, tmp_path):
    from emulator.cli import main

    path = tmp_path / "cpu.yaml"
    path.write_text(BASE % "")
    sets = ["--set", "training.cpu_offloading=true", "--set", "cluster.node.host_bandwidth=10 GB/s",
            "--set", "training.cpu_offloading_num_layers=23"]
    assert main(["run", str(path), "--json", *sets]) == 0
    s = json.loads(capsys.readouterr().out)
    sc = scenario(", cpu_offloading: true, cpu_offloading_num_layers: 23")
    m = M.resolve(sc.model)
    per = layer_activation_bytes(m, 1, m.seq_len, 1, False, "none", True, 2, 1)
    # 2 micro-batches a rank (8 / (1 x 4)), 23 layers each, per / 10 GB/s a copy, each way
    assert s["offload"]["d2h_s"] == pytest.approx(2 * 23 * per / 10e9, rel=1e-6)
    assert s["offload"]["h2d_s"] == pytest.approx(2 * 23 * per / 10e9, rel=1e-6)
    assert s["offload"]["exposed_s"] > 0  # each copy is waited for by the next layer (L − K = 1)
    assert s["memory"]["host_bytes_per_gpu"] == pytest.approx(23 * per)  # 23 layers of one micro-batch pinned
    est = estimate_iteration(load_scenario_text(BASE % ", cpu_offloading: true, cpu_offloading_num_layers: 23",
                                                "cpu.yaml", ["cluster.node.host_bandwidth=10 GB/s"]))
    assert est.iteration_s == pytest.approx(s["iteration_time_s"], rel=0.05)


@pytest.mark.parametrize("extra, key, words", [
    (", cpu_offloading_num_layers: 3", "training.cpu_offloading_num_layers", "read with training.cpu_offloading"),
    (", cpu_offloading: true, cpu_offloading_num_layers: 24", "training.cpu_offloading_num_layers",
     "only for layers less than 24"),
    (", cpu_offloading: true, recompute: selective", "training.cpu_offloading", "recomputation"),
    (", cpu_offloading: true, cuda_graph_impl: local", "training.cpu_offloading", "CUDA graphs"),
])
def test_megatron_cores_refusals(extra, key, words):
    with pytest.raises(ScenarioError, match=words) as err:
        scenario(extra)
    assert err.value.key == key


def test_no_pipeline_parallelism():
    with pytest.raises(ScenarioError, match="pipeline parallelism") as err:
        load_scenario_text((BASE % ", cpu_offloading: true").replace("pp: 1, dp: 4", "pp: 2, dp: 2"), "cpu.yaml")
    assert err.value.key == "training.cpu_offloading"
