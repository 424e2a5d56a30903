"""Inconsistent or hostile input is refused with one clear message (issue 17, items on input).

Trace consistency (send/recv sizes, group members, duplicate links), a mirrored trace checked
before it is built, physical bounds on bandwidths and latencies, fabric keys that the kind does
not read, paths that are not files, dependency cycles, and the commands that used to do
nothing (calibrate, plot, search --gpus, collective --sizes/--gpus).
"""
import dataclasses
import json
import os

import pytest
from helpers import custom_scenario, star, write_graph

from emulator.errors import EmulatorError, ScenarioError
from emulator.importers import load_workload
from emulator.importers.native import TraceError, load_trace
from emulator.network.topology import load_graph
from emulator.program import COMPUTE, Op, Program
from emulator.run.engine import DeadlockError
from emulator.run.simulation import run_program
from emulator.scenario import load_scenario, load_scenario_text

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESNET = os.path.join(ROOT, "traces", "resnet-ddp-a100")  # one rank of a DDP job (Kineto)


def _trace(tmp_path, ops, ranks=2):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"format": "emulator-trace", "version": 1, "ranks": ranks, "ops": ops}))
    return str(path)


# ---------------------------------------------------------------- trace consistency


def test_send_and_recv_of_different_sizes_are_refused(tmp_path):
    # rank 0 sends 1000 B to rank 1 (tag 5); rank 1's recv expects 2000 B: the engine used to move 1000 B
    path = _trace(tmp_path, [
        {"id": 0, "rank": 0, "kind": "send", "peer": 1, "bytes": 1000, "tag": 5},
        {"id": 7, "rank": 1, "kind": "recv", "peer": 0, "bytes": 2000, "tag": 5}])
    with pytest.raises(TraceError) as err:
        load_trace(path)
    assert str(err.value) == (
        f"{path}: send op 0 (rank 0 to rank 1, tag 5) carries 1000 B but the recv it pairs with, op 7 on rank 1, "
        "expects 2000 B (send and recv #1 from rank 0 to rank 1 with tag 5); expected the same size on both sides")


def test_sends_pair_with_recvs_in_file_order(tmp_path):
    # two sends 0→1 on tag 0 (100 B, then 300 B) meet two recvs in the same order: consistent
    ops = [{"id": 0, "rank": 0, "kind": "send", "peer": 1, "bytes": 100},
           {"id": 1, "rank": 0, "kind": "send", "peer": 1, "bytes": 300},
           {"id": 2, "rank": 1, "kind": "recv", "peer": 0, "bytes": 100},
           {"id": 3, "rank": 1, "kind": "recv", "peer": 0, "bytes": 300}]
    assert [op.bytes for op in load_trace(_trace(tmp_path, ops)).ops] == [100, 300, 100, 300]
    # swapped recvs: the first send (100 B) would meet the first recv (300 B)
    ops[2]["bytes"], ops[3]["bytes"] = 300, 100
    with pytest.raises(TraceError, match=r"send op 0 .* carries 100 B but the recv it pairs with, op 2 on rank 1, "
                                         r"expects 300 B \(send and recv #1 "):
        load_trace(_trace(tmp_path, ops))


def test_a_group_with_a_repeated_member_is_refused(tmp_path):
    path = _trace(tmp_path, [{"id": 0, "rank": 0, "kind": "collective", "op": "all_reduce", "group": [0, 0, 1],
                              "bytes": 64}], ranks=2)
    with pytest.raises(TraceError) as err:
        load_trace(path)
    assert str(err.value) == f"{path}: ops[0]: group: [0, 0, 1] lists rank 0 more than once; expected each member once"


def test_a_kineto_process_group_with_a_repeated_member_is_refused(tmp_path):
    from test_kineto import hand_trace

    from emulator.importers.kineto_reader import read_rank

    data = hand_trace()
    bcast = next(e for e in data["traceEvents"] if "Broadcast" in e.get("name", ""))
    bcast["args"]["Process Group Ranks"] = "[0, 0, 1]"
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(data))
    with pytest.raises(TraceError, match=r"rank0.json: NCCL kernel at ts 1126 us: process group ranks \[0, 0, 1\] "
                                         "list rank 0 more than once"):
        read_rank(str(path))


def test_a_graph_that_lists_a_link_twice_is_refused(tmp_path):
    nodes = [{"id": "g0", "kind": "gpu"}, {"id": "g1", "kind": "gpu"}]
    links = [{"src": "g0", "dst": "g1", "bandwidth": 100e9}, {"src": "g1", "dst": "g0", "bandwidth": 100e9},
             {"src": "g0", "dst": "g1", "bandwidth": 25e9}]  # the last one used to win: 25 GB/s
    path = write_graph(tmp_path, nodes, links)
    with pytest.raises(EmulatorError) as err:
        load_graph(path)
    assert str(err.value) == (f"{path}: links[2]: the link g0 -> g1 is already links[0]; expected each directed "
                              "link once (give parallel cables as one link of their total bandwidth)")
    topo = load_graph(write_graph(tmp_path, nodes, links[:2]))  # each direction once: two links of 100 GB/s
    assert topo.capacity == [100e9, 100e9]


# ---------------------------------------------------------------- a mirrored trace


def _mirrored(tmp_path, mirror, gpus=2):
    text = (f"name: m\ncluster: {{nodes: 1, node: {{preset: dgx-a100, gpus_per_node: {gpus}}}}}\n"
            f"workload: {{trace: {RESNET}, format: kineto, mirror: {mirror}}}\n")
    path = tmp_path / "m.yaml"
    path.write_text(text)
    return str(path)


def test_mirror_beyond_the_gpus_is_refused_when_the_scenario_loads(tmp_path, monkeypatch):
    import emulator.importers.kineto as kineto

    monkeypatch.setattr(kineto, "load_kineto", lambda *a, **k: pytest.fail("the trace was built"))
    path = _mirrored(tmp_path, 2000)
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert str(err.value) == (f"{path}:3: workload.mirror: mirror 2000 replays the trace as 2000 ranks, but the "
                              "cluster has 2 GPUs; expected at most 2")
    # a scenario made in code skips the loader: the importer checks before it builds
    ok = load_scenario(_mirrored(tmp_path, 2))
    bad = dataclasses.replace(ok, workload=dataclasses.replace(ok.workload, mirror=3))
    with pytest.raises(EmulatorError, match="workload.mirror: 3 ranks but the cluster has 2 GPUs; expected at most 2"):
        load_workload(bad)


def test_mirror_has_a_bound_in_the_key_table(tmp_path):
    # 2**20 = 1048576 ranks at most (the old bound, 10**7, let 1,000,000 through: 20.7 GB)
    with pytest.raises(ScenarioError, match="workload.mirror: expected an integer from 0 to 1048576, got 1048577"):
        load_scenario(_mirrored(tmp_path, 2**20 + 1))


# ---------------------------------------------------------------- physical bounds


NODE = "name: b\ncluster:\n  nodes: 2\n  node: {{preset: dgx-a100, {key}: {value}}}\nmodel: {{preset: gpt3-125m}}\n" \
       "training: {{global_batch: 16}}\n"


@pytest.mark.parametrize("key, value, message", [
    # 1e-300 Gb/s = 1.25e-292 B/s, under 1 Mb/s = 125000 B/s
    ("nic_bandwidth", "1e-300 Gb/s", 'expected a bandwidth of at least 125000 B/s, got "1e-300 Gb/s"'),
    ("intra_bandwidth", "999 kb/s", 'expected a bandwidth of at least 125000 B/s, got "999 kb/s"'),  # 124875 B/s
    ("nic_latency", "2 s", 'expected a duration from 0 to 1 s, got "2 s"'),
    ("collective_launch", "1001 ms", 'expected a duration from 0 to 1 s, got "1001 ms"'),
])
def test_bandwidths_and_latencies_have_physical_bounds(key, value, message):
    with pytest.raises(ScenarioError) as err:
        load_scenario_text(NODE.format(key=key, value=value), "b.yaml")
    assert str(err.value) == f"b.yaml:4: cluster.node.{key}: {message}"


def test_the_bounds_themselves_are_accepted():
    # 1 Mb/s = 125000 B/s and 1 s are the limits, inclusive
    sc = load_scenario_text(NODE.format(key="nic_bandwidth", value="1 Mb/s"), "b.yaml", ["cluster.node.nic_latency=1 s"])
    assert (sc.cluster.node.nic_bandwidth, sc.cluster.node.nic_latency) == (125e3, 1.0)


# ---------------------------------------------------------------- fabric keys per kind


FABRIC = "name: f\ncluster:\n  nodes: 4\n  node: dgx-a100\n  fabric:\n    kind: {kind}\n    {key}: {value}\n"


@pytest.mark.parametrize("kind, key, value, reads", [
    ("ring", "oversubscription", 2, "fat_tree or rail or fat_tree3 or multi_plane"),
    ("torus", "leaf_size", 2, "fat_tree or rail or fat_tree3 or multi_plane or dragonfly"),
    ("single_switch", "latency", "2 us", "fat_tree or rail or fat_tree3 or multi_plane or dragonfly or ring or torus"),
    ("fat_tree", "torus_dims", "[2, 2]", "torus"),
])
def test_a_fabric_key_the_kind_does_not_read_is_refused(kind, key, value, reads):
    with pytest.raises(ScenarioError) as err:
        load_scenario_text(FABRIC.format(kind=kind, key=key, value=value), "f.yaml")
    assert str(err.value) == (f'f.yaml:7: cluster.fabric.{key}: {key} is only read with kind: {reads} (kind is '
                              f'"{kind}"); remove it, or --set cluster.fabric.{key}= to drop it')


def test_fabric_keys_of_the_kind_load_and_an_empty_set_drops_one():
    sc = load_scenario_text(FABRIC.format(kind="fat_tree", key="oversubscription", value=2), "f.yaml")
    assert sc.cluster.fabric.oversubscription == 2.0
    sc = load_scenario_text(FABRIC.format(kind="fat_tree", key="oversubscription", value=2), "f.yaml",
                            ["cluster.fabric.kind=ring", "cluster.fabric.oversubscription="])
    assert (sc.cluster.fabric.kind, sc.cluster.fabric.oversubscription) == ("ring", 1.0)  # the default


# ---------------------------------------------------------------- paths that are not files


def test_paths_say_what_they_name(tmp_path):
    from emulator.scenario.paths import problem

    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "dangling.json").symlink_to("nowhere.json")
    (tmp_path / "zero.json").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "pipe.json")
    assert problem("/dev/zero") == "a character device, not a regular file"
    assert problem(str(tmp_path / "zero.json")) == 'a character device (a link to "/dev/zero"), not a regular file'
    assert problem(str(tmp_path / "loop")) == "a symbolic link loop (following the links never reaches a file)"
    assert problem(str(tmp_path / "dangling.json")) == \
        'a dangling symbolic link (to "nowhere.json", which does not exist)'
    assert problem(str(tmp_path / "pipe.json")) == "a named pipe, not a regular file"
    assert problem(str(tmp_path)) == "a folder, not a regular file"
    assert problem(str(tmp_path), folder_ok=True) is None
    assert problem(str(tmp_path / "missing.json")) == "file not found"


def test_a_trace_that_names_a_device_or_a_loop_is_called_what_it_is(tmp_path):
    (tmp_path / "loop").symlink_to("loop")
    base = "name: p\ncluster: {nodes: 1, node: dgx-a100}\nworkload: {trace: %s}\n"
    with pytest.raises(ScenarioError) as err:
        load_scenario_text(base % "/dev/zero", str(tmp_path / "p.yaml"))
    assert str(err.value) == f'{tmp_path}/p.yaml:3: workload.trace: a character device, not a regular file: "/dev/zero"'
    with pytest.raises(ScenarioError) as err:
        load_scenario_text(base % "loop", str(tmp_path / "p.yaml"))
    assert str(err.value) == (f"{tmp_path}/p.yaml:3: workload.trace: a symbolic link loop (following the links never "
                              f'reaches a file): "{tmp_path}/loop" ("loop" is read relative to the scenario\'s folder)')


def test_a_kineto_folder_with_a_device_in_it_is_refused(tmp_path):
    from emulator.importers.kineto import load_kineto

    (tmp_path / "rank0.json").symlink_to("/dev/zero")  # would be read for ever
    with pytest.raises(TraceError, match=r"rank0.json: a character device \(a link to \"/dev/zero\"\), not a regular"):
        load_kineto(str(tmp_path))


# ---------------------------------------------------------------- dependency cycles


def test_a_dependency_cycle_is_named(tmp_path):
    # op 0 needs op 2, op 1 needs op 0, op 2 needs op 1: a cycle of three on rank 0; rank 1's op runs
    sc = custom_scenario(star(tmp_path, 2))
    ops = [Op(0, 0, COMPUTE, stream="a", deps=(2,), duration=1.0), Op(1, 0, COMPUTE, stream="b", deps=(0,), duration=1.0),
           Op(2, 0, COMPUTE, stream="c", deps=(1,), duration=1.0), Op(3, 1, COMPUTE, duration=1.0)]
    with pytest.raises(DeadlockError) as err:
        run_program(Program(2, ops), sc)
    lines = str(err.value).splitlines()
    assert lines[0] == "deadlock: a dependency cycle: 3 of 4 ops can never finish (simulated time 1 s). Waiting:"
    assert lines[1] == ("  cycle: op 0 (rank 0 a) -> op 1 (rank 0 b) -> op 2 (rank 0 c) -> op 0 (rank 0 a) (each must "
                        "end before the next can start: a dependency, or the op before it on its stream)")


def test_a_deadlock_without_a_cycle_names_none(tmp_path):
    from emulator.program import RECV

    sc = custom_scenario(star(tmp_path, 2))
    with pytest.raises(DeadlockError) as err:
        run_program(Program(2, [Op(0, 0, RECV, peer=1, bytes=10), Op(1, 1, COMPUTE, duration=1.0)]), sc)
    assert "cycle" not in str(err.value) and str(err.value).startswith("deadlock: 1 of 2 ops")


# ---------------------------------------------------------------- commands that did nothing


def _calibrate_kineto(tmp_path, data):
    from test_calibration_cli import run

    path = tmp_path / "one.json"
    path.write_text(json.dumps(data))
    return run("--kineto", str(path), "--base", "dgx-a100"), str(path)


def test_calibrate_kineto_without_shapes_fails(tmp_path):
    from test_kineto import hand_trace

    from emulator.tools.calibrate import CalibrationError

    data = hand_trace()
    for e in data["traceEvents"]:
        e.get("args", {}).pop("Input Dims", None)  # recorded with record_shapes=False
    with pytest.raises(CalibrationError) as err:
        _calibrate_kineto(tmp_path, data)
    # one aten op launches kernels (aten::mm: the GEMM); it has no 'Input Dims'
    assert str(err.value) == (f"{tmp_path}/one.json: the trace was recorded without shapes: none of its 1 aten ops "
                              "that launch kernels has 'Input Dims', so nothing can be fitted; profile with "
                              "record_shapes=True")
    data = hand_trace()
    mm = next(e for e in data["traceEvents"] if e.get("name") == "aten::mm")
    mm["name"] = "aten::cumsum"  # shapes, but neither a GEMM nor an elementwise op
    with pytest.raises(CalibrationError, match="nothing to fit: none of the 1 aten ops with shapes is a GEMM"):
        _calibrate_kineto(tmp_path, data)


def test_plot_of_an_unknown_field_fails(tmp_path):
    from test_plot import _study

    from emulator.studies.plot import PlotError, plot_study

    db = _study(tmp_path, ["simulation.iterations=1,2"])
    with pytest.raises(PlotError) as err:
        plot_study(db, str(tmp_path / "x.png"), x="no.such.key")
    assert str(err.value) == ("--x no.such.key: no row has this scenario field (expected a key path such as "
                              "parallel.tp or cluster.fabric.oversubscription); the varied fields are "
                              "simulation.iterations")
    with pytest.raises(PlotError, match="--by parallel.nope: no row has this scenario field"):
        plot_study(db, str(tmp_path / "x.png"), x="simulation.iterations", by="parallel.nope")
    assert not os.path.exists(tmp_path / "x.png")


def test_search_gpus_replaces_the_base_layout(tmp_path):
    from emulator.studies.executor import LocalExecutor
    from emulator.studies.search import Limits, search
    from emulator.studies.store import ResultStore

    path = tmp_path / "s.yaml"
    path.write_text("name: s\ncluster: {nodes: 1, node: dgx-a100}\nmodel: {preset: gpt3-125m}\n"
                    "training: {global_batch: 16}\nparallel: {tp: 2, dp: 4}\n")  # 2*4 = the node's 8 GPUs
    # on 16 GPUs with tp, pp ≤ 1, mb 1, ZeRO 0: one shape, dp = 16 (16 % (1*16) = 0), no recompute needed
    with ResultStore(str(tmp_path / "s.sqlite")) as store:
        res = search(str(path), [], 16, Limits(max_tp=1, max_pp=1, micro_batches=(1,), zero=(0,)), store,
                     LocalExecutor(1))
    assert len(res.plan.layouts) == 1 and res.points[0].scenario.gpus == 16
    best = res.ranked[0].varied
    assert (best["parallel.tp"], best["parallel.pp"], best["parallel.dp"]) == (1, 1, 16)


def test_collective_sizes_are_whole_bytes_and_gpus_zero_is_an_error():
    from emulator.tools.collective_bench import collective_table, size_range

    with pytest.raises(EmulatorError) as err:
        size_range("1.5B:10B")
    assert str(err.value) == "--sizes: MIN is 1.5 B; expected a whole number of bytes, got '1.5B:10B'"
    assert size_range("1KiB:4KiB") == [1024, 2048, 4096]  # doubling from 1024 B
    sc = load_scenario(os.path.join(ROOT, "scenarios", "quickstart.yaml"))  # one DGX A100: 8 GPUs
    for bad in (0, -1, 1):
        with pytest.raises(EmulatorError, match=f"--gpus: expected at least 2 .*, got {bad}"):
            collective_table(sc, "all_reduce", [1e6], bad)
    [row] = collective_table(sc, "all_reduce", [1e6])  # omitted: all 8 GPUs, busbw = algbw × 2(8-1)/8 = 1.75
    assert row["busbw_GB_per_s"] == pytest.approx(row["algbw_GB_per_s"] * 1.75)


@pytest.mark.parametrize("argv, line", [
    (["collective", "scenarios/quickstart.yaml", "--gpus", "0"],
     "emulator: --gpus: expected at least 2 (the GPUs of the collective; omit it for all), got 0"),
    (["collective", "scenarios/quickstart.yaml", "--sizes", "1.5B:10B"],
     "emulator: --sizes: MIN is 1.5 B; expected a whole number of bytes, got '1.5B:10B'"),
    (["run", "scenarios/replay-resnet50-mirrored-2xa100.yaml", "--set", "workload.mirror=2000"],
     "emulator: --set workload.mirror=2000: workload.mirror: mirror 2000 replays the trace as 2000 ranks, but the "
     "cluster has 2 GPUs; expected at most 2"),
])
def test_the_cli_exits_2_with_one_line(argv, line, capsys, monkeypatch):
    from emulator.cli import main

    monkeypatch.chdir(ROOT)
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err == line + "\n" and captured.out == ""
