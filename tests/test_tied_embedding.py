"""The tied-embedding gradient all-reduce between the first and last pipeline stage runs after the
pipeline flush, as Megatron's finalize_model_grads does it, and moves main_grad, of the DP reduction's
dtype (emulator/workload/builder.py, ``_tied_embedding_allreduce``)."""
from test_builder import TINY, run, scen

from emulator.program import SEND
from emulator.scenario import ParallelSpec
from emulator.workload.builder import build_program


def _program(**par):
    return build_program(scen(2, ParallelSpec(pp=2, **par)))  # 2 GPUs: pp 2, tp 1, dp 1, 8 micro-batches


def test_it_waits_for_the_ranks_last_compute_and_last_sends():
    prog = _program()
    by_id = {o.id: o for o in prog.ops}
    for rank in (0, 1):
        ops = [o for o in prog.ops if o.rank == rank]
        (ar,) = [o for o in ops if o.name == "embedding_grad_all_reduce"]
        sends = [o for o in ops if o.kind is SEND]
        # stage 0 sends activations forward, stage 1 gradients back: its last one is micro-batch 7's
        assert sends[-1].name == ("mb7.send_act" if rank == 0 else "mb7.send_grad")
        assert sends[-1].id in ar.deps
        last_compute = [o for o in ops if o.stream == "compute" and o.category != "optimizer"][-1]
        assert last_compute.id in ar.deps
        assert all(by_id[d].rank == rank for d in ar.deps)


def test_it_starts_after_the_last_gradient_send_ends():
    prog = _program()
    end, unfinished = run(prog)
    assert not unfinished
    ops = [o for o in prog.ops if o.rank == 1]
    (ar,) = [o for o in ops if o.name == "embedding_grad_all_reduce"]
    last_send = [o for o in ops if o.kind is SEND][-1]
    # the list engine ends a collective at its start + its cost: it cannot end before the send did
    assert end[ar.id] > end[last_send.id]


def test_it_moves_main_grad_of_the_dp_reductions_dtype():
    # vocab 512 (a multiple of 128: no padding) x hidden 256 / tp 1 = 131,072 gradients; bf16 training keeps
    # main_grad in fp32 (Megatron: --bf16 sets accumulate_allreduce_grads_in_fp32): 4 B each = 524,288 B
    assert TINY.vocab * TINY.hidden * 4 == 524_288
    (ar,) = [o for o in _program().ops if o.name == "embedding_grad_all_reduce" and o.rank == 1]
    assert ar.bytes == 524_288
