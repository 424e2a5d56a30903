"""Folding in effect: data-parallel replicas on different leaves of a non-blocking fat-tree.

Rotating DP replicas whose node blocks cross leaf boundaries (DP 3, 6, 12, 24 on leaves of 2, 4,
8 or 16 nodes) is no automorphism of the fat-tree, but on a non-blocking one (uplinks = downlinks,
spray) no leaf–spine link can be a flow's only bottleneck, so only latencies can differ. The fold
is then taken, and every plan checks that each copy has its representative's latencies; where one
does not (a pipeline transfer that crosses a leaf for one replica and not for another), the fold
refuses itself and the run is made rank by rank. Either way it must agree with ``fold: off``.
dgx-a100: 8 GPUs and 8 NICs per node; TP 8 fills a node.
"""
from dataclasses import replace

import pytest

from emulator.errors import EmulatorError
from emulator.outputs.summary import summarize
from emulator.run.folding import choose_fold
from emulator.run.simulation import simulate
from emulator.scenario import load_scenario_text


def scenario(dp, pp, tp, leaf, over=1, fold="auto", extra="", kind="fat_tree"):
    nodes = dp * pp * tp // 8
    text = f"""name: t
cluster: {{nodes: {nodes}, node: dgx-a100, fabric: {{kind: {kind}, leaf_size: {leaf}, oversubscription: {over}{extra}}}}}
model: {{layers: {2 * pp}, hidden: 2048, heads: 16, seq_len: 1024, vocab: 32000}}
training: {{global_batch: {4 * dp}, micro_batch: 1}}
parallel: {{tp: {tp}, pp: {pp}, dp: {dp}}}
simulation: {{fold: {fold}}}
"""
    return load_scenario_text(text, "t.yaml")


@pytest.mark.parametrize("dp, pp, tp, leaf, ranks", [
    (3, 5, 8, 2, 5),  # 15 nodes, blocks of 3 on leaves of 2; stage p → p+1 is 3 nodes on: always another leaf
    (3, 7, 8, 2, 7),  # the same with PP 7
    (6, 7, 8, 4, 7),  # 42 nodes = 336 GPUs; blocks of 6 on leaves of 4; transfers 6 nodes on: always another leaf
    (12, 5, 4, 4, 5),  # TP 4: 2 replicas per node, 6 nodes per block on leaves of 4
    (24, 1, 8, 16, 1),  # pure DP over 24 nodes on leaves of 16 (192 GPUs)
])
def test_folded_in_effect_agrees_with_every_rank_simulated(dp, pp, tp, leaf, ranks):
    folded, full = simulate(scenario(dp, pp, tp, leaf)), simulate(scenario(dp, pp, tp, leaf, fold="off"))
    assert "folded in effect" in folded.notes[0]
    assert folded.ranks_simulated == ranks  # one rank per stage: dp and tp folded
    assert full.ranks_simulated == dp * pp * tp
    assert folded.iteration_time_s == pytest.approx(full.iteration_time_s, rel=1e-6)


def test_rails_fold_in_effect_too():
    # rail-optimized: NIC i of a group of 4 nodes on rail switch i; DP 6 × PP 7 blocks cross the groups
    folded = simulate(scenario(6, 7, 8, 4, kind="rail"))
    full = simulate(scenario(6, 7, 8, 4, kind="rail", fold="off"))
    assert "folded in effect" in folded.notes[0] and folded.ranks_simulated == 7
    assert folded.iteration_time_s == pytest.approx(full.iteration_time_s, rel=1e-6)


def test_a_copy_with_other_latencies_refuses_the_fold():
    # DP 3 × PP 5 on leaves of 4 nodes: stage 0 replica 0 (node 0) sends to node 3 (same leaf 0),
    # replica 1 (node 1, GPU 8) to node 4 (leaf 1): two more fabric hops, 2 × 1 us more
    # (0.5 + 1 + 1 + 0.5 us of NIC and fabric links, + the inter-node step latency, vs 0.5 + 0.5 us + it)
    folded, full = simulate(scenario(3, 5, 8, 4)), simulate(scenario(3, 5, 8, 4, fold="off"))
    assert folded.notes[0] == ("folding on: 8 ranks per simulated rank; replicas across leaves not folded: p2p on "
                               "(8, 32) has latency 1.205e-05 s, its representative on (0, 24) 1.005e-05 s")
    assert folded.ranks_simulated == 15  # the TP 8 peers still folded (an automorphism): 3 × 5
    assert folded.iteration_time_s == pytest.approx(full.iteration_time_s, rel=1e-6)


def test_an_oversubscribed_fabric_is_not_folded_in_effect():
    # 3:1 uplinks can be a bottleneck of their own: DP replicas across leaves stay unfolded (TP only)
    fold, note = choose_fold(scenario(12, 5, 8, 8, over=3))
    assert "in effect" not in note and not fold.checked
    assert fold.copies == 8  # the TP 8 peers only
    folded, full = simulate(scenario(12, 5, 8, 8, over=3)), simulate(scenario(12, 5, 8, 8, over=3, fold="off"))
    assert folded.ranks_simulated == 60  # 12 × 5 stages
    assert folded.iteration_time_s == pytest.approx(full.iteration_time_s, rel=1e-6)


def test_thin_uplinks_are_not_non_blocking():
    # leaves of 4 nodes × 8 NICs × 25 GB/s = 800 GB/s down; link_bandwidth 50 GB/s × 8 spines = 400 GB/s up
    fold, note = choose_fold(scenario(6, 7, 8, 4, extra=", link_bandwidth: 50 GB/s"))
    assert not fold.checked and fold.copies == 8
    fold, note = choose_fold(scenario(6, 7, 8, 4, extra=", link_bandwidth: 100 GB/s"))  # 800 GB/s up: enough
    assert fold.checked and fold.copies == 48


def _tolerant(dp, pp, tp, leaf, tol):
    sc = scenario(dp, pp, tp, leaf)
    return replace(sc, simulation=replace(sc.simulation, fold_tolerance=tol))


def test_a_tolerance_keeps_the_fold_within_bounds():
    # DP 3 × PP 5 on leaves of 4 (above): stage p of replica r is node 3p + r; p → p+1 crosses a leaf
    # for some replicas and not others at p = 0, 1, 2 (nodes 0→3 stays in leaf 0, 1→4 crosses), and
    # for all at p = 3 (9-11 → 12-14). Run with each transfer at the least and at the greatest latency
    # of its copies, the iteration times differ by 2 us per such transfer on the critical path: a whole
    # number of 2 us; the run with every rank simulated lies between them.
    full = simulate(scenario(3, 5, 8, 4, fold="off")).iteration_time_s
    kept = simulate(_tolerant(3, 5, 8, 4, 1e-3))
    lo, hi = kept.fold_bounds_s
    assert kept.ranks_simulated == 5 and kept.iteration_time_s == hi
    assert lo <= full <= hi
    steps = (hi - lo) / 2e-6
    assert steps == pytest.approx(round(steps), abs=1e-6) and round(steps) >= 1
    assert "the iteration time lies between" in kept.notes[0]
    assert summarize(kept)["sim"]["fold_bounds_s"] == [lo, hi]
    # (hi - lo) / hi ≈ 7.4e-4: above a tolerance of 1e-4, so that fold refuses itself (exact, rank by rank)
    refused = simulate(_tolerant(3, 5, 8, 4, 1e-4))
    assert refused.fold_bounds_s is None and refused.ranks_simulated == 15
    assert refused.iteration_time_s == pytest.approx(full, rel=1e-12)
    assert "fold_bounds_s" not in summarize(refused)["sim"]


def test_a_tolerance_out_of_range_is_named():
    text = ("name: t\ncluster: {nodes: 1, node: dgx-a100}\nmodel: {preset: gpt3-1.3b}\n"
            "simulation: {fold_tolerance: 0.5}\n")
    with pytest.raises(EmulatorError, match=r"t.yaml:4.*simulation.fold_tolerance"):
        load_scenario_text(text, "t.yaml")


def test_an_unknown_spread_is_named():
    from emulator.run.simulation import build_cluster

    with pytest.raises(ValueError, match="unknown spread 'median'; known: refuse, least, greatest"):
        build_cluster(scenario(3, 5, 8, 4), None, "median")


def _by_rank(spans):
    out = {}
    for s in spans:
        out.setdefault(s.rank, []).append((s.name, s.start_s, s.end_s, s.xfer_s))
    return {r: sorted(v, key=lambda x: (x[1], x[2], x[0])) for r, v in out.items()}


@pytest.mark.parametrize("iterations", [1, 2])
def test_a_refused_fold_stamps_its_replicas_from_the_ops_it_built(iterations):
    # DP 3 × PP 5 on leaves of 4 (above): the fold in effect is refused. The run then reuses the 5
    # ranks' ops it built (one per stage) as a template, stamps the 3 replicas from it and keeps the
    # TP 8 peers folded: 15 ranks simulated from 5 ranks' ops, as the program the automorphisms
    # alone fold would be, built again. The same spans, rank by rank (to 1e-12 s: see below).
    from emulator.run.folding import Stamped
    from emulator.run.simulation import build_workload, run_program

    sc = scenario(3, 5, 8, 4)
    sc = replace(sc, simulation=replace(sc.simulation, iterations=iterations))
    stamped = simulate(sc)
    if iterations == 1:  # (repeated, a program's copies are made: Stamped.repeated)
        assert isinstance(stamped.program, Stamped) and stamped.program.fold.copies == 8
        assert len({op.rank for op in stamped.program.template}) == 5 and len(stamped.program.translations) == 3
    refused = stamped.notes[0].split("not folded: ")[1]
    program, notes = build_workload(sc, refused=refused, blocks=True)
    rebuilt = run_program(program, sc, notes=notes)
    assert not isinstance(rebuilt.program, Stamped) and stamped.notes == rebuilt.notes
    assert stamped.program.fold == rebuilt.program.fold
    assert stamped.ranks_simulated == rebuilt.ranks_simulated == 15
    # the copies start their ops copy by copy, where the rebuilt program's ranks start in rank order: at
    # one instant the fabric may add the same rates in another order (a last bit: 0.024291476740295360
    # vs ...376 s, 7e-16)
    assert stamped.iteration_time_s == pytest.approx(rebuilt.iteration_time_s, rel=1e-12)
    a, b = _by_rank(stamped.spans), _by_rank(rebuilt.spans)
    assert a.keys() == b.keys() and all(len(a[r]) == len(b[r]) for r in a)
    assert all(x[0] == y[0] and x[1:] == pytest.approx(y[1:], abs=1e-12) for r in a for x, y in zip(a[r], b[r]))
    assert stamped.link_bytes == pytest.approx(rebuilt.link_bytes, rel=1e-12)
    assert summarize(stamped)["compute_source"] == summarize(rebuilt)["compute_source"]
