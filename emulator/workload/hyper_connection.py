"""Manifold-constrained hyper-connections (mHC; ``model.enable_mhc_connections``): the kernels around each block.

Megatron-Core @ d98e8a64dd (megatron/core/transformer/hyper_connection.py, HyperConnectionModule; the mHC paper's
x_{l+1} = H_res·x_l + H_postᵀ·F(H_pre·x_l)) widens the residual stream to n = mhc_num_residual_streams copies of
h, [s, b, n·h]. Around each attention and MLP block, per token of Te (sequence parallelism shards the streams):

- ``hc.proj``: the RMS of the n·h streams and mapping_proj n·h → n² + 2n (a GEMM of 24 columns at n = 4, read-
  bound), two reads of the streams (torch.compile's ``_projection_and_get_norm``: cuBLAS and a reduction);
- ``hc.sinkhorn``: H_pre, H_post and the Sinkhorn-Knopp projection of H_res, mhc_sinkhorn_iterations row and
  column normalisations of an n × n fp32 matrix a token (SinkhornKnopp, one kernel);
- ``hc.aggregate``: H_pre·x, the block's input (read n·h, write h);
- ``hc.post``: in place of the block's bias-dropout-add, H_res·x + H_postᵀ·y (``fused_h_res_h_post_bda``, which
  today runs apply_h_res's bmm, _apply_h_post and the add one after another: 6 + 1/n passes of n·h).

With ``use_fused_mhc`` (Megatron-Bridge's DeepSeek-V4 Blackwell recipes; Megatron-Core's dev branch) one kernel
reads the streams once for the projection, the norm, the Sinkhorn step and the aggregate (1 + 1/n passes), and one
reads the streams and y and writes the new streams (2 + 1/n). Their backward, per block: the post's (dy, the
streams and y read, d_streams and dy written: 5 + 2/n passes, 3 + 2/n fused), the aggregate's (2 + 1/n), the
projection's (its dgrad, the norm's backward and its wgrad read or write the streams: 3) and the sum of the three
stream gradients (two adds, 6; fused: one pass). The pass counts are an ASSUMPTION from the operations'
tensors; no mHC kernel is in ../shared/calibration.

The block entry copies h to n streams (``input_expand``), the last stage averages them (``output_contract``), and
a pipeline stage sends n·h a token (workload/builder.py). Recompute ``mhc`` (CheckpointWithoutOutput) drops the
aggregates and the posts' outputs and reruns them in the backward (workload/recompute.py); its memory is
workload/activations.py's. Left out: DeepSeek-V4's HyperHead (n² · h + n + 1 weights in its dev-branch decoder),
whose place Megatron-Core's output_contract takes.
"""
from __future__ import annotations

from emulator.workload.steps import BWD, LayerShape, Step, elementwise


def mapping_width(n: int) -> int:
    """The projection's outputs a token: n (H_pre) + n (H_post) + n² (H_res)."""
    return n * n + 2 * n


def pre(L: LayerShape, block: str, cat: str) -> list[Step]:
    """Before block ``block`` (attn | mlp): the mappings from the streams and the aggregate that the block takes."""
    n, wide = L.hc, L.Te * L.hc * L.h
    flops = 2.0 * mapping_width(n) + 2.0
    if L.hc_fused:
        return [elementwise(f"hc.{block}.pre", wide, 1.0 + 1.0 / n, L, flops + 2.0, cat)]
    return [elementwise(f"hc.{block}.proj", wide, 2.0, L, flops, cat),
            elementwise(f"hc.{block}.sinkhorn", L.Te * n * n, 4.0, L, 4.0 * L.hc_iters, cat),
            elementwise(f"hc.{block}.aggregate", wide, 1.0 + 1.0 / n, L, 2.0, cat)]


def post(L: LayerShape, block: str, cat: str) -> list[Step]:
    """After block ``block``: H_res times the streams plus H_postᵀ times its output, the new streams."""
    n = L.hc
    passes = (2.0 if L.hc_fused else 6.0) + 1.0 / n
    return [elementwise(f"hc.{block}.post", L.Te * n * L.h, passes, L, 2.0 * n + 2.0, cat)]


def post_backward(L: LayerShape, block: str) -> list[Step]:
    """The post's backward: the streams' and the block output's gradients, and H_res's and H_post's."""
    n = L.hc
    passes = (3.0 if L.hc_fused else 5.0) + 2.0 / n
    return [elementwise(f"hc.{block}.post_bwd", L.Te * n * L.h, passes, L, 4.0 * n, BWD)]


def pre_backward(L: LayerShape, block: str) -> list[Step]:
    """The aggregate's, the Sinkhorn step's and the projection's backward, and the sum of the streams'
    gradients."""
    n, wide = L.hc, L.Te * L.hc * L.h
    if L.hc_fused:
        return [elementwise(f"hc.{block}.pre_bwd", wide, 4.0 + 1.0 / n, L, 4.0 * mapping_width(n), BWD)]
    return [elementwise(f"hc.{block}.aggregate_bwd", wide, 2.0 + 1.0 / n, L, 2.0, BWD),
            elementwise(f"hc.{block}.sinkhorn_bwd", L.Te * n * n, 6.0, L, 8.0 * L.hc_iters, BWD),
            elementwise(f"hc.{block}.proj_bwd", wide, 3.0, L, 4.0 * mapping_width(n), BWD),
            elementwise(f"hc.{block}.grad_sum", wide, 6.0, L, 2.0, BWD)]


def expand(L: LayerShape) -> list[Step]:
    """The decoder's entry: h copied to n streams (read h, write n·h); its backward sums them."""
    return [elementwise("hc.expand", L.Te * L.hc * L.h, 1.0 + 1.0 / L.hc, L, 0.0)] if L.hc else []


def expand_backward(L: LayerShape) -> list[Step]:
    return [elementwise("hc.expand_bwd", L.Te * L.hc * L.h, 1.0 + 1.0 / L.hc, L, 1.0, BWD)] if L.hc else []


def contract(L: LayerShape) -> list[Step]:
    """The decoder's exit: the mean of the n streams (read n·h, write h); its backward spreads the gradient."""
    return [elementwise("hc.contract", L.Te * L.hc * L.h, 1.0 + 1.0 / L.hc, L, 1.0)] if L.hc else []


def contract_backward(L: LayerShape) -> list[Step]:
    return [elementwise("hc.contract_bwd", L.Te * L.hc * L.h, 1.0 + 1.0 / L.hc, L, 1.0, BWD)] if L.hc else []
