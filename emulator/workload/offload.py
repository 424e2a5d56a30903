"""Megatron-Core's fine-grained activation offloading (``training.fine_grained_activation_offloading``,
``offload_modules``, ``activation_offload_fraction``): what each module sends to host memory per layer and
micro-batch, and which of a chunk's groups are sent.

The terms are workload/activations.py's; workload/memory.py keeps each layer in flight less what it sent, and
workload/builder.py runs the copies (``d2h``, ``h2d``) at the node's host_bandwidth.
"""
from __future__ import annotations

from typing import Sequence

from emulator.scenario.spec import OFFLOAD_MODULES, QUANTISED, ModelSpec, Scenario
from emulator.scenario.stages import ChunkPlan, virtual_stage
from emulator.workload import models as M
from emulator.workload.activations import SAVED_INPUT_BYTES, attention_parts, expert_input_terms, rank_load
from emulator.workload.layer import recipe_of

# Megatron-Core's fine-grained activation offloading (pipeline_parallel/fine_grained_activation_offload.py @
# d98e8a64dd): a saved tensor under min_offloaded_tensor_size elements (1024·1024, transformer_config.py) stays on
# the GPU; applied here to each module's saved inputs together, in 2-byte elements.
OFFLOAD_MIN_ELEMENTS = 1024 * 1024
# ASSUMPTION: beside the layers in flight, the GPU holds three layers' offloaded inputs: one being copied out, one
# reloaded ahead of its backward, and the margin the manager keeps on the GPU (``post_warmup_callback``: the last
# group of each name is not offloaded, so that its reload does not block the compute stream).
OFFLOAD_RESIDENT_LAYERS = 3


def offload_groups(r: ModelSpec, offload: tuple[str, ...], moe: bool, ep: int, g: float, tokens: int,
                   keeps_out: bool, recomputed: tuple[str, ...], etp: int = 1,
                   dpa: bool = False) -> dict[str, tuple[float, float]]:
    """Per offloaded module, the (replicated, sharded) bytes per token of what it saves for its backward
    (``layer_activation_bytes``' terms), less what ``recomputed`` (selective recompute_modules) does not keep:
    attn_norm a separate attention norm's input, 2h (multi-latent attention; elsewhere Transformer Engine fuses
    the norm into the QKV linear, and Megatron-Core skips an IdentityOp); qkv_linear the QKV linear's input (with
    the fused norm, its input 2h too; the MLA latents); core_attn Q, K and V (and the s² scores of an unfused
    attention, which the caller adds); attn_proj the projection's input; mlp_norm an MoE layer's pre-MLP norm
    input, 2h (a dense MLP fuses it); expert_fc1 the routed copies' fc1 input; moe_act the experts' up outputs."""
    h = r.hidden
    ln_out = 0.0 if "layernorm" in recomputed else g * h
    attn_rep, qkv, proj = attention_parts(r, g, keeps_out, dpa)
    mla = M.is_mla(r)
    if mla and "mla_up_proj" in recomputed:
        qkv = 0.0
    groups = {"attn_norm": (2.0 * h if mla else 0.0, 0.0),
              "qkv_linear": (attn_rep - g * h + ln_out if mla else 2.0 * h + ln_out, 0.0),
              "core_attn": (0.0, qkv), "attn_proj": (0.0, proj),
              "mlp_norm": (2.0 * h if moe else 0.0, 0.0),
              "expert_fc1": (0.0, expert_input_terms(r, ep, g, tokens, etp) if moe else 0.0),
              "moe_act": (0.0, r.top_k * rank_load(r, ep, tokens) * 2 * M.expert_ffn(r) * (2 if r.swiglu else 1)
                          if moe else 0.0)}
    return {name: groups[name] for name in offload}


def offloaded_bytes(m: ModelSpec, b: int, s: int, t: int = 1, sp: bool = False, recompute: str = "none",
                    flash: bool = False, dtype: int = 2, ep: int = 1, moe: bool | None = None, fp8: bool = False,
                    modules: tuple[str, ...] | None = None, saved: float = 1.0,
                    offload: tuple[str, ...] = (), etp: int = 1, dpa: bool = False) -> float:
    """Bytes of one layer's stored activations (``layer_activation_bytes``, same arguments) that fine-grained
    activation offloading moves to the host for one micro-batch: the ``offload`` modules' (:func:`offload_groups`),
    each as large as OFFLOAD_MIN_ELEMENTS at least."""
    return sum(offloaded_group_bytes(m, b, s, t, sp, recompute, flash, dtype, ep, moe, fp8, modules, saved, offload,
                                     etp, dpa))


def offloaded_group_bytes(m: ModelSpec, b: int, s: int, t: int = 1, sp: bool = False, recompute: str = "none",
                          flash: bool = False, dtype: int = 2, ep: int = 1, moe: bool | None = None, fp8: bool = False,
                          modules: tuple[str, ...] | None = None, saved: float = 1.0,
                          offload: tuple[str, ...] = (), etp: int = 1, dpa: bool = False) -> list[float]:
    """:func:`offloaded_bytes` per offloaded module group of the layer, in forward order (OFFLOAD_MODULES')."""
    if not offload or recompute == "full":
        return []
    r = M.resolve(m)
    g = saved if fp8 else 2
    is_moe = bool(r.experts) if moe is None else moe
    recomputed = (modules or ()) if recompute == "selective" else ()
    unit = s * b * dtype / 2
    sizes: list[float] = []
    ordered = tuple(name for name in OFFLOAD_MODULES if name in offload)
    for name, (rep, shard) in offload_groups(r, ordered, is_moe, ep, g, b * s, flash and recompute == "none",
                                                  recomputed, etp, dpa and fp8).items():
        if name == "core_attn" and not flash and not (recompute == "selective" and (modules is None
                                                                                    or "core_attn" in modules)):
            mask = 1.0 if M.has_dropout(r) else 0.0
            shard += r.heads * s * (2 + 3 * mask)  # the unfused core's scores, mask and dropout
        size = unit * (rep + shard) / t if sp else unit * (rep + shard / t)
        if size >= 2 * OFFLOAD_MIN_ELEMENTS:
            sizes.append(size)
    return sizes


def layer_offload(sc: Scenario, m: ModelSpec) -> tuple[float, float]:
    """Bytes one layer offloads per micro-batch under ``training.fine_grained_activation_offloading``
    (:func:`offloaded_bytes` at the scenario's shape): (a layer of the model's kind, MoE where it has experts;
    a dense leading layer). (0, 0) without offloading."""
    moe, dense = layer_offload_groups(sc, m)
    return sum(moe), sum(dense)


def layer_offload_groups(sc: Scenario, m: ModelSpec) -> tuple[list[float], list[float]]:
    """:func:`layer_offload` per module group, in forward order."""
    par, tr = sc.parallel, sc.training
    offload = (tr.offload_modules or ()) if tr.fine_grained_activation_offloading else ()
    if not offload:
        return [], []
    dtype = 4 if tr.precision in ("fp32", "tf32") else 2
    flash = getattr(tr, "attention", "unfused") in ("flash", "fa2") or par.cp > 1
    sp = par.sequence_parallel and par.tp > 1
    saved = SAVED_INPUT_BYTES.get(recipe_of(tr.precision, tr.fp8_recipe), 1.0)
    moe_layer, dense_layer = (offloaded_group_bytes(m, tr.micro_batch, m.seq_len // par.cp, par.tp, sp, tr.recompute,
                                                    flash, dtype, par.ep, moe, tr.precision in QUANTISED,
                                                    tr.recompute_modules, saved, offload, par.etp or par.tp,
                                                    tr.fp8_dot_product_attention)
                              for moe in (None, False))
    return moe_layer, dense_layer


def chunk_offload(sc: Scenario, m: ModelSpec, layers: Sequence[int]) -> list[float]:
    """Bytes each of a model chunk's ``layers`` (global indices in forward order; an MTP module's past the
    decoder's, as an MoE layer where there are experts) offloads per micro-batch: of the chunk's eligible groups,
    in forward order, the last int(n·(1 − activation_offload_fraction)) stay on the GPU (Megatron-Core
    fine_grained_activation_offload.py @ d98e8a64dd, ``post_warmup_callback``)."""
    moe, dense = layer_offload_groups(sc, m)
    groups = [(k, size) for k, i in enumerate(layers)
              for size in (moe if (M.is_moe_layer(m, i) if i < m.layers else bool(m.experts)) else dense)]
    kept = int(len(groups) * (1 - sc.training.activation_offload_fraction))
    out = [0.0] * len(layers)
    for k, size in groups[:len(groups) - kept]:
        out[k] += size
    return out


def offload_share(sc: Scenario, m: ModelSpec, plan: ChunkPlan, stage: int, v_shape: bool) -> float:
    """The share of its layers' offloadable bytes that pipeline stage ``stage`` sends with
    activation_offload_fraction (:func:`chunk_offload` over its chunks; 1 at the default fraction 1). The memory
    report takes it for every layer in flight, as if each chunk's kept groups were spread over its layers."""
    if sc.training.activation_offload_fraction >= 1.0:
        return 1.0
    sent = full = 0.0
    moe, dense = layer_offload(sc, m)
    for c in range(len(plan.layers) // sc.parallel.pp):
        k = virtual_stage(c, stage, sc.parallel.pp, v_shape)
        first = sum(plan.layers[:k])
        layers = [*range(first, first + plan.layers[k]),
                  *(m.layers + 1 + d for d in range(plan.mtp if k == plan.mtp_chunk else 0))]
        sent += sum(chunk_offload(sc, m, layers))
        full += sum(moe if (M.is_moe_layer(m, i) if i < m.layers else bool(m.experts)) else dense for i in layers)
    return sent / full if full else 1.0
