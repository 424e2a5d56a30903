"""Layout search: hand-checkable winners, pruning counts, and nothing that does not fit."""
import os

import pytest

from emulator.cli import main
from emulator.errors import EmulatorError
from emulator.scenario import load_scenario
from emulator.studies.executor import LocalExecutor
from emulator.studies.search import Layout, Limits, cluster_overrides, plan, rule_violation, search
from emulator.studies.store import ResultStore
from emulator.workload.memory import memory_report


def _scenario(folder, preset, batch):
    path = os.path.join(folder, f"{preset}.yaml")
    with open(path, "w") as fh:
        fh.write(f"name: {preset}\ncluster: {{nodes: 1, node: dgx-a100}}\nmodel: {{preset: {preset}}}\n"
                 f"training: {{global_batch: {batch}}}\n")
    return path


def test_rules_name_the_broken_constraint(tmp_path):
    sc = load_scenario(_scenario(str(tmp_path), "gpt3-125m", 16))  # 12 layers, 12 heads
    # the loader's words (the rule book, scenario/rules.py)
    assert rule_violation(sc, Layout(tp=8, pp=1, dp=1)) == "model.heads (12) must be divisible by tp (8)"
    assert rule_violation(sc, Layout(tp=1, pp=2, dp=4, schedule="interleaved-1f1b", virtual_stages=4)) == \
        ("model.layers (12) must be divisible by pp*virtual_stages = 2*4 = 8, or set parallel.first_chunk_layers"
         " / last_chunk_layers for an uneven split (or account_for_embedding_in_pipeline_split /"
         " account_for_loss_in_pipeline_split, which count the embedding and the loss as layers)")  # 12 % 8
    assert rule_violation(sc, Layout(tp=1, pp=1, dp=8, micro_batch=4)) == \
        "global_batch (16) must be divisible by micro_batch*dp = 4*8 = 32"  # 16 % 32
    assert rule_violation(sc, Layout(tp=1, pp=4, dp=2, micro_batch=4, schedule="interleaved-1f1b",
                                     virtual_stages=2)) is not None  # 12 % 8 (layers first)
    assert rule_violation(sc, Layout(tp=2, pp=2, dp=2)) is None


def test_gpus_override_whole_nodes_or_part_of_one(tmp_path):
    sc = load_scenario(_scenario(str(tmp_path), "gpt3-125m", 16))
    assert cluster_overrides(sc, 16) == ["cluster.nodes=2"]
    assert cluster_overrides(sc, 4) == ["cluster.nodes=1", "cluster.node.gpus_per_node=4"]
    with pytest.raises(EmulatorError, match="multiple of the 8 GPUs"):
        cluster_overrides(sc, 12)


def test_small_model_on_8_gpus_pure_data_parallel_wins(tmp_path):
    # gpt3-125m (12 layers, 12 heads) fits anywhere (125M × 16 B = 2 GB of model states), so the
    # fastest layout has no TP all-reduces, no pipeline bubble and no recompute: tp=1 pp=1 dp=8.
    # Space (mb 1, ZeRO 0, pp ≤ 2): (tp, pp) = (1..8, 1) and (1..4, 2) × 3 schedules = 13 shapes × 3
    # recompute = 39. Pruned: tp 8 (12 % 8 heads) 3. pp 2 v 4 has 8 chunks for 12 layers: no even split, so
    # the ends are lightened (0 layers each, 12 / 6 = 2 in the middle) and it is valid. The 12 valid shapes
    # all fit without recompute, so 2 × 12 = 24 "more recompute than needed"; 12 simulated.
    path = _scenario(str(tmp_path), "gpt3-125m", 16)
    with ResultStore(str(tmp_path / "s.sqlite")) as store:
        res = search(path, [], None, Limits(max_pp=2, micro_batches=(1,), zero=(0,)), store, LocalExecutor(1))
    assert res.plan.considered == 39 and len(res.plan.layouts) == 12
    assert dict(res.plan.pruned) == {"model.heads (12) must be divisible by tp (8)": 3,
                                     "more recompute than needed to fit": 24}
    assert sorted({lay.ends for lay in res.plan.layouts if lay.virtual_stages == 4}) == [0]
    best = res.ranked[0].varied
    assert (best["parallel.tp"], best["parallel.pp"], best["parallel.dp"], best["training.recompute"]) == \
        (1, 1, 8, "none")
    assert len(res.ranked) == 12


def test_memory_forces_model_parallelism_and_nothing_oom_is_proposed(tmp_path, capsys):
    # gpt3-6.7b without ZeRO: 6.7e9 params × 16 B = 107 GB of model states > 80 GiB = 85.9 GB, so
    # tp = pp = 1 does not fit whatever the recompute; the winner must split the model.
    path = _scenario(str(tmp_path), "gpt3-6.7b", 8)
    sc = load_scenario(path)
    p = plan(sc, 8, Limits(max_pp=2, micro_batches=(1,), zero=(0,)))
    assert p.pruned["out of memory"] >= 3  # at least tp=1 pp=1 dp=8 with none, selective and full
    assert all(not (lay.tp == 1 and lay.pp == 1) for lay in p.layouts)
    db = str(tmp_path / "s.sqlite")
    code = main(["search", path, "--max-pp", "2", "--micro-batches", "1", "--zero", "0", "--db", db, "--top", "3"])
    out = capsys.readouterr().out
    assert code == 0 and "out of memory" in out and "why: the best is" in out
    with ResultStore(db) as store:
        rows = store.rows()
    assert rows and all(r.status == "ok" and r.metric("memory.fits") for r in rows)
    for r in rows:  # re-check every simulated layout against the memory model
        v = r.varied
        sets = [f"{k}={val}" for k, val in v.items()]
        assert memory_report(load_scenario(path, sets)).fits
    assert os.path.isfile(str(tmp_path / "s.csv"))
    top = out.splitlines()[2]
    assert "tp=1 pp=1" not in top


def test_search_needs_a_model(tmp_path, capsys):
    from test_sweep import write_tiny

    path = write_tiny(str(tmp_path))
    assert main(["search", path, "--db", str(tmp_path / "x.sqlite")]) == 2
    assert "needs a model workload" in capsys.readouterr().err


def test_layers_that_do_not_split_evenly_get_lighter_end_stages(tmp_path, capsys):
    from emulator.scenario.stages import balanced_ends, chunk_layers
    from emulator.studies.search import shapes

    # 126 layers (Llama-3 405B): on 16 chunks 7 at each end, 14 x 8 between; on 128 chunks 0 and 126 x 1
    assert balanced_ends(126, 16) == 7 and balanced_ends(126, 128) == 0
    assert balanced_ends(12, 4) is None  # even
    assert balanced_ends(13, 8) is None  # 13 - 2x over 6 chunks: x=0 -> 13, x=1 -> 11, neither divides
    # a 14-layer model on 8 GPUs: pp 4 has no even split; ends of 3 leave 8 for two chunks of 4
    path = os.path.join(str(tmp_path), "m.yaml")
    with open(path, "w") as fh:
        fh.write("name: m14\ncluster: {nodes: 1, node: dgx-a100}\nmodel: {preset: gpt3-125m, layers: 14}\n"
                 "training: {global_batch: 16}\nparallel: {pp: 4, first_chunk_layers: 3, last_chunk_layers: 3}\n")
    sc = load_scenario(path)
    pp4 = [lay for lay in shapes(sc, 8, Limits(micro_batches=(1,))) if lay.pp == 4 and lay.virtual_stages == 1]
    assert pp4 and {lay.ends for lay in pp4} == {3}
    assert chunk_layers(14, 4, 1, 3, 3) == (3, 4, 4, 3) and rule_violation(sc, pp4[0]) is None
    db = str(tmp_path / "s.sqlite")
    assert main(["search", path, "--max-tp", "1", "--micro-batches", "1", "--zero", "0", "--db", db]) == 0
    assert "pp=4 dp=2 mb=1 1f1b ends=3" in capsys.readouterr().out
    with ResultStore(db) as store:
        rows = {(r.varied["parallel.pp"], r.varied["parallel.virtual_stages"]): r for r in store.rows()}
    uneven = rows[(4, 1)]
    assert uneven.varied["parallel.first_chunk_layers"] == uneven.varied["parallel.last_chunk_layers"] == 3
    assert uneven.resolved["parallel"]["first_chunk_layers"] == 3
    even = rows[(2, 1)]  # 14 / 2 = 7 each: even, and the base scenario's 3 + 3 do not carry over
    assert "parallel.first_chunk_layers" not in even.varied and even.resolved["parallel"]["first_chunk_layers"] is None


def test_prune_reasons_are_grouped_by_rule():
    # two messages of one rule differ only in the layout's sizes: one line, 5 + 7 = 12 layouts;
    # the out-of-memory count stays on its own line, and names keep their digits (ZeRO-2)
    from collections import Counter

    from emulator.studies.search import prune_rules

    pruned = Counter({"model.layers (80) must be divisible by pp*virtual_stages = 16*2 = 32": 5,
                      "model.layers (80) must be divisible by pp*virtual_stages = 64*1 = 64": 7,
                      "ZeRO-2 where ZeRO-1 fits with the same recompute (the same communication)": 4,
                      "out of memory": 3})
    assert prune_rules(pruned) == Counter({"model.layers (N) must be divisible by pp*virtual_stages = N*N = N": 12,
                                           "ZeRO-2 where ZeRO-1 fits with the same recompute (the same communication)": 4,
                                           "out of memory": 3})


def test_v_and_dualpipe_schedules_are_offered_when_asked(tmp_path, capsys):
    from emulator.studies.search import SEARCH_SCHEDULES, shapes

    path = _scenario(str(tmp_path), "gpt3-125m", 16)
    sc = load_scenario(path)
    # the default space is unchanged: 1f1b, and interleaved-1f1b v 2 and 4, at pp 2
    assert {(s.schedule, s.virtual_stages) for s in shapes(sc, 8, Limits(max_tp=1, max_pp=2, micro_batches=(1,)))
            if s.pp == 2} == {("1f1b", 1), ("interleaved-1f1b", 2), ("interleaved-1f1b", 4)}
    # all five on 8 GPUs, tp 1, pp <= 4, mb 1, ZeRO 0: pp 1 (dp 8, m = 16/8 = 2) 1f1b only; pp 2 (dp 4, m = 4)
    # 1f1b, interleaved v 2 and 4, zb-v, dualpipev (m = 4 >= 2*2), dualpipe (pp 2 even, m = 4 even >= 4);
    # pp 4 (dp 2, m = 8) the same six, of which interleaved v 4 has 16 chunks for 12 layers and no lighter ends
    # (12 - 2x over 14 chunks never divides): 13 shapes x 3 recompute = 39 considered, 1 shape x 3 pruned by
    # the rule; the other 12 fit without recompute (125M params), so 2 x 12 more recompute pruned; 12 run
    with ResultStore(str(tmp_path / "s.sqlite")) as store:
        res = search(path, [], None, Limits(max_tp=1, max_pp=4, micro_batches=(1,), zero=(0,),
                                            schedules=SEARCH_SCHEDULES), store, LocalExecutor(1))
    assert res.plan.considered == 39 and len(res.plan.layouts) == 12
    assert dict(res.plan.pruned) == {
        "model.layers (12) must be divisible by pp*virtual_stages = 4*4 = 16, or set parallel.first_chunk_layers"
        " / last_chunk_layers for an uneven split (or account_for_embedding_in_pipeline_split /"
        " account_for_loss_in_pipeline_split, which count the embedding and the loss as layers)": 3,
        "more recompute than needed to fit": 24}
    got = sorted((lay.pp, lay.schedule, lay.virtual_stages) for lay in res.plan.layouts)
    assert [x for x in got if x[1] in ("zb-v", "dualpipev", "dualpipe")] == [
        (2, "dualpipe", 1), (2, "dualpipev", 2), (2, "zb-v", 2), (4, "dualpipe", 1), (4, "dualpipev", 2),
        (4, "zb-v", 2)]
    assert len(res.ranked) == 12 and all(r.status == "ok" for r in res.rows)
    # the simulated runs are the schedules asked for, and the table names them
    assert {r.resolved["parallel"]["schedule"] for r in res.rows} == set(SEARCH_SCHEDULES)
    # fewer micro-batches: pp 2 with dp 4 and global batch 8 has m = 2 < 2*2, refused in the loader's words
    small = load_scenario(_scenario(str(tmp_path), "gpt3-125m", 8))
    assert rule_violation(small, Layout(tp=1, pp=2, dp=4, schedule="dualpipev", virtual_stages=2)) == (
        "dualpipev needs at least 2*pp = 4 micro-batches per pipeline (global_batch/(micro_batch*dp) = 2; "
        "deepseek-ai/DualPipe dualpipev.py: num_chunks >= num_ranks * 2)")


def test_dualpipe_is_pruned_by_its_own_memory(tmp_path):
    # gpt3-6.7b on 8 A100 80 GB, tp 1, ZeRO 0: 18 B of model state a parameter (bf16 weight 2, fp32 gradient 4,
    # Adam 12). 1F1B at pp 2 holds half the model (stage 0, 16 layers + the embedding: 3.44e9 params, 61.9 GB
    # of states) and fits with selective recompute; dualpipe at pp 2 holds both stages on every rank, the whole
    # model (6,658,404,352 params, the padded vocabulary's 47 x 4096 more): 18 x 6.6586e9 = 119.9 GB > 80 GiB =
    # 85.9 GB whatever the recompute. Shapes: pp 1 1f1b, pp 2 1f1b, pp 2 dualpipe (m = 16/4 = 4 = 2*pp): 3 x 3 = 9
    # considered; out of memory: pp 1 (3), dualpipe (3), 1f1b without recompute (1); 1f1b full is more than needed
    path = _scenario(str(tmp_path), "gpt3-6.7b", 16)
    sc = load_scenario(path)
    p = plan(sc, 8, Limits(max_tp=1, max_pp=2, micro_batches=(1,), zero=(0,), schedules=("1f1b", "dualpipe")))
    assert p.considered == 9 and dict(p.pruned) == {"out of memory": 7, "more recompute than needed to fit": 1}
    assert [lay.short() for lay in p.layouts] == ["tp=1 pp=2 dp=4 mb=1 1f1b zero=0 recompute=selective"]
    rep = memory_report(Layout(1, 2, 4, schedule="dualpipe", recompute="full").apply(sc))
    states = sum(rep.breakdown[k] for k in ("params", "grads", "optimizer"))
    assert states == pytest.approx(18 * (6_658_404_352 + 47 * 4096), rel=1e-12) and not rep.fits


def test_schedules_flag(tmp_path, capsys):
    from emulator.studies.search import DEFAULT_SCHEDULES, SEARCH_SCHEDULES, _schedules

    assert _schedules("all") == SEARCH_SCHEDULES and _schedules("dualpipe, 1f1b") == ("1f1b", "dualpipe")
    assert DEFAULT_SCHEDULES == ("1f1b", "interleaved-1f1b")
    path = _scenario(str(tmp_path), "gpt3-125m", 16)
    assert main(["search", path, "--schedules", "1f1b,zb-h1", "--db", str(tmp_path / "x.sqlite")]) == 2
    assert "--schedules: expected a comma-separated list of 1f1b, interleaved-1f1b, zb-v, dualpipev, dualpipe, " \
           "or 'all'; got 'zb-h1'" in capsys.readouterr().err
    db = str(tmp_path / "s.sqlite")
    assert main(["search", path, "--max-tp", "1", "--max-pp", "2", "--micro-batches", "1", "--zero", "0",
                 "--schedules", "zb-v", "--db", db]) == 0
    out = capsys.readouterr().out
    assert "zb-v v=2" in out and "1f1b" not in out.split("\n", 1)[1]  # pp 1 needs 1f1b listed: only pp 2 zb-v
