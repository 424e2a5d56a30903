"""The optimizer's rules (the rule book's, rules.py, calls them in this order): Apex's DistributedFusedAdam,
Megatron-Core's precision-aware optimizer and Megatron-Core's Muon (workload/optimizer.py, workload/muon.py). Pure
functions of the specs, as the rule book's."""
from __future__ import annotations

from emulator.scenario.spec import ModelSpec, ParallelSpec, TrainingSpec
from emulator.scenario.violation import Violation

__all__ = ["MUON_KEYS", "optimizer_violations"]


def optimizer_violations(m: ModelSpec, t: TrainingSpec, p: ParallelSpec) -> list[Violation]:
    """Every optimizer rule that ``t`` and ``p`` break for model ``m`` (resolved), in the loader's order."""
    out: list[Violation] = []
    if t.optimizer == "apex" and p.zero not in (1, 2):
        out.append(Violation("training.optimizer", f"optimizer apex (DistributedFusedAdam) shards the optimizer "
                                                   f"state over the data-parallel ranks: it needs parallel.zero 1 "
                                                   f"or 2, got {p.zero}"))
    return out + _precision_aware_violations(t) + _muon_violations(m, t, p)


def _precision_aware_violations(t: TrainingSpec) -> list[Violation]:
    """Megatron-Core's precision-aware optimizer as OptimizerConfig checks it (optimizer_config.py @ d98e8a64dd,
    ``__post_init__``): the states' types only with it ("exp_avg_dtype can only be fp32 when not using
    precision-aware optimizer"), and it only over Megatron-Core's DistributedOptimizer with TE's FusedAdam."""
    if t.use_precision_aware_optimizer:
        if t.optimizer != "megatron":
            return [Violation("training.use_precision_aware_optimizer", "the precision-aware optimizer is Megatron-"
                                                                         "Core's, with Transformer Engine's FusedAdam: "
                                                                         "set training.optimizer megatron")]
        return []
    for name in ("main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
        if getattr(t, name) != "fp32":
            return [Violation(f"training.{name}", f"{name} can only be fp32 when not using the precision-aware "
                                                  f"optimizer (set training.use_precision_aware_optimizer: true; "
                                                  f"Megatron-Core)")]
    return []


MUON_KEYS = {"muon_num_ns_steps": 5, "muon_tp_mode": "duplicated", "muon_split_qkv": True,
             "muon_fp32_matmul_prec": "medium"}


def _muon_violations(m: ModelSpec, t: TrainingSpec, p: ParallelSpec) -> list[Violation]:
    """Megatron-Core's Muon (workload/muon.py) where Megatron-Core and Megatron-LM take it, and the models the
    emulator knows its matrices of: muon keeps its states whole at ZeRO 0 (Megatron-LM arguments.py @ d98e8a64dd
    turns muon with --use-distributed-optimizer, ZeRO 1, into the layer-wise optimizer); dist_muon's
    LayerWiseDistributedOptimizer shards the states and keeps whole gradients (layer_wise_optimizer.py), and
    neither runs on Megatron-FSDP or Torch-FSDP2 (arguments.py: "Emerging optimizer does not support ...") nor
    with fp16 (optimizer/__init__.py: "emerging optimizer with fp16 is not supported")."""
    if t.optimizer not in ("muon", "dist_muon"):
        return [Violation(f"training.{k}", f"training.{k} is a setting of Megatron-Core's Muon: it needs "
                                           f"training.optimizer muon or dist_muon (it is {t.optimizer})")
                for k, default in MUON_KEYS.items() if getattr(t, k) != default][:1]
    out: list[Violation] = []
    if t.optimizer == "muon" and p.zero not in (0, 1):
        out.append(Violation("parallel.zero", f"optimizer muon keeps its states whole on every data-parallel rank "
                                              f"(parallel.zero 0), or, with the distributed optimizer (zero 1), "
                                              f"deals them out layer-wise as dist_muon does "
                                              f"(megatron/training/arguments.py); got zero {p.zero}"
                                              + (" (emerging optimizers do not run on Megatron-FSDP or Torch-FSDP2)"
                                                 if p.zero == 3 else "")))
    if t.optimizer == "dist_muon" and p.zero != 1:
        out.append(Violation("parallel.zero", f"optimizer dist_muon (Megatron-Core's LayerWiseDistributedOptimizer, "
                                              f"megatron/core/optimizer/layer_wise_optimizer.py) shards the "
                                              f"optimizer states over the data-parallel ranks and keeps whole "
                                              f"gradients, which DDP all-reduces: it needs parallel.zero 1, got "
                                              f"{p.zero}" + (" (emerging optimizers do not run on Megatron-FSDP "
                                                             "or Torch-FSDP2: megatron/training/arguments.py)"
                                                             if p.zero == 3 else "")))
    if t.precision == "fp16":
        out.append(Violation("training.precision", "Megatron-Core refuses Muon with fp16 ('emerging optimizer with "
                                                   "fp16 is not supported', megatron/core/optimizer/__init__.py): "
                                                   "use bf16"))
    if m.hybrid_layer_pattern:
        out.append(Violation("training.optimizer", "the emulator models Muon's weight matrices for transformer "
                                                   "layers (MHA, GQA, MLA, DSA, dsv4_hybrid, mHC), not hybrid "
                                                   "(Mamba, gated delta net) layers"))
    return out
