"""Multi-token prediction (``model.mtp_num_layers``): the steps, parameters and FLOPs of one MTP module.

As Megatron-Core builds it (megatron/core/transformer/multi_token_prediction.py @ d98e8a64dd,
``MultiTokenPredictionLayer``): the shared embedding looks up the tokens shifted by one
(``_get_embeddings``), ``enorm`` and ``hnorm`` (RMSNorm) normalise that embedding and the hidden
state, the two are concatenated and projected 2h → h by ``eh_proj`` (a column-parallel linear, so
with sequence parallelism its 2h-wide input is all-gathered, and its h/t-wide output is gathered
over TP, ``gather_from_tensor_model_parallel_region``, then scattered back to the sequence shard),
one transformer layer follows (the decoder's last layer's spec: an MoE layer in DeepSeek-V3), then
the module's ``final_layernorm``. The output head is the main model's (``process_mtp_loss``): on the
stage that holds the loss, each MTP module's hidden states go through the same output layer and a
cross-entropy of their own, so the loss stage runs the logits GEMM 1 + mtp_num_layers times. The
MTP block returns the main hidden states and each module's, concatenated along the sequence
(``MultiTokenPredictionBlock.forward``: ``torch.cat(hidden_states_list)``), so a pipeline stage
after it sends (1 + mtp_num_layers)·b·s·h.

Model FLOPs as Megatron-LM counts them (megatron/training/training.py @ d98e8a64dd,
``num_floating_point_operations``): each module adds one layer (MoE if the last decoder layer is),
6·(3h + 2h²) per token for its norms and eh_proj ("MTP norms and proj"), and one more logits pass
(``(mtp_num_layers + 1)``).
"""
from __future__ import annotations

from dataclasses import replace

from emulator.scenario.spec import ModelSpec
from emulator.workload import layer as Ly
from emulator.workload import models as M
from emulator.workload.layer import BWD, FWD, Comm, Kernel, LayerShape, Step


def mtp_extra_params(m: ModelSpec) -> int:
    """One module's weights beside its transformer layer: eh_proj 2h·h and three norms (enorm, hnorm,
    final_layernorm; h each for RMSNorm, 2h for LayerNorm)."""
    s = M.resolve(m)
    norm = 2 * s.hidden if M.has_norm_shift(s) else s.hidden
    return 2 * s.hidden * s.hidden + 3 * norm


def mtp_params(m: ModelSpec) -> int:
    """One module's own weights: its transformer layer (the last decoder layer's kind) and
    :func:`mtp_extra_params`; the embedding and output head are the model's."""
    s = M.resolve(m)
    layer = s.layers + 1 if s.hybrid_layer_pattern or M.layers_differ(s) else s.layers - 1  # an MTP index (plan.py)
    return M.layer_params(s, layer) + mtp_extra_params(s)


def mtp_extra_flops(m: ModelSpec) -> float:
    """Forward FLOPs per sequence of one module's norms and eh_proj, as Megatron counts them:
    2·s·(3h + 2h²)."""
    s = M.resolve(m)
    return 2.0 * s.seq_len * (3 * s.hidden + 2 * s.hidden * s.hidden)


def _concat_forward(L: LayerShape, learned_pos: bool) -> list[Step]:
    """Embedding of the shifted tokens, enorm, hnorm, the concatenation, eh_proj and its TP gather."""
    embed = [replace(st, name="mtp." + st.name) for st in Ly.embedding_forward(L, learned_pos)]
    steps: list[Step] = [*embed, Ly.elementwise("mtp.enorm", L.Te * L.h, 2.0, L, 8.0, FWD),
                         Ly.elementwise("mtp.hnorm", L.Te * L.h, 2.0, L, 8.0, FWD),
                         Ly.elementwise("mtp.concat", L.Te * 2 * L.h, 2.0, L, 0.0, FWD)]
    if L.t > 1 and L.sp:
        steps.append(Comm("mtp.eh_proj.ag", "tp", "all_gather", L.T * 2 * L.h * L.dtype, 0, FWD))
    steps.append(Ly.gemm("mtp.eh_proj", L.T, L.h // L.t, 2 * L.h, L, 1, FWD))
    if L.t > 1:  # gather_from_tensor_model_parallel_region: the h/t slices into T x h
        steps.append(Comm("mtp.eh_proj.gather", "tp", "all_gather", L.T * L.h * L.dtype, 0, FWD))
    return steps


def mtp_forward(L: LayerShape, layer_fwd: list[Step], learned_pos: bool) -> list[Step]:
    """One module's forward for one micro-batch: the concatenation and projection, the transformer
    layer's steps, the module's final norm."""
    return [*_concat_forward(L, learned_pos), *layer_fwd,
            Ly.elementwise("mtp.final_norm", L.Te * L.h, 2.0, L, 8.0, FWD)]


def mtp_backward(L: LayerShape, layer_bwd: list[Step]) -> list[Step]:
    """The backward: final norm, the layer (with its recompute), the sequence gather that undoes the
    scatter after eh_proj, eh_proj as a column-parallel linear, the two norms, the embedding's."""
    steps: list[Step] = [Ly.elementwise("mtp.final_norm_bwd", L.Te * L.h, 3.0, L, 10.0, BWD), *layer_bwd]
    if L.t > 1 and L.sp:
        steps.append(Comm("mtp.eh_proj.ag_grad", "tp", "all_gather", L.T * L.h * L.dtype, 0, BWD))
    steps += [replace(st, name="mtp." + st.name) if isinstance(st, Comm) else st
              for st in Ly.column_backward(L, "mtp.eh_proj", L.T, L.h // L.t, 2 * L.h, 2 * L.h)]
    steps += [Ly.elementwise("mtp.enorm_bwd", L.Te * L.h, 3.0, L, 10.0, BWD),
              Ly.elementwise("mtp.hnorm_bwd", L.Te * L.h, 3.0, L, 10.0, BWD)]
    steps += [replace(st, name="mtp." + st.name) for st in Ly.embedding_backward(L)]
    return steps


def mtp_head_forward(L: LayerShape, vocab: int, mtp: int) -> list[Step]:
    """The output head's extra passes on the loss stage: per module, [SP all-gather] · logits GEMM ·
    cross-entropy (the head's own kernels, layer.head_forward, without the final norm)."""
    v_l = vocab // L.t
    one: list[Step] = [*([Comm("lm_head.mtp.ag", "tp", "all_gather", L.T * L.h * L.dtype, 0, FWD)]
                         if L.t > 1 and L.sp else []),
                       Ly.gemm("lm_head.mtp", L.T, v_l, L.h, L, 1, FWD),
                       Kernel("loss.mtp", "elementwise", 5.0 * L.T * v_l, 18.0 * L.T * v_l, FWD)]
    return Ly.head_casts(one, L) * mtp


def mtp_head_backward(L: LayerShape, vocab: int, mtp: int) -> list[Step]:
    """Per module: the cross-entropy gradient and the logits GEMM backward (column-parallel)."""
    v_l = vocab // L.t
    one: list[Step] = [Kernel("loss.mtp_bwd", "elementwise", 2.0 * L.T * v_l, 10.0 * L.T * v_l, BWD),
                       *Ly.column_backward(L, "lm_head.mtp", L.T, v_l, L.h)]
    return Ly.head_casts(one, L, backward=True) * mtp
