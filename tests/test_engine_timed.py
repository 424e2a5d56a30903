"""Timed ops: compute on a GPU alone and private collectives finish ahead of the clock (engine.py)."""
import pytest
from helpers import custom_scenario, star

from emulator.network.fabric import alone
from emulator.network.flows import FlowSpec
from emulator.program import COLLECTIVE, COMPUTE, RECV, SEND, Fold, Op, Program
from emulator.run.engine import Engine
from emulator.run.simulation import build_cluster, run_program


def test_a_chain_of_compute_costs_no_event(tmp_path):
    # 1000 kernels of 1 ms in a row on one GPU: they end at 1000 × 1 ms = 1 s, and as each
    # depends only on the one before, none waits for the clock: 0 SimPy events.
    sc = custom_scenario(star(tmp_path, 1))
    ops = [Op(i, 0, COMPUTE, duration=1e-3) for i in range(1000)]
    r = run_program(Program(1, ops), sc)
    assert r.iteration_time_s == pytest.approx(1.0, rel=1e-12)
    assert r.events == 0


def test_alone_runs_a_plan_by_itself():
    # phase 1: two flows of 1000 B on one 100 B/s link, 0.5 s latency each: both start at 0.5 s and
    # share the link at 50 B/s, so both end at 0.5 + 1000/50 = 20.5 s; phase 2: one flow of volume
    # 2 (2 × 1000 B) alone at 100 B/s: 2000/100 = 20 s more: 40.5 s. The link carried
    # 1000 + 1000 + 2000 = 4000 B; its load went 100 B/s (two flows at 50) at 0.5 s, 0 at 20.5 s,
    # 100 B/s again at 20.5 s (the same instant: the record keeps the last), 0 at 40.5 s.
    plan = [[FlowSpec((0,), (1.0,), 1.0, 0.5), FlowSpec((0,), (1.0,), 1.0, 0.5)], [FlowSpec((0,), (1.0,), 2.0, 0.0)]]
    a = alone(plan, 1000.0, [100.0])
    assert a.duration == pytest.approx(40.5, rel=1e-12)
    assert a.link_bytes == ((0, pytest.approx(4000.0, rel=1e-12)),)
    assert [t for t, _ in a.loads][0] == pytest.approx(0.5) and a.loads[-1] == (pytest.approx(40.5), {0: 0.0})


def _two_groups(send: bool) -> tuple[Program, Fold]:
    # 4 GPUs on a grid (2, 2); the second axis folded: ranks 0 and 2 are simulated, 1 and 3 are
    # their copies. Each runs 1 s of compute, an all-reduce with its copy (group (0, 1) or (2, 3)),
    # 1 s of compute; with ``send``, rank 0 then sends 1 MB to rank 2.
    fold = Fold((2, 2), (False, True))
    ops = []
    for base, r, g in ((0, 0, (0, 1)), (3, 2, (2, 3))):
        ops += [Op(base, r, COMPUTE, duration=1.0), Op(base + 1, r, COLLECTIVE, stream="tp", deps=(base,),
                collective="all_reduce", group=g, bytes=1e9), Op(base + 2, r, COMPUTE, deps=(base + 1,), duration=1.0)]
    if send:
        ops += [Op(6, 0, SEND, stream="p2p", deps=(2,), peer=2, bytes=1e6, tag=1),
                Op(7, 2, RECV, stream="p2p", deps=(5,), peer=0, bytes=1e6, tag=1)]
    return Program(4, ops, fold), fold


@pytest.mark.parametrize("send", [False, True])
def test_private_collectives_are_timed_and_exact(tmp_path, send):
    # star of 4 GPUs, 50 GB/s and 1 us a link (a hop g→s→g is 2 us). A 2-rank ring all-reduce of
    # S = 1e9 B: 2(n−1)·α + 2(n−1)/n·S/B = 2 × 2e-6 + 1e9/50e9 = 0.020004 s; the iteration is
    # 1 + 0.020004 + 1 = 2.020004 s. With the send, its 1e6 B follow on g0→s→g2:
    # 2e-6 + 1e6/50e9 = 2.2e-5 s more: 2.020026 s. The send shares g0→s with group (0, 1) and
    # s→g2 with group (2, 3): neither group's collective is private then; without it both are.
    sc = custom_scenario(star(tmp_path, 4, bw=50e9, lat=1e-6))
    program, fold = _two_groups(send)
    cluster = build_cluster(sc, fold)
    engine = Engine(program, cluster.collectives, cluster.topology.capacity, cluster.gpus(program.simulated_ranks()))
    collectives = [t for t, op in enumerate(engine.tops) if op.kind is COLLECTIVE]
    assert [engine.private[t] for t in collectives] == [not send, not send]
    r = run_program(program, sc)
    assert r.iteration_time_s == pytest.approx(2.020026 if send else 2.020004, rel=1e-9)
    # every ring flow moves S·2(n−1)/n = 1e9 B over its 2 links: 2 flows × 2 links × 1e9 B per
    # group, two groups: 8e9 B; the send and its folded copy (rank 1 → 3) move 1e6 B over 2 links
    # each: 4e6 B more
    assert sum(r.link_bytes) == pytest.approx(8e9 + (4e6 if send else 0.0), rel=1e-9)


@pytest.mark.parametrize("pp", [8, 16])
def test_deep_pipelines_with_timed_ops_equal_every_rank_simulated(pp):
    # TP 8 fills a node, so the folded run's tensor-parallel collectives are private (timed, no
    # event) and its compute is timed; with fold: off every TP peer is simulated and every such
    # collective runs on the clock. An 8- and a 16-stage 1F1B pipeline give the same iteration
    # time (1e-9).
    from emulator.run.simulation import simulate
    from emulator.scenario import load_scenario_text

    def sc(fold):
        text = f"""name: t
cluster: {{nodes: {pp}, node: dgx-a100, fabric: {{kind: fat_tree, leaf_size: 4}}}}
model: {{layers: {2 * pp}, hidden: 2048, heads: 16, seq_len: 1024, vocab: 32000}}
training: {{global_batch: {2 * pp}, micro_batch: 1}}
parallel: {{tp: 8, pp: {pp}, dp: 1, schedule: 1f1b}}
simulation: {{fold: {fold}}}
"""
        return load_scenario_text(text, "t.yaml")

    folded, full = simulate(sc("auto")), simulate(sc("off"))
    assert folded.ranks_simulated == pp and full.ranks_simulated == 8 * pp
    assert folded.events < full.events / 5
    assert folded.iteration_time_s == pytest.approx(full.iteration_time_s, rel=1e-9)
