"""Adam's state per parameter and the bytes its step moves, for the distributed optimizer a scenario names.

Pure functions of a TrainingSpec. workload/memory.py charges the states (before sharding); workload/builder.py and
the closed form (studies/rank.py) cost the step as a stream over them.

- **megatron** (Megatron-Core's DistributedOptimizer): an fp32 main copy of each 16-bit weight
  (megatron/core/optimizer/distrib_optimizer.py @ d98e8a64dd, ``shard_fp32_from_float16_groups``, lines 375-445:
  ``shard_main_param = ... .float()``) and Adam's fp32 momentum and variance: 4 + 4 + 4.
- **Megatron-Core's precision-aware optimizer** (``use_precision_aware_optimizer``; optimizer/optimizer_config.py
  @ d98e8a64dd): Transformer Engine's FusedAdam keeps the moments in ``exp_avg_dtype`` and ``exp_avg_sq_dtype``
  (fp32 4, fp16 or bf16 2, fp8 1: Megatron-LM's ``--exp-avg-dtype`` fp8 is uint8). Who keeps the main weight
  follows ``use_precision_aware_optimizer_no_fp8_or_ds_fp8``: where ``main_params_dtype`` is fp16, or the run is
  not quantised or quantised with delayed scaling, TE does (optimizer/__init__.py: ``master_weights=True``,
  ``master_weight_dtype``), and with ``store_param_remainders`` (TE 2.1 on, Megatron-Core's default) an fp32
  main weight of a bf16 parameter is kept as its 16-bit remainder; fp16 main weights take 2 bytes. Elsewhere
  (per-tensor current scaling, MXFP8, NVFP4 with an fp32 main weight) Megatron-Core keeps its fp32 copy.
- **apex** (Apex DistributedFusedAdam as NeMo sets it up for bf16, O2, training:
  nemo/collections/nlp/models/language_modeling/megatron_base_model.py @ 8cfedd72, lines 840-861: state ``dtype``
  fp32, ``param_sync_dtype`` the model's bf16, and for an fp32 optimizer over a bf16 model ``store_params =
  False``, ``store_param_remainders = True``). Its StateBucket holds, per parameter of its shard, an int16
  ``param_remainders_shard`` and ``exp_avg_shard`` and ``exp_avg_sq_shard`` in fp32
  (apex/contrib/optimizers/distributed_fused_adam.py @ 6424da3b, lines 450-476): 2 + 4 + 4 = 10. With fp16 or
  fp8 weights (NeMo: ``store_params = True`` when fp8_params) the main weight is a full fp32 copy: 12.

The step (one fused kernel per bucket, memory-bound) reads the gradient (4 B), reads and writes each moment,
and updates the main weight: an fp32 copy is read and written and the 16-bit weight written from it (4 + 4 + 2);
a remainder is read and written with the bf16 weight it completes (2 + 2 each way); an fp16 main weight is read
and written and the 16-bit weight written (2 + 2 + 2). Megatron's clip_grad_norm reads the gradient once more
(4). For the default states that is 16 + 12 + 2 + 4 = 34 B a parameter.
"""
from __future__ import annotations

from emulator.scenario.spec import QUANTISED, TrainingSpec
from emulator.workload.layer import recipe_of

MOMENT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}  # exp_avg_dtype, exp_avg_sq_dtype
GRAD_READ_BYTES = 4  # the fp32 main gradient the step reads, and clip_grad_norm reads again
# what updating one main weight moves (the module docstring): an fp32 copy, a 16-bit remainder, an fp16 main weight
FP32_MAIN_UPDATE_BYTES, REMAINDER_UPDATE_BYTES, FP16_MAIN_UPDATE_BYTES = 10, 8, 6


def _bf16_weights(tr: TrainingSpec) -> bool:
    """The model's weights are bf16: bf16 training, or quantised GEMMs over bf16 weights."""
    return tr.precision == "bf16" or (tr.precision in QUANTISED and not (tr.fp8_params or tr.fp4_param))


def te_keeps_main(tr: TrainingSpec) -> bool:
    """Megatron-Core's ``use_precision_aware_optimizer_no_fp8_or_ds_fp8``: TE's FusedAdam keeps the main weight
    (fp16 main weights, or no quantisation, or delayed scaling)."""
    recipe = recipe_of(tr.precision, tr.fp8_recipe) if tr.precision in QUANTISED else ""
    return tr.main_params_dtype != "fp32" or recipe in ("", "delayed")


def main_weight_bytes(tr: TrainingSpec) -> int:
    """Bytes a parameter's main weight takes in the optimizer's state (see the module docstring)."""
    if tr.optimizer == "apex":
        bf16 = tr.precision == "bf16" or (tr.precision == "fp8" and not tr.fp8_params)
        return 2 if bf16 else 4
    if not tr.use_precision_aware_optimizer:
        return 4
    if tr.main_params_dtype == "fp16":
        return 2
    return 2 if te_keeps_main(tr) and tr.store_param_remainders and _bf16_weights(tr) else 4


def moment_bytes(tr: TrainingSpec) -> int:
    """Bytes of Adam's two moments per parameter."""
    if tr.optimizer == "megatron" and tr.use_precision_aware_optimizer:
        return MOMENT_BYTES[tr.exp_avg_dtype] + MOMENT_BYTES[tr.exp_avg_sq_dtype]
    return 8


def optimizer_state_bytes(tr: TrainingSpec) -> float:
    """Adam's state per parameter, before sharding: the main weight and the two moments."""
    return float(main_weight_bytes(tr) + moment_bytes(tr))


def adam_step_bytes(tr: TrainingSpec) -> float:
    """Bytes the optimizer step moves per local parameter (see the module docstring): 34 for fp32 states."""
    return float(GRAD_READ_BYTES + 2 * moment_bytes(tr) + _main_update_bytes(tr) + GRAD_READ_BYTES)


def _main_update_bytes(tr: TrainingSpec) -> int:
    if tr.optimizer == "megatron" and tr.use_precision_aware_optimizer and tr.main_params_dtype == "fp16":
        return FP16_MAIN_UPDATE_BYTES
    return REMAINDER_UPDATE_BYTES if main_weight_bytes(tr) == 2 else FP32_MAIN_UPDATE_BYTES
