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

from emulator.scenario.spec import ModelSpec, Scenario
from emulator.workload import models as M
from emulator.workload.activations import scenario_layer_bytes


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
    return scenario_layer_bytes(sc, m), scenario_layer_bytes(sc, m, False)


def offloaded_bytes(sc: Scenario, m: ModelSpec) -> float:
    """What the K offloaded layers send to the host per micro-batch, each all it saves."""
    moe, dense = layer_bytes(sc, m)
    return sum(moe if M.is_moe_layer(m, i) else dense for i in range(offloaded_layers(sc)))


def pass_with_copies(fwd: float, bwd: float, copy: float, layers: int, offloaded: int) -> float:
    """One micro-batch's forward and backward over ``layers`` layers of ``fwd`` and ``bwd`` seconds each, with
    ``offloaded`` of them copied out and back in ``copy`` seconds each way, one copy at a time on each stream, and
    TE's waits (:func:`finish_before`, :func:`reload_at`): the closed form's (studies/rank.py) view of the builder's
    ops, for layers alike."""
    t, out_free = 0.0, 0.0
    done: list[float] = []
    for j in range(layers):
        first = j - finish_before(0, layers, offloaded)  # the offloaded layer whose copy layer j waits for
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
