"""The build's fast paths (issue #13, "Build fast") change nothing a user can see: an Op made by the
faster ``__init__`` is the dataclass's own op, the engine wires a program the same whether or not
its ids are positions, and the garbage collector is left as it was found."""
import dataclasses
import gc
import inspect

import pytest
from helpers import custom_scenario, star

from emulator.devices.gpu import Gpu
from emulator.network.collectives import CollectiveModel
from emulator.network.raw_plan import StepCosts
from emulator.network.routing import Router
from emulator.network.topology import build_topology
from emulator.program import COLLECTIVE, COMPUTE, RECV, SEND, Op, Program
from emulator.run.engine import Engine
from emulator.run.simulation import build_workload, run_program, simulate
from emulator.run.wiring import wire
from emulator.scenario import load_scenario_text


def test_op_init_keeps_the_dataclass_signature_and_defaults():
    # the fields, in order, and their defaults are the parameters of Op(...)
    params = inspect.signature(Op).parameters
    fields = dataclasses.fields(Op)
    assert list(params) == [f.name for f in fields]
    for f in fields:
        want = inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default
        assert params[f.name].default == want, f.name
    op = Op(3, 1, COMPUTE)
    assert (op.id, op.rank, op.kind, op.stream, op.deps, op.name, op.duration, op.flops, op.bytes) == \
        (3, 1, COMPUTE, "compute", (), "", None, 0.0, 0.0)
    assert (op.category, op.collective, op.group, op.root, op.peer, op.tag) == ("", "", (), -1, -1, 0)
    assert (op.microbatch, op.stage, op.layer, op.costed) == (-1, -1, -1, ())


def test_op_stays_frozen_and_costed_stays_out_of_equality():
    a = Op(0, 2, SEND, "pp", (), "s", bytes=4.0, peer=3, tag=9, costed=(1.0, 0.0, 0.0))
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.id = 5  # type: ignore[misc]
    b = Op(id=0, rank=2, kind=SEND, stream="pp", name="s", bytes=4.0, peer=3, tag=9)
    assert a == b and hash(a) == hash(b)  # costed is report metadata: not compared
    c = dataclasses.replace(a, tag=10)
    assert c.tag == 10 and c.peer == 3 and c != a
    with pytest.raises(TypeError):
        Op(0, 0)  # kind is required, as in the generated __init__


def _engine(ops: list[Op], tmp_path) -> Engine:
    sc = custom_scenario(star(tmp_path, 2))
    topo = build_topology(sc.cluster)
    model = CollectiveModel(Router(topo), topo.node_of, StepCosts())
    gpus = {r: Gpu(r, None) for r in range(2)}
    return Engine(Program(2, ops), model, topo.capacity, gpus)


@pytest.mark.parametrize("base", [0, 100])  # 0: ids are positions (the builder's); 100: a trace's own ids
def test_wire_is_the_same_with_or_without_positional_ids(tmp_path, base):
    # rank 0: 0 compute; 1 compute after 0 on its stream; 2 send (stream pp) waits for 1
    # rank 1: 3 recv (stream pp); 4 compute waits for 3 and 0 (a dep across ranks is fine here)
    ops = [Op(base + 0, 0, COMPUTE, duration=1.0), Op(base + 1, 0, COMPUTE, duration=1.0),
           Op(base + 2, 0, SEND, "pp", (base + 1,), peer=1, bytes=8.0),
           Op(base + 3, 1, RECV, "pp", (), peer=0, bytes=8.0), Op(base + 4, 1, COMPUTE, deps=(base + 3, base + 0), duration=1.0)]
    off, to, wait = wire(_engine(ops, tmp_path).tops)
    succ = [list(to[off[t]:off[t + 1]]) for t in range(len(off) - 1)]
    # successors by position: 0 → 1 (stream), 4 (dep); 1 → 2 (dep); 3 → 4 (dep); 2, 4 → none
    assert succ == [[1, 4], [2], [], [4], []]
    # prerequisites: 0: none; 1: its stream predecessor; 2: dep 1; 3: none; 4: deps 3 and 0 (first
    # compute of rank 1, so no stream predecessor)
    assert wait == [0, 1, 1, 0, 2]


def test_a_run_leaves_the_collector_as_it_found_it(tmp_path):
    sc = custom_scenario(star(tmp_path, 2))
    ops = [Op(0, 0, COLLECTIVE, collective="all_reduce", group=(0, 1), bytes=1e6),
           Op(1, 1, COLLECTIVE, collective="all_reduce", group=(0, 1), bytes=1e6)]
    assert gc.isenabled() and gc.get_freeze_count() == 0
    run_program(Program(2, ops), sc)
    assert gc.isenabled() and gc.get_freeze_count() == 0  # on again, nothing left frozen
    gc.disable()
    try:
        run_program(Program(2, ops), sc)
        assert not gc.isenabled()  # a caller's choice is kept
    finally:
        gc.enable()


def test_a_built_program_runs_with_the_collector_back_on():
    text = """
name: s
cluster: {nodes: 1, node: dgx-a100}
model: {preset: gpt3-125m, layers: 2}
training: {global_batch: 4, micro_batch: 1}
parallel: {tp: 2, pp: 2, dp: 2}
"""
    sc = load_scenario_text(text, "s.yaml")
    simulate(sc, record_links=False)
    assert gc.isenabled() and gc.get_freeze_count() == 0
    build_workload(sc)  # a build alone (--estimate, export) only pauses the collector: nothing set aside
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_link_compression_keeps_one_link_per_signature():
    from emulator.network.compression import compress_plans
    from emulator.network.flows import FlowSpec

    capacity = [10.0] * 10
    capacity[6] = 20.0
    # flow 0 on links 1 2 3 5 6, flow 1 on 2 3 4 5 6 (sorted, as plans are built)
    f0 = FlowSpec((1, 2, 3, 5, 6), (1.0, 1.0, 0.5, 1.0, 1.0), 1.0, 1e-6)
    f1 = FlowSpec((2, 3, 4, 5, 6), (1.0, 1.0, 1.0, 1.0, 1.0), 0.5, 2e-6)
    # a hand-made flow, unsorted and with a repeated link: 9 twice the weight of 7, 7 listed twice
    f2 = FlowSpec((9, 7, 7), (2.0, 1.0, 1.0), 1.0, 0.0)
    (a, b), keep = compress_plans([[[f0, f1]], [[f2]]], capacity)
    # users (flow, weight): 1 {0:1}; 2 {0:1, 1:1}; 3 {0:.5, 1:1}; 4 {1:1}; 5 as 2 → kept as 2;
    # 6 as 2 but 20 B/s instead of 10 → its own; 7 {2:1, 2:1}; 9 {2:2}
    assert keep == {1: 1, 2: 2, 3: 3, 4: 4, 5: 2, 6: 6, 7: 7, 9: 9}
    assert [(f.links, f.weights, f.volume, f.latency) for f in a[0]] == [
        ((1, 2, 3, 6), (1.0, 1.0, 0.5, 1.0), 1.0, 1e-6), ((2, 3, 4, 6), (1.0, 1.0, 1.0, 1.0), 0.5, 2e-6)]
    # the unsorted flow: its distinct (link, weight) pairs, sorted
    assert (b[0][0].links, b[0][0].weights) == ((7, 9), (1.0, 2.0))


def test_busiest_links_breaks_ties_at_the_cut_by_name():
    from types import SimpleNamespace

    from emulator.outputs.nic import busiest_links

    names = [("c", "x"), ("e", "x"), ("a", "x"), ("f", "x"), ("g", "x"), ("b", "x"), ("d", "x")]
    topo = SimpleNamespace(links=names, capacity=[1.0] * 7, cls=["ib"] * 7)
    # capacity 1 B/s over 1 s: utilisation = bytes. 0.9 (e), 0.7 (g), then four at 0.5 (c a b d) of
    # which the third place goes to the first by name, a; f moved nothing and is never listed
    util = [0.5, 0.9, 0.5, 0.0, 0.7, 0.5, 0.5]
    top = busiest_links(topo, util, 1.0, top=3)  # type: ignore[arg-type]
    assert [(t["link"], t["utilisation"]) for t in top] == [("e->x", 0.9), ("g->x", 0.7), ("a->x", 0.5)]
    top = busiest_links(topo, util, 1.0, top=5)  # type: ignore[arg-type]
    assert [t["link"] for t in top] == ["e->x", "g->x", "a->x", "b->x", "c->x"]
    assert len(busiest_links(topo, util, 1.0, top=10)) == 6  # type: ignore[arg-type]


def test_busiest_nic_first_by_name_among_equals_and_egress_first():
    from emulator.outputs.nic import busiest_nic, nics

    text = "name: n\ncluster: {nodes: 2, node: dgx-a100}\n"
    topo = build_topology(load_scenario_text(text, "n.yaml").cluster)
    all_nics = nics(topo)  # sorted by name
    a, b = all_nics[3], all_nics[1]  # b comes first by name
    period = 2.0
    load = [0.0] * len(topo.capacity)

    def put(link: int, u: float) -> None:  # bytes for utilisation u over the period
        load[link] = u * topo.capacity[link] * period

    put(a.egress[0], 0.5)
    put(b.ingress[0], 0.5)
    # 0.5 on both: the first by name wins, in the direction that reached it
    assert busiest_nic(topo, load, period) == {"nic": b.name, "direction": "ingress", "utilisation": 0.5}
    put(b.egress[0], 0.25)  # lower than its ingress: changes nothing
    assert busiest_nic(topo, load, period) == {"nic": b.name, "direction": "ingress", "utilisation": 0.5}
    put(b.egress[0], 0.5)  # equal to its ingress: egress is looked at first
    assert busiest_nic(topo, load, period) == {"nic": b.name, "direction": "egress", "utilisation": 0.5}
    put(a.ingress[0], 0.75)  # higher: a wins whatever its name
    assert busiest_nic(topo, load, period) == {"nic": a.name, "direction": "ingress", "utilisation": 0.75}
    assert busiest_nic(topo, [0.0] * len(load), period) is None


def test_a_failed_build_sets_nothing_aside(monkeypatch):
    import emulator.run.simulation as simulation

    sc = load_scenario_text("""
name: s
cluster: {nodes: 1, node: dgx-a100}
model: {preset: gpt3-125m, layers: 2}
training: {global_batch: 4, micro_batch: 1}
parallel: {tp: 2, pp: 2, dp: 2}
""", "s.yaml")

    def fails(scenario, refused="", blocks=False):
        raise simulation.EmulatorError("s.yaml: no program")

    monkeypatch.setattr(simulation, "build_workload", fails)
    with pytest.raises(simulation.EmulatorError, match="no program"):
        simulation.simulate(sc)
    # no run follows to give anything back: nothing was set aside
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_links_that_differ_in_their_last_bits_tie_and_the_name_decides():
    from types import SimpleNamespace

    from emulator.outputs.nic import busiest_links, busiest_nic, nics

    # the same 1.5e10 B summed in two orders: 15060287487.999386 and 15060287487.999374 (quickstart's
    # NVLink up and down), 8e-16 apart; to 12 digits both are 1.50602874880e10, so the name decides:
    # "a" before "b", though b carried the larger float. Each keeps its own utilisation.
    topo = SimpleNamespace(links=[("b", "x"), ("a", "x")], capacity=[1.0, 1.0], cls=["nvlink"] * 2)
    top = busiest_links(topo, [15060287487.999386, 15060287487.999374], 1.0, top=1)  # type: ignore[arg-type]
    assert [(t["link"], t["utilisation"]) for t in top] == [("a->x", 15060287487.999374)]
    # a real difference (1e-9 relative, 15 B) still ranks first
    top = busiest_links(topo, [15060287503.0, 15060287488.0], 1.0, top=1)  # type: ignore[arg-type]
    assert top[0]["link"] == "b->x"

    text = "name: n\ncluster: {nodes: 2, node: dgx-a100}\n"
    topo2 = build_topology(load_scenario_text(text, "n.yaml").cluster)
    all_nics = nics(topo2)
    first, later = all_nics[1], all_nics[3]  # by name
    load = [0.0] * len(topo2.capacity)
    load[later.egress[0]] = 0.5 * (1 + 4e-16) * topo2.capacity[later.egress[0]]  # 0.5 and 2 ulps: a tie
    load[first.ingress[0]] = 0.5 * topo2.capacity[first.ingress[0]]
    got = busiest_nic(topo2, load, 1.0)
    assert got is not None and (got["nic"], got["direction"]) == (first.name, "ingress")
