"""MoE loads that vary by layer and by step: moe_expert_load as a row per MoE layer or a file of rows, and the
seeded draws of moe_load_seed (workload/routing.py drawn_load)."""
import dataclasses
import statistics

import pytest

from emulator.errors import ScenarioError
from emulator.outputs.summary import summarize
from emulator.run.simulation import simulate
from emulator.scenario import load_scenario_text
from emulator.scenario.catalog import model_preset
from emulator.workload import layer as Ly
from emulator.workload import models as M
from emulator.workload import routing
from emulator.workload.builder import build_program
from emulator.workload.plan import make_plan

MIXTRAL = model_preset("mixtral-8x7b")  # 8 experts, top-2, hidden 4096, sequence 4096
SKEWED = (4.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 2.0)
FLAT = (1.0,) * 8

SCENARIO = """
name: m
cluster: {nodes: 1, node: dgx-h100}
model:
  preset: mixtral-8x7b
  layers: 2
%s
training: {global_batch: 8, micro_batch: 1}
parallel: {dp: 8, ep: 4}
"""


def _scenario(model_lines: str, path: str = "m.yaml"):
    return load_scenario_text(SCENARIO % model_lines, path)


def _expert_tokens(unit) -> int:
    """Tokens per local expert of a unit's forward: the moe.up grouped GEMM's m."""
    return next(k for k in Ly.kernels(unit.fwd) if k.name == "moe.up").m


def test_a_row_per_layer_gives_each_layer_its_load():
    # ep 4 holds experts (0,1) (2,3) (4,5) (6,7) (Megatron's contiguous local experts). Layer 0, SKEWED: per
    # rank [4+1, 1+1, 1+1, 1+2] = [5, 2, 2, 3] of 12, mean 3 → 5/3; layer 1, FLAT: 1
    m = dataclasses.replace(MIXTRAL, layers=2, moe_expert_load=(SKEWED, FLAT))
    assert M.moe_rank_load(m, 4, layer=0) == pytest.approx(5 / 3)
    assert M.moe_rank_load(m, 4, layer=1) == 1.0
    assert M.moe_rank_load(m, 4) == pytest.approx(5 / 3)  # memory: the busiest layer
    # an MTP module (index layers + 1 + d = 3) takes the last row
    assert M.moe_rank_load(dataclasses.replace(m, mtp_num_layers=1), 4, layer=3) == 1.0


def test_the_plan_builds_each_layer_with_its_own_load():
    sc = _scenario("  moe_expert_load:\n    - %s\n    - %s" % (list(SKEWED), list(FLAT)))
    units = {u.name: u for u in make_plan(sc).chunk_units[0]}
    # b 1 × s 4096 tokens, top-2: 8192 routed copies; layer 0's busiest rank receives round(8192·5/3) = 13 653,
    # 2 local experts: 13 653 // 2 = 6826 each; layer 1 balanced: 8192 / 2 = 4096 each
    assert _expert_tokens(units["layer0"]) == 6826
    assert _expert_tokens(units["layer1"]) == 4096


def test_one_row_is_every_layer():
    sc = _scenario("  moe_expert_load: %s" % list(SKEWED))
    units = {u.name: u for u in make_plan(sc).chunk_units[0]}
    assert _expert_tokens(units["layer0"]) == _expert_tokens(units["layer1"]) == 6826  # 13 653 // 2, as above


def test_a_file_reads_as_the_rows_inline(tmp_path):
    (tmp_path / "loads.csv").write_text("# tokens per expert, one line per MoE layer\n"
                                        "4, 1, 1, 1, 1, 1, 1, 2\n\n1 1 1 1 1 1 1 1  # layer 1\n")
    from_file = _scenario("  moe_expert_load: loads.csv", str(tmp_path / "m.yaml"))
    inline = _scenario("  moe_expert_load: [%s, %s]" % (list(SKEWED), list(FLAT)), str(tmp_path / "m.yaml"))
    assert from_file.model.moe_expert_load == inline.model.moe_expert_load == (SKEWED, FLAT)
    a, b = (summarize(simulate(sc, record_links=False)) for sc in (from_file, inline))
    a["sim"].pop("wall_s"), b["sim"].pop("wall_s")  # the machine's time, not the model's
    assert a == b


@pytest.mark.parametrize("lines, needle", [
    ("  moe_expert_load: [%s, %s, %s]" % (list(FLAT), list(FLAT), list(FLAT)),
     "moe_expert_load has 3 rows; expected one (every MoE layer) or one per MoE layer (2: layers 2 − "
     "first_dense_layers 0)"),
    ("  moe_expert_load:\n    - %s\n    - [1, 1, 1]" % list(FLAT),
     "m.yaml:9: model.moe_expert_load[1]: moe_expert_load has 3 numbers; expected one per expert (8)"),
    ("  moe_expert_load: [%s, [1, -1, 1, 1, 1, 1, 1, 1]]" % list(FLAT), "model.moe_expert_load[1][1]"),
    ("  moe_expert_load: nowhere.csv", '("nowhere.csv" is read relative to the scenario\'s folder)'),
    ("  moe_load_seed: 1\n  moe_imbalance: 1.2", "give moe_imbalance or moe_load_seed, not both"),
    ("  moe_load_seed: 1\n  moe_router_force_load_balancing: true",
     "give moe_router_force_load_balancing or moe_load_seed, not both"),
    ("  moe_load_seed: 1\n  moe_expert_load: %s" % list(FLAT), "give moe_expert_load or moe_load_seed, not both"),
    ("  moe_load_concentration: 10", "moe_load_concentration needs model.moe_load_seed"),
    ("  moe_load_seed: -1", "model.moe_load_seed"),
])
def test_bad_loads_are_refused_by_name(lines, needle):
    with pytest.raises(ScenarioError) as info:
        _scenario(lines)
    assert needle in str(info.value)


def test_a_bad_file_names_its_line(tmp_path):
    (tmp_path / "loads.csv").write_text("1 1 1 1 1 1 1 1\n1 1 x 1 1 1 1 1\n")
    with pytest.raises(ScenarioError) as info:
        _scenario("  moe_expert_load: loads.csv", str(tmp_path / "m.yaml"))
    assert f"{tmp_path / 'loads.csv'}:2: expected numbers of at least 0, got 'x'" in str(info.value)


def test_a_draw_is_the_seeds_own():
    one = routing.drawn_load(7, 0, 3, 256, 2_097_152, 10.0)
    assert one == routing.drawn_load.__wrapped__(7, 0, 3, 256, 2_097_152, 10.0)  # again, uncached: the same
    assert sum(one) == 2_097_152  # every routed copy lands on an expert
    assert one != routing.drawn_load(7, 1, 3, 256, 2_097_152, 10.0)  # another step
    assert one != routing.drawn_load(7, 0, 4, 256, 2_097_152, 10.0)  # another layer
    assert one != routing.drawn_load(8, 0, 3, 256, 2_097_152, 10.0)  # another seed


def test_equal_shares_draw_the_random_router():
    # 4 tokens, top-1, 4 experts on ep 2 (2 each): rank 0's copies X ~ Binomial(4, 1/2), rank 1's 4 − X, so the
    # busiest carries max(X, 4 − X) of a mean 2: 4/2 w.p. 2/16, 3/2 w.p. 8/16, 2/2 w.p. 6/16, expectation
    # (2·2 + 8·1.5 + 6·1)/16 = 22/16 = 1.375 (force balance's independent maxima, force_balance_load, say 1.273)
    m = dataclasses.replace(MIXTRAL, experts=4, top_k=1)
    loads = [M.moe_rank_load(dataclasses.replace(m, moe_load_seed=s), 2, tokens=2, layer=0) for s in range(4000)]
    assert statistics.fmean(loads) == pytest.approx(1.375, abs=0.02)  # its standard error: 0.33/√4000 = 0.005
    assert set(loads) == {1.0, 1.5, 2.0}


def test_the_concentration_sets_the_spread():
    # Dirichlet(α) shares over E experts: coefficient of variation sqrt((E − 1)/(E·α + 1)); E 256, α 100:
    # sqrt(255/25 601) = 0.0998. 10^9 copies add a multinomial spread of sqrt(E/10^9) = 0.0005 (negligible).
    counts = [x for layer in range(20) for x in routing.drawn_load(1, 0, layer, 256, 10**9, 100.0)]
    cv = statistics.pstdev(counts) / statistics.fmean(counts)
    assert cv == pytest.approx(0.0998, rel=0.05)  # 5120 shares: the estimate's own spread is about 1%


SEEDED = "  moe_imbalance: 1\n  moe_load_seed: 3\n  moe_load_concentration: 10"


def test_each_step_takes_its_own_draw():
    sc = _scenario(SEEDED)
    two = dataclasses.replace(sc, simulation=dataclasses.replace(sc.simulation, iterations=2))
    step = [{u.name: _expert_tokens(u) for u in make_plan(sc, k).chunk_units[0] if u.name.startswith("layer")}
            for k in range(2)]
    assert step[0] != step[1] and step[0]["layer0"] != step[0]["layer1"]  # by step and by layer
    one, both = build_program(sc), build_program(two)
    assert (one.iterations, both.iterations) == (1, 2) and len(both.ops) == 2 * len(one.ops)
    assert both.repeated(2) is both  # the run does not repeat it again
    # each iteration's time is its own step's: the mean of the two is not the first step's
    t1 = summarize(simulate(sc, record_links=False))["iteration_time_s"]
    t2 = summarize(simulate(two, record_links=False))["iteration_time_s"]
    assert t2 != pytest.approx(t1, rel=1e-9)


def test_the_same_seed_gives_the_same_summary():
    a, b = (summarize(simulate(_scenario(SEEDED), record_links=False)) for _ in range(2))
    a["sim"].pop("wall_s"), b["sim"].pop("wall_s")  # the machine's time, not the model's
    assert a == b
