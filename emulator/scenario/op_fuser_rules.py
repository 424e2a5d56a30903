"""The rules of Megatron-Core's Transformer Engine op fuser for the routed experts (``model.
use_transformer_engine_op_fuser``).

Megatron-Core asserts ``TEGroupedMLP._is_fused_impl_supported()`` when the key is set (transformer/moe/experts.py @
d98e8a64dd, lines 382-455): no tensor parallelism inside the experts, no selective offloading of expert_fc1 or
moe_act, and SwiGLU (or quick GeGLU) or weighted squared-ReLU experts only. The CuTe DSL kernels that it then runs on
Blackwell under MXFP8 or NVFP4 (Transformer Engine ops/fused/grouped_mlp.py) are chosen by the GPU and the recipe,
not refused. Pure functions of the specs, as rules.py's.
"""
from __future__ import annotations

from emulator.scenario.spec import ModelSpec, ParallelSpec, TrainingSpec
from emulator.scenario.violation import Violation

KEY = "model.use_transformer_engine_op_fuser"


def op_fuser_violations(m: ModelSpec, t: TrainingSpec, p: ParallelSpec) -> list[Violation]:
    """What Megatron-Core's fused experts cannot run, by key, for a model ``m`` (resolved) with the op fuser."""
    if not m.use_transformer_engine_op_fuser or not m.experts:
        return []
    out: list[Violation] = []
    etp = p.etp or p.tp
    if etp > 1:
        out.append(Violation(KEY, f"Megatron-Core's fused experts run without tensor parallelism: the experts' TP "
                                  f"is {etp} (parallel.etp, or tp where etp is unset); set parallel.etp: 1"))
    act = m.activation or ("swiglu" if m.swiglu else "gelu")
    if act not in ("swiglu", "squared_relu"):
        out.append(Violation(KEY, f"Megatron-Core fuses SwiGLU and squared-ReLU experts only (model.activation is "
                                  f"{act})"))
    partial = sorted({"expert_fc1", "moe_act"} & set(t.offload_modules or ()))
    if partial:
        out.append(Violation("training.offload_modules", f"Megatron-Core offloads {', '.join(partial)} only from the "
                                                         f"unfused experts: remove them, or "
                                                         f"use_transformer_engine_op_fuser"))
    return out
