"""The rules of Megatron-FSDP's hybrid sharding (HSDP: ``parallel.num_distributed_optimizer_instances`` and
``parallel.outer_dp_sharding_strategy``; workload/builder.py, workload/memory.py), as Megatron-Core checks them. Pure
functions of the specs, as the rule book's (rules.py calls them)."""
from __future__ import annotations

from emulator.scenario.spec import ModelSpec, ParallelSpec
from emulator.scenario.violation import Violation

__all__ = ["hsdp_violations"]


def hsdp_violations(m: ModelSpec, p: ParallelSpec) -> list[Violation]:
    """HSDP is Megatron-FSDP's (``zero`` 3): the instances split dp·cp, and the experts' data-parallel group
    (Megatron-Core parallel_state.py @ d98e8a64dd: "Expert data parallel size should be divisible by partial
    DistOpt shard factor"); outer sharding needs several instances (Megatron-Bridge 067f987df perf_recipes/
    nemotronh/common.py: "with a single NVLink domain HSDP is off, so the outer strategy must be no_shard")."""
    k = p.num_distributed_optimizer_instances
    if k == 1:
        if p.outer_dp_sharding_strategy != "no_shard":
            return [Violation("parallel.outer_dp_sharding_strategy", "outer sharding needs HSDP: set "
                                                                     "parallel.num_distributed_optimizer_instances "
                                                                     "above 1, or use no_shard")]
        return []
    if p.zero != 3:
        return [Violation("parallel.num_distributed_optimizer_instances",
                          f"instances ({k}) are modelled for Megatron-FSDP's HSDP (parallel.zero 3), not for the "
                          f"distributed optimizer's partial sharding (zero {p.zero})")]
    if (p.dp * p.cp) % k:
        return [Violation("parallel.num_distributed_optimizer_instances",
                          f"instances ({k}) must divide dp*cp = {p.dp}*{p.cp} = {p.dp * p.cp}")]
    if m.experts and p.expert_dp() % k:
        return [Violation("parallel.num_distributed_optimizer_instances",
                          f"instances ({k}) must divide the expert-data-parallel size ({p.expert_dp()}), as "
                          f"Megatron-Core's parallel_state.py asserts")]
    return []
