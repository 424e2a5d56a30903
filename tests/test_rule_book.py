"""The one rule book (emulator/scenario/rules.py): the loader, the workload plan and the layout
search agree on which layouts are valid, and say why in the same words."""
import dataclasses

import pytest

from emulator.errors import ScenarioError
from emulator.scenario import layout_violations, load_scenario_text
from emulator.scenario.spec import ModelSpec, ParallelSpec, TrainingSpec
from emulator.studies.search import SPLIT_RESET, Limits, rule_violation, shapes
from emulator.workload.plan import make_plan

GQA = "{layers: 8, hidden: 4096, heads: 32, kv_heads: 4, ffn_hidden: 11008, seq_len: 4096, vocab: 32000, swiglu: true}"


def scenario_text(model: str, nodes: int = 1, batch: int = 64) -> str:
    return (f"name: rules\ncluster: {{nodes: {nodes}, node: dgx-a100}}\nmodel: {model}\n"
            f"training: {{global_batch: {batch}}}\n")


def load(model: str, sets: list[str], nodes: int = 1, batch: int = 64):
    return load_scenario_text(scenario_text(model, nodes, batch), "rules.yaml", sets)


def test_gqa_with_fewer_kv_heads_than_tp_is_valid_everywhere():
    # 32 heads over tp 8 is 4 per rank; the 4 KV heads do not split over 8 ranks, so Megatron
    # replicates each on 2 ranks (8 % 4 = 0): a valid layout for the loader and the search alike
    sc = load(GQA, ["parallel.tp=8"])
    assert (sc.parallel.tp, sc.parallel.dp, sc.model.kv_heads) == (8, 1, 4)
    [lay] = [s for s in shapes(sc, 8, Limits(micro_batches=(1,))) if (s.tp, s.pp, s.virtual_stages) == (8, 1, 1)]
    assert rule_violation(sc, lay) is None
    make_plan(sc)  # and the workload builds it


def test_ffn_not_divisible_by_tp_is_pruned_with_the_loaders_message():
    # ffn_hidden 4100 over tp 8: 4100 = 8·512 + 4, so the MLP does not split evenly
    model = "{layers: 4, hidden: 1024, heads: 16, ffn_hidden: 4100, seq_len: 2048, vocab: 50000}"
    with pytest.raises(ScenarioError) as info:
        load(model, ["parallel.tp=8"])
    message = "model.ffn_hidden (4100) must be divisible by tp (8)"
    assert str(info.value) == f"--set parallel.tp=8: parallel.tp: {message}"  # the key, where it was given
    sc = load(model, ["parallel.tp=4"])  # 4100 = 4·1025: valid
    [lay] = [s for s in shapes(sc, 8, Limits(micro_batches=(1,))) if (s.tp, s.pp) == (8, 1)]
    assert rule_violation(sc, lay) == message


def test_sequence_over_cp_and_tp_with_sequence_parallelism():
    # seq 2048 over cp 4 · tp 8 = 64: fine; seq 2040 = 64·31 + 56 is not
    sp = ParallelSpec(tp=8, cp=4, sequence_parallel=True)
    model = ModelSpec(layers=4, hidden=1024, heads=16, seq_len=2040, vocab=1000)
    broken = layout_violations(model, TrainingSpec(global_batch=4), sp)
    assert [(v.key, v.message) for v in broken] == [
        ("parallel.cp", "model.seq_len (2040) must be divisible by cp*tp = 4*8 = 32")]
    assert layout_violations(dataclasses.replace(model, seq_len=2048), TrainingSpec(global_batch=4), sp) == []


def test_every_broken_rule_is_listed_with_its_key():
    # 12 heads at tp 8 (12 % 8 = 4), 10 layers over pp 4 (10 % 4 = 2), 6 sequences over mb 4 · dp 1
    model = ModelSpec(layers=10, hidden=768, heads=12, seq_len=2048, vocab=50257)
    broken = layout_violations(model, TrainingSpec(global_batch=6, micro_batch=4), ParallelSpec(tp=8, pp=4))
    assert [v.key for v in broken] == ["training.global_batch", "parallel.pp", "parallel.tp", "parallel.tp"]
    assert broken[0].message == "global_batch (6) must be divisible by micro_batch*dp = 4*1 = 4"
    assert broken[2].message == "model.heads (12) must be divisible by tp (8)"
    # the FFN (4·768 = 3072 = 8·384) splits; the KV heads default to the 12 heads, and 12 and 8
    # divide neither way
    assert broken[3].message == "model.kv_heads (12) and tp (8) must divide one another"


MODELS = {
    "dense": "{layers: 12, hidden: 768, heads: 12, seq_len: 2048, vocab: 50257}",
    "gqa": GQA,
    # ffn 6004 = 4·1501: tp 8 breaks it; seq 1000 = 8·125: cp·tp of 16 or 32 breaks it under sequence parallelism
    "odd-ffn": "{layers: 6, hidden: 1536, heads: 24, ffn_hidden: 6004, seq_len: 1000, vocab: 32000}",
    "moe": "{layers: 16, hidden: 2048, heads: 16, kv_heads: 8, ffn_hidden: 5632, seq_len: 4096, vocab: 32000,"
           " experts: 8, top_k: 2, swiglu: true}",
}


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("sp", [False, True])
def test_the_loader_accepts_exactly_what_the_search_keeps(name, sp):
    # 4 nodes = 32 GPUs; tp ≤ 8, pp ≤ 32, cp ≤ 4, micro-batch 1..8, 1F1B and interleaved v 2/4, ep | dp·cp:
    # the search's whole space; each layout goes through the loader with --set, as a sweep point would
    nodes, batch = 4, 96
    base = load(MODELS[name], [f"parallel.sequence_parallel={str(sp).lower()}", "parallel.tp=1"], nodes, batch)
    space = shapes(base, 32, Limits(max_cp=4, micro_batches=(1, 2, 4, 8)))
    assert len(space) > 300
    kept = accepted = 0
    for lay in space:
        why = rule_violation(base, lay)
        sets = [f"parallel.sequence_parallel={str(sp).lower()}", *SPLIT_RESET,
                *(f"{k}={'null' if v is None else v}" for k, v in lay.values().items())]
        try:
            load(MODELS[name], sets, nodes, batch)
            loaded = None
        except ScenarioError as err:
            loaded = err.message
        assert loaded == why, lay.short()
        kept += why is None
        accepted += loaded is None
    assert kept == accepted and 0 < kept < len(space)
