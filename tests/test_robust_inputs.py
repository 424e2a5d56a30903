"""Issue 30: options that did nothing are applied or refused by name, and misleading messages are fixed
(placement spread on every leaf fabric, model and trace together, spines/cores 0, a misspelt or
BOM-prefixed CSV column, a job's trace folder, a top-level key inside a job, node_fail's file,
deadlock reports on several lines)."""
import os
import textwrap

import pytest

from emulator import cli
from emulator.errors import ScenarioError
from emulator.scenario import load_scenario
from emulator.tools.validate import ValidationError, read_cases

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _write(tmp_path, text, name="s.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


@pytest.mark.parametrize("fabric", [
    "{kind: fat_tree, leaf_size: 2}",
    "{kind: rail, leaf_size: 2}",
    "{kind: fat_tree3, leaf_size: 2, pod_size: 2}",
    "{kind: multi_plane, leaf_size: 2}",
    "{kind: dragonfly, leaf_size: 2, group_size: 2, global_links: 1}",
])
def test_spread_round_robins_over_the_leaves_of_every_leaf_fabric(tmp_path, fabric):
    # 8 nodes, leaves of 2: {0,1} {2,3} {4,5} {6,7}; spread takes the lowest free node of each leaf in
    # turn: a gets 0, 2, 4, 6; b the rest, 1, 3, 5, 7 (contiguous would give a 0-3 and b 4-7)
    path = _write(tmp_path, f"""\
        name: spread
        cluster: {{nodes: 8, node: dgx-a100, fabric: {fabric}}}
        jobs:
          - {{name: a, nodes: 4, placement: spread, model: {{preset: gpt3-125m}}, training: {{global_batch: 32}}}}
          - {{name: b, nodes: 4, placement: spread, model: {{preset: gpt3-125m}}, training: {{global_batch: 32}}}}
        """)
    jobs = load_scenario(path).jobs
    assert [j.nodes_assigned for j in jobs] == [(0, 2, 4, 6), (1, 3, 5, 7)]


def test_a_model_and_a_trace_together_are_refused(tmp_path):
    trace = os.path.join(ROOT, "traces", "dp-4gpu-overlap.json")
    top = _write(tmp_path, f"""\
        name: both
        cluster: {{nodes: 1, node: dgx-a100}}
        model: {{preset: gpt3-125m}}
        workload: {{trace: {trace}}}
        """)
    with pytest.raises(ScenarioError) as err:
        load_scenario(top)
    assert str(err.value) == (f"{top}:4: workload.trace: give one or the other: a model or a workload.trace "
                              "(the trace would run and the model be ignored)")
    job = _write(tmp_path, f"""\
        name: both
        cluster: {{nodes: 1, node: dgx-a100}}
        jobs:
          - {{name: a, nodes: 1, model: {{preset: gpt3-125m}}, workload: {{trace: {trace}}}}}
        """, "j.yaml")
    with pytest.raises(ScenarioError, match=r"j.yaml:4: jobs\[0\].workload.trace: give one or the other: a "
                                            r"jobs\[0\].model or a jobs\[0\].workload.trace"):
        load_scenario(job)


@pytest.mark.parametrize("key, fabric", [("spines", "fat_tree"), ("cores", "fat_tree3")])
def test_zero_spines_or_cores_are_refused(tmp_path, key, fabric):
    path = _write(tmp_path, f"""\
        name: z
        cluster: {{nodes: 4, node: dgx-a100, fabric: {{kind: {fabric}, leaf_size: 1, {key}: 0}}}}
        """)
    with pytest.raises(ScenarioError, match=rf"s.yaml:2: cluster.fabric.{key}: expected an integer from 1 to 100000, "
                                            "got 0"):
        load_scenario(path)


def test_a_trace_folder_inside_a_job_is_read_as_at_the_top(tmp_path):
    folder = os.path.join(ROOT, "traces", "dlrm-8rank-v100")
    path = _write(tmp_path, f"""\
        name: jf
        cluster: {{nodes: 2, node: dgx-v100}}
        jobs:
          - {{name: a, nodes: 1, workload: {{trace: {folder}, format: kineto}}}}
        """)
    assert load_scenario(path).jobs[0].workload.trace == folder


def test_a_top_level_key_inside_a_job_is_named_as_such(tmp_path):
    path = _write(tmp_path, """\
        name: jc
        cluster: {nodes: 2, node: dgx-a100}
        jobs:
          - {name: a, nodes: 1, cluster: {nodes: 1}, model: {preset: gpt3-125m}}
        """)
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert str(err.value) == (f'{path}:4: jobs[0].cluster: unknown key "cluster"; "cluster" is a key of the '
                              "scenario's top level, not of jobs[0]")


def test_node_fail_is_refused_with_its_file_and_line(tmp_path):
    path = _write(tmp_path, """\
        name: nf
        cluster:
          nodes: 2
          node: dgx-a100
          overrides:
            - {kind: node_fail, target: "node:1"}
        """)
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert str(err.value) == (f"{path}:6: cluster.overrides[0]: node:1 has failed and a job cannot run on a failed "
                              "node; reduce cluster.nodes (and the parallel layout) to leave it out")


def test_a_misspelt_optional_column_is_refused_by_name(tmp_path):
    p = tmp_path / "cases.csv"
    p.write_text("case,grop,scenario,metric,measured\na,g,s.yaml,iteration_time_s,1\n")
    with pytest.raises(ValidationError) as err:
        read_cases(str(p))
    assert str(err.value) == (f"{p}:1: unknown column(s) 'grop'; expected case, scenario, metric, measured and "
                              "optionally group, set, source")


def test_a_csv_with_a_byte_order_mark_reads(tmp_path):
    p = tmp_path / "cases.csv"
    p.write_bytes(b"\xef\xbb\xbfcase,scenario,metric,measured\na,s.yaml,iteration_time_s,1\n")  # Excel's UTF-8
    (case,) = read_cases(str(p))
    assert (case.case, case.measured) == ("a", 1.0)


def test_validate_prints_the_all_row_once(tmp_path, capsys):
    from emulator.tools.validate import Case, Outcome, table

    c = Case(line=2, case="c", group="all", scenario="s.yaml", overrides=(), metric="m", measured=100.0, source="")
    lines = table([Outcome(c, 110.0)]).splitlines()
    # one ungrouped case, 10% off: the total row alone, not a group "all" and the total "all"
    assert [ln.split()[:3] for ln in lines if ln.startswith("all")] == [["all", "1", "10.00%"]]


def test_a_deadlock_report_prints_on_several_lines(tmp_path, capsys):
    (tmp_path / "dl.json").write_text(
        '{"format": "emulator-trace", "version": 1, "ranks": 2, "ops": ['
        '{"id": 0, "rank": 0, "kind": "recv", "peer": 1, "bytes": 100, "tag": 1, "deps": []},'
        '{"id": 1, "rank": 1, "kind": "recv", "peer": 0, "bytes": 100, "tag": 1, "deps": []}]}')
    path = _write(tmp_path, "name: dl\ncluster: {nodes: 1, node: dgx-a100}\nworkload: {trace: dl.json}\n")
    assert cli.main(["run", path]) == 2
    err = capsys.readouterr().err
    assert "\\n" not in err
    assert err.splitlines()[1:] == [
        "  rank 0 stream comm: op 0 (recv from rank 1 tag 1: no matching send was ever issued)",
        "  rank 1 stream comm: op 1 (recv from rank 0 tag 1: no matching send was ever issued)"]


def test_search_with_nothing_feasible_exits_2_naming_the_gpus(tmp_path, capsys):
    # gpt3-175b on 8 A100s with tp, pp at most 2 and no ZeRO: 175e9 × 16 B / 4 = 700 GB a GPU > 80 GiB:
    # every one of the 24 layouts is out of memory
    path = _write(tmp_path, "name: big\ncluster: {nodes: 1, node: dgx-a100}\nmodel: {preset: gpt3-175b}\n"
                            "training: {global_batch: 8}\n")
    code = cli.main(["search", path, "--max-tp", "2", "--max-pp", "2", "--micro-batches", "1", "--zero", "0",
                     "--db", str(tmp_path / "x.sqlite")])
    assert code == 2
    assert capsys.readouterr().err.strip() == ("emulator: search: big on 8 GPUs: every layout was pruned: 24 layouts "
                                               "considered, 24 pruned (out of memory: 24), 0 to simulate")


@pytest.mark.parametrize("flag, value, message", [
    ("--micro-batches", "0,1", "--micro-batches: expected integers of at least 1, got 0"),
    ("--zero", "4", "--zero: expected integers from 0 to 3, got 4"),
])
def test_search_refuses_impossible_lists_up_front(tmp_path, capsys, flag, value, message):
    path = _write(tmp_path, "name: s\ncluster: {nodes: 1, node: dgx-a100}\nmodel: {preset: gpt3-125m}\n"
                            "training: {global_batch: 8}\n")
    assert cli.main(["search", path, flag, value, "--db", str(tmp_path / "x.sqlite")]) == 2
    assert capsys.readouterr().err.strip() == f"emulator: {message}"
    assert not (tmp_path / "x.sqlite").exists()


def test_prune_reasons_print_the_numbers_of_their_most_frequent_case():
    from collections import Counter

    from emulator.studies.search import prune_examples

    pruned = Counter({"model.layers (80) must be divisible by pp*virtual_stages = 16*2 = 32": 5,
                      "model.layers (80) must be divisible by pp*virtual_stages = 64*1 = 64": 7,
                      "out of memory": 3})
    # one rule, 5 + 7 = 12 layouts, shown by its most frequent message (7 layouts) with its numbers
    assert prune_examples(pruned) == [("model.layers (80) must be divisible by pp*virtual_stages = 64*1 = 64", 12, 1),
                                      ("out of memory", 3, 0)]


def test_export_of_jobs_writes_each_job_in_its_folder(tmp_path, capsys):
    # jobs-two-disjoint-leaves: jobs a and b, 2 DGX nodes (16 GPUs) each: 16 ETs per job
    scen = os.path.join(ROOT, "scenarios", "jobs-two-disjoint-leaves.yaml")
    assert cli.main(["export", scen, "--out", str(tmp_path / "x")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"job a: wrote 16 Chakra ETs ({tmp_path}/x/a/chakra.<rank>.et)")
    for job in ("a", "b"):
        assert sorted(os.listdir(tmp_path / "x" / job)) == sorted(
            ["comm_group.json", *(f"chakra.{r}.et" for r in range(16))])


def test_a_device_is_not_called_a_file(capsys):
    assert cli.main(["export", os.path.join(ROOT, "scenarios", "quickstart.yaml"), "--out", "/dev/null"]) == 2
    assert capsys.readouterr().err.strip() == ("emulator: --out /dev/null: exists and is a device, pipe or socket, "
                                               "not a folder")
