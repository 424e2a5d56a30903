"""The host: what it costs the CPU to issue a layer's work, and which parts CUDA graphs take off it.

Megatron-Core runs eagerly: one Python thread per GPU issues every kernel and collective, each for a
fixed host cost (``cluster.node.host_launch``: Python, the ATen dispatcher and the launch). While
the GPU's kernels are longer than that, the host runs ahead and costs nothing; a small layer, or a
MoE layer's many small router and permutation kernels, leaves the GPU waiting for it. A host sync
(the MoE dispatcher's token counts, token_dispatch.py) stops the host until the GPU reaches it, so
the host's lead is lost there.

CUDA graphs (``training.cuda_graph_impl``, Megatron-Core transformer_config.py @ d98e8a64dd) replay a
captured part of each layer for one launch: ``local`` and ``transformer_engine`` capture the
``cuda_graph_modules`` of every layer (forward and backward), ``full_iteration`` the whole forward
and backward. Which module a step belongs to follows Megatron-Core's ``TransformerLayer``
(_get_submodules_under_cudagraphs): ``attn`` the input norm and the attention with its residual
add; ``mlp`` a dense layer's pre-MLP norm and MLP; ``moe`` a MoE layer's; ``moe_router`` its pre-MLP
norm, router (with the aux loss) and the shared experts; ``moe_preprocess`` the dispatcher's
preprocess (the token counts and the permutation) up to its host sync; ``mamba`` a hybrid model's Mamba
layer (megatron/core/ssm/mamba_layer.py: its norm, mixer and residual add).

ASSUMPTIONS, stated where they are used: one host launch per modelled kernel or collective; a graph
replay costs one launch (no measurement of either on a named GPU here: ../shared/calibration/h100/
sources.md lists CUDA-graph measurements as missing); the GPU's own per-kernel launch_overhead is
kept under graphs.

Pure functions; the emitter (emitter.py) turns their seconds into ops on the ``cpu`` stream.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from emulator.workload import layer as Ly

__all__ = ["Issue", "captured_modules", "module_of", "issue_time"]

# A step's name (its stem, without the backward suffixes) → its module. Attention first: its names
# (layer.py) are the input norm, the projections of MHA/GQA and MLA, the core and its output.
_ATTN_STEMS = ("ln1", "qkv", "q", "q_down", "q_up", "q_norm", "kv_down", "kv_up", "kv_norm", "rope", "attn",
               "ctx_copy", "proj", "bda1", "q_absorb", "v_up", "kv", "attn_gate",  # DSA's absorbed MLA; the gate
               "q_a", "q_a_norm", "q_b", "q_b_norm", "kv_proj", "compress", "o_a")  # DeepSeek-V4's attention
_ROUTER_PREFIXES = ("moe.router", "moe.aux")  # with the pre-MLP norm (ln2), and the shared experts (below)
# the latent MoE's fc1_latent_proj runs in MoELayer.preprocess, which moe_preprocess captures (moe_layer.py)
_PREPROCESS_PREFIXES = ("moe.counts", "moe.permute", "moe.token_counts", "moe.latent_down")
_SUFFIXES = ("_residual_grad", "_bwd")


def _stem(name: str) -> str:
    """The first dotted token of a step's name, its backward suffixes off: "proj.dgrad" → "proj"."""
    head = name.split(".", 1)[0]
    for suffix in _SUFFIXES:
        if head.endswith(suffix):
            head = head[: -len(suffix)]
    return head


def module_of(name: str, moe_layer: bool, shared_overlap: bool = False) -> str | None:
    """The CUDA-graph module of a layer's step (``CUDA_GRAPH_MODULES``), or None outside a transformer
    layer (embedding, head, loss, MTP): "qkv.dgrad" → attn; "moe.router.topk" → moe_router. The shared
    experts go with the router unless they overlap the dispatch (``shared_overlap``:
    moe_shared_expert_overlap), where they run beside the all-to-all, outside the router's graph."""
    stem = _stem(name)
    if stem in _ATTN_STEMS:
        return "attn"
    if stem == "hc":  # mHC's kernels (hyper_connection.py): with their block, the MLP's with its pre-norm
        return "attn" if name.split(".")[1] == "attn" else module_of("ln2", moe_layer, shared_overlap)
    if stem == "mamba":  # a hybrid model's Mamba layer (layer.py's mamba.* steps)
        return "mamba"
    if not moe_layer:
        return "mlp" if stem in ("ln2", "mlp", "gelu", "swiglu", "squared_relu", "bda2") else None
    if stem == "ln2" or name.startswith(_ROUTER_PREFIXES) or (stem.startswith("shared") and not shared_overlap):
        return "moe_router"
    if name.startswith(_PREPROCESS_PREFIXES):
        return "moe_preprocess"
    return "moe" if stem in ("moe", "swiglu", "bda2", "gelu", "squared_relu") or stem.startswith("shared") else None


def captured_modules(impl: str, modules: Sequence[str]) -> frozenset[str]:
    """The modules per-layer graphs capture (local, transformer_engine): all of a layer's for an empty
    list; ``local`` takes moe_router and moe_preprocess together (Megatron-Core adds the other), and
    moe holds both. None for none and full_iteration (one graph of everything: no host op at all)."""
    if impl in ("none", "full_iteration"):
        return frozenset()
    if not modules:
        return frozenset(("attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba"))
    out = set(modules)
    if impl == "local" and out & {"moe_router", "moe_preprocess"}:
        out |= {"moe_router", "moe_preprocess"}
    if "moe" in out:  # the whole MoE MLP: its router and preprocess with it
        out |= {"moe_router", "moe_preprocess"}
    return frozenset(out)


@dataclass(frozen=True)
class Issue:
    """Host seconds to issue a step list: before its host sync, and after it (0 when it has none)."""

    before: float
    after: float
    synced: bool

    @property
    def total(self) -> float:
        return self.before + self.after


def issue_time(steps: Sequence[Ly.Step], launch: float, captured: frozenset[str], moe_layer: bool,
               shared_overlap: bool = False) -> Issue:
    """Seconds the host takes to issue ``steps`` of a layer (``moe_layer``: an MoE one; ``shared_overlap``:
    its shared experts overlap the dispatch, ``module_of``): ``launch`` a kernel
    or collective, and one launch for each run of steps a graph captured (``captured``,
    ``captured_modules``; ASSUMPTION: a replay costs one launch). The MoE host sync (a kernel of kind host)
    splits the list: what follows it is issued only once the GPU has reached it."""
    if launch <= 0:
        return Issue(0.0, 0.0, False)
    before = after = 0.0
    synced = in_graph = False
    for st in steps:
        if isinstance(st, Ly.Kernel) and st.kind == "host":
            synced, in_graph = True, False
            continue
        module = module_of(st.name, moe_layer, shared_overlap)
        captured_step = module is not None and module in captured
        # a run of captured steps is one graph (Megatron-Core captures a layer's modules as one callable)
        cost = 0.0 if captured_step and in_graph else launch
        in_graph = captured_step
        if synced:
            after += cost
        else:
            before += cost
    return Issue(before, after, synced)
