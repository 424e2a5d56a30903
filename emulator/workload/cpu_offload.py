"""Megatron-Core's layer-wise CPU offloading (``training.cpu_offloading``, ``cpu_offloading_num_layers``): which layers
send their saved activations to host memory, how many bytes, and when each copy must be done and its reload begin.

Megatron-Core's TransformerBlock (megatron/core/transformer/transformer_block.py @ d98e8a64dd) runs each layer under
Transformer Engine's ``get_cpu_offload_context(cpu_offloading, cpu_offloading_num_layers, num_layers, ...)`` and
calls its sync function after each layer. TE's default synchronizer (transformer_engine/pytorch/cpu_offload.py,
``DefaultOffloadSynchronizer._init_offload_synchronization_dicts``), for L layers of which K are offloaded:

- layers 0 … K − 1 are offloaded: every tensor a layer saves for its backward, copied to pinned host memory on an
  offload stream once the next layer's forward begins (``fwd_step``: ``start_offload`` of the layer before);
- layer i's copy must be done before layer L − K + i's forward: the compute stream waits for it there
  (``release_activation_forward_gpu_memory``, "For layer i offload needs to finish before num_layers -
  num_offloaded_layers + i"), so that the forward's activations peak at (L − K) layers' worth;
- layer i's reload starts as the backward of layer L − 1 − K + i begins (``bwd_step``, ``start_reload_map``), and
  layer i's backward waits for it.

The copies run at the node's ``host_bandwidth`` on the copy engines (workload/builder.py's ``d2h`` and ``h2d``
streams). Megatron-Core refuses it with pipeline parallelism, recomputation, per-layer CUDA graphs, fine-grained
offloading and the MoE paged stash (scenario/rules.py).
"""
from __future__ import annotations

from emulator.scenario.spec import QUANTISED, ModelSpec, Scenario
from emulator.workload import models as M
from emulator.workload.activations import SAVED_INPUT_BYTES, layer_activation_bytes
from emulator.workload.layer import recipe_of


def offloaded_layers(sc: Scenario) -> int:
    """K: the layers whose activations go to the host (0 without cpu_offloading)."""
    tr = sc.training
    return tr.cpu_offloading_num_layers if tr.cpu_offloading else 0


def finish_before(layer: int, layers: int, offloaded: int) -> int:
    """The layer before whose forward offloaded layer ``layer``'s copy must be done: L − K + i."""
    return layers - offloaded + layer


def reload_at(layer: int, layers: int, offloaded: int) -> int:
    """The layer as whose backward begins offloaded layer ``layer``'s reload starts: L − 1 − K + i."""
    return layers - 1 - offloaded + layer


def layer_bytes(sc: Scenario, m: ModelSpec) -> tuple[float, float]:
    """What one layer saves for its backward per micro-batch, all of which an offloaded layer sends: (an MoE layer
    where the model has experts, else a dense one; a dense leading layer)."""
    par, tr = sc.parallel, sc.training
    dtype = 4 if tr.precision in ("fp32", "tf32") else 2
    flash = tr.attention in ("flash", "fa2") or par.cp > 1
    sp = par.sequence_parallel and par.tp > 1
    saved = SAVED_INPUT_BYTES.get(recipe_of(tr.precision, tr.fp8_recipe), 1.0)
    moe, dense = (layer_activation_bytes(m, tr.micro_batch, m.seq_len // par.cp, par.tp, sp, tr.recompute, flash,
                                         dtype, par.ep, kind, tr.precision in QUANTISED, tr.recompute_modules, saved,
                                         par.etp or par.tp, tr.fp8_dot_product_attention)
                  for kind in (None, False))
    return moe, dense


def bytes_of(sc: Scenario, m: ModelSpec, layer: int) -> float:
    """What decoder layer ``layer`` sends to the host per micro-batch: all it saves if it is among the first K, else
    nothing."""
    if not 0 <= layer < offloaded_layers(sc):
        return 0.0
    moe, dense = layer_bytes(sc, m)
    return moe if M.is_moe_layer(m, layer) else dense


def pass_with_copies(fwd: float, bwd: float, copy: float, layers: int, offloaded: int) -> float:
    """One micro-batch's forward and backward over ``layers`` layers of ``fwd`` and ``bwd`` seconds each, with
    ``offloaded`` of them copied out and back in ``copy`` seconds each way, one copy at a time on each stream, and
    TE's waits (:func:`finish_before`, :func:`reload_at`): the closed form's (studies/rank.py) view of the builder's
    ops, for layers alike."""
    t, out_free = 0.0, 0.0
    done: list[float] = []
    for j in range(layers):
        first = j - (layers - offloaded)
        if first >= 0:
            t = max(t, done[first])  # layer L − K + i waits for layer i's copy
        t += fwd
        if j < offloaded:
            out_free = max(t, out_free) + copy
            done.append(out_free)
    back_free = 0.0
    back: dict[int, float] = {}
    for j in reversed(range(layers)):
        i = j - (layers - 1 - offloaded)
        if 0 <= i < offloaded:  # layer i's reload starts as layer j's backward begins
            back_free = max(t, back_free, done[i]) + copy
            back[i] = back_free
        if j < offloaded:
            t = max(t, back[j])
        t += bwd
    return t
