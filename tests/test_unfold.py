"""Stamping copies of the representatives' ops gives exactly the unfolded builder's program."""
import pytest

from emulator.run.folding import program_fold, unfold
from emulator.scenario import load_scenario_text
from emulator.workload.builder import build_program

TEXT = """
name: u
cluster: {{nodes: 2, node: dgx-a100}}
model: {{preset: gpt3-125m, layers: 4, experts: {experts}, top_k: {top_k}}}
training: {{global_batch: 16, micro_batch: 1}}
parallel: {{tp: 2, pp: 2, dp: 4, ep: {ep}, zero: 1, schedule: interleaved-1f1b, virtual_stages: 2}}
"""


def _per_rank(program):
    """Each rank's ops as comparable tuples, deps as positions in that rank's list."""
    pos, out = {}, {}
    for op in program.ops:
        lst = out.setdefault(op.rank, [])
        pos[op.id] = len(lst)
        lst.append(op)
    return {r: [(o.kind, o.stream, o.name, o.duration, o.bytes, o.collective, o.group, o.root, o.peer, o.tag,
                 tuple(pos[d] for d in o.deps)) for o in lst] for r, lst in out.items()}


@pytest.mark.parametrize("experts,top_k,ep", [(0, 0, 1), (4, 2, 2)])
def test_unfold_equals_direct_build(experts, top_k, ep):
    sc = load_scenario_text(TEXT.format(experts=experts, top_k=top_k, ep=ep), "u.yaml")
    fold = program_fold(sc)
    stamped = unfold(build_program(sc, fold), fold)
    direct = build_program(sc, None)
    assert len(stamped.ops) == len(direct.ops)
    assert _per_rank(stamped) == _per_rank(direct)
