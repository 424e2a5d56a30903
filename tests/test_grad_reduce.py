"""Data-parallel gradient reduction type: Megatron reduces bf16 training's gradients in fp32."""

from emulator.scenario import load_scenario_text
from emulator.workload.builder import build_program
from emulator.workload.plan import grad_reduce_bytes

TEXT = """
name: g
cluster: {nodes: 1, node: dgx-a100}
model: {preset: gpt3-125m, layers: 2}
training: {global_batch: 8, micro_batch: 1, precision: bf16}
parallel: {tp: 1, pp: 1, dp: 8}
"""


def _dp_bytes(sets):
    p = build_program(load_scenario_text(TEXT, "g.yaml", sets), None)
    return sum(op.bytes for op in p.ops if op.rank == 0 and op.stream == "dp"), p.meta.workload.params


def test_rule():
    assert grad_reduce_bytes("bf16", "auto") == 4 and grad_reduce_bytes("fp16", "auto") == 2
    assert grad_reduce_bytes("bf16", "bf16") == 2


def test_bf16_gradients_are_reduced_in_fp32_by_default():
    fp32, params = _dp_bytes([])
    bf16, _ = _dp_bytes(["training.grad_reduce=bf16"])
    # every parameter's gradient is all-reduced once: 4 bytes each by default, 2 with bf16; the
    # embedding is Megatron-padded from 50257 to 50304 rows (a multiple of 128·tp): 47 × 768 more
    assert fp32 == 2 * bf16
    assert bf16 / 2 - params == (50304 - 50257) * 768


def test_auto_reduces_fp8_training_gradients_in_fp32():
    # fp8 training is bf16 training with FP8 GEMMs: fp32 main gradients, as bf16 (4 bytes, not 1)
    assert grad_reduce_bytes("fp8", "auto") == 4
    assert grad_reduce_bytes("fp16", "auto") == 2 and grad_reduce_bytes("fp32", "auto") == 4
