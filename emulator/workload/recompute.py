"""Per-module recompute (``training.recompute_modules`` under ``recompute: selective``).

Megatron's --recompute-modules (megatron/core/transformer/transformer_config.py @ d98e8a64dd,
``recompute_modules``; default ["core_attn"]): "moe_act", "layernorm" and "mla_up_proj" use
output-discarding checkpointing (``CheckpointWithoutOutput``: the output is freed once used and
recomputed when the backward reaches it), "core_attn", "mlp", "moe" and "shared_experts" normal
checkpointing (the module keeps its input, reruns its forward at the start of its backward).
Either way a recomputed module costs its forward once more in the backward, its communication
included (the all-to-alls of ``moe``, the SP all-gathers of ``mla_up_proj``), and frees what it
would have stored (activations.py, :func:`freed_terms`).

A module's recompute is the layer's own forward steps (layer.forward_steps, in the recompute
category) that belong to it, by name, placed before the first backward step of the block it is in:

- core_attn: the attention core (``attn.*``; with fused attention Megatron reruns the fused kernel,
  transformer_layer.py ``_checkpointed_attention_forward``), before the core's backward;
- mla_up_proj: q_up/kv_up (or q) with their SP gathers and the rope (multi_latent_attention.py,
  ``qkv_up_proj_and_rope_apply``), whose recompute is registered on the core attention's output:
  before the core's backward; under DSA (absorbed_mla.py) q_up, the query's absorb einsum and the rope; under
  DeepSeek-V4's attention q_b, its norm and the rope (an ASSUMPTION: Megatron-Core's dev branch is not read);
- layernorm: ln1 before the attention block's backward, ln2 before the MLP block's (registered on
  the attention and the MLP outputs, transformer_layer.py);
- moe_act: the routed experts' activation, before the MLP block's backward;
- mlp: a dense MLP (the SP gather, up, activation, down, its reduce-scatter), before the MLP block's backward;
- moe: the whole MoE layer (router, permutation, dispatch, experts, combine, shared experts);
- shared_experts: the shared experts (``shared.*``), before their backward;
- mhc: mHC's aggregates and posts (hyper_connection.py; CheckpointWithoutOutputManager reruns the layer's at once,
  when its backward begins), before the layer's first backward step.
"""
from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Callable

from emulator.workload import layer as Ly
from emulator.workload.layer import RECOMPUTE, Comm, LayerShape, Step
from emulator.workload.userbuffers import ub_comm

ACTS = ("swiglu", "gelu", "squared_relu")


def _base(name: str) -> str:
    """A step's module-level name: an FP8 cast's is its GEMM's ("q_up.fp8_cast_x" → "q_up")."""
    return name.split(".fp8_cast")[0]


def belongs(module: str, name: str, L: LayerShape) -> bool:
    """Whether the forward step ``name`` of a layer of shape ``L`` is part of ``module``."""
    n = _base(name)
    if module == "core_attn":
        return n.startswith("attn.")
    if module == "mla_up_proj" and L.dsv4:
        return n in ("q_b", "q_b.ag", "q_b_norm", "rope")
    if module == "mhc":
        return n.startswith("hc.") and n.endswith((".aggregate", ".pre", ".post"))
    if module == "mla_up_proj":
        up = ("q_up", "q_up.ag", "kv_up", "kv_up.ag", "q_absorb", "rope") + (() if L.q_rank else ("q", "q.ag"))
        return L.mla and n in up
    if module == "layernorm":
        return n in ("ln1", "ln2")
    if module == "moe_act":
        return bool(L.experts) and n in ACTS
    if module == "mlp":
        return not L.experts and (n in ("ln2.ag", "mlp.up", "mlp.down", "mlp.rs", "mlp.ar") or n in ACTS)
    if module == "moe":
        return bool(L.experts) and (n.startswith(("moe.", "shared.")) or n in ACTS
                                    or n in ("ln2.ag", "mlp.rs", "mlp.ar"))
    if module == "shared_experts":
        return bool(L.experts) and n.startswith("shared.")
    return False


def _anchor(module: str, name: str) -> bool:
    """Whether backward step ``name`` is where ``module``'s recompute goes (the first one that is)."""
    if module in ("core_attn", "mla_up_proj"):
        return name.startswith("attn.")
    if module == "mhc":
        return name.startswith("hc.")
    if module == "shared_experts":
        return name.startswith("shared.")
    return name.startswith(("mlp.", "moe."))


def recompute_steps(L: LayerShape, module: str, fwd: list[Step]) -> list[Step]:
    """The forward steps of ``module`` in ``fwd``, in the recompute category (its comms blocking, but for those
    Userbuffers run under their own GEMM's chunks, which the module reruns with them: userbuffers.ub_comm)."""
    out: list[Step] = []
    for st in fwd:
        if belongs(module, st.name, L):
            out.append(replace(st, category=RECOMPUTE, overlap=st.overlap if ub_comm(st, L) else 0)
                       if isinstance(st, Comm) else replace(st, category=RECOMPUTE))
    return out


def backward_with_modules(L: LayerShape, modules: tuple[str, ...]) -> list[Step]:
    """A layer's backward with ``modules`` recomputed (Megatron's --recompute-modules)."""
    bwd = Ly.backward_steps(L, "none")
    fwd = Ly.forward_steps(L)
    names = [st.name for st in bwd]
    # (position in the backward, order among those there, steps): mla_up_proj before core_attn, whose
    # recompute needs the query, key and value; ln1 before the attention block, ln2 before the MLP's
    inserts: list[tuple[int, int, list[Step]]] = []
    for module in modules:
        steps = recompute_steps(L, module, fwd)
        if module == "layernorm":
            inserts.append((_first(names, lambda n: n.startswith("proj.")), 0,
                            [st for st in steps if _base(st.name) == "ln1"]))
            inserts.append((_first(names, lambda n: _anchor("moe", n)), 0,
                            [st for st in steps if _base(st.name) == "ln2"]))
        elif steps:
            inserts.append((_first(names, partial(_anchor, module)), 0 if module == "mla_up_proj" else 1, steps))
    at: dict[int, list[Step]] = {}
    for pos, _order, steps in sorted(inserts, key=lambda x: (x[0], x[1])):
        at.setdefault(pos, []).extend(steps)
    out: list[Step] = []
    for i, st in enumerate(bwd):
        out += at.get(i, [])
        out.append(st)
    return out + at.get(len(bwd), [])


def _first(names: list[str], pred: Callable[[str], bool]) -> int:
    """The index of the first name ``pred`` accepts (the end if none does)."""
    for i, n in enumerate(names):
        if pred(n):
            return i
    return len(names)
