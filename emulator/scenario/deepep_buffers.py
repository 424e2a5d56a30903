"""DeepEP's communication buffers: the configurations its normal (high-throughput) kernels take per EP size, and
the GPU memory its ``Buffer`` holds for them.

Megatron-Core's flex dispatcher with DeepEP (megatron/core/transformer/moe/fused_a2a.py @ d98e8a64dd,
``get_buffer``) sizes one ``Buffer`` for its EP group (tp_ep_group: ep ranks with etp 1) as the larger of what
DeepEP's recommended dispatch and combine configurations hint, for rows of ``get_hidden_bytes`` = h ·
max(element size, 2) bytes. DeepEP (deepseek-ai/DeepEP @ dd758ca):

- ``deep_ep/buffers/legacy.py`` ``Buffer.get_dispatch_config`` and ``get_combine_config``: per EP size, Config(num_sms,
  nvl chunked send, nvl chunked recv, rdma chunked send, rdma chunked recv) tokens; other sizes are refused
  ("Unsupported number of EP ranks"); ``Buffer.set_num_sms`` asserts an even SM count;
- ``csrc/legacy/config.hpp`` ``Config``: the rdma receive tokens rounded up to a multiple of the rdma send tokens;
  ``get_nvl_buffer_size_hint`` and ``get_rdma_buffer_size_hint`` (below), each rounded up to 128 bytes; no
  RDMA buffer within one NVLink group of 8 (``LEGACY_NUM_MAX_NVL_PEERS``);
- ``csrc/kernels/legacy/compiled.cuh``: a 32 MiB workspace (``LEGACY_NUM_WORKSPACE_BYTES``);
  ``deep_ep/include/deep_ep/common/compiled.cuh``: 8-byte top-k indices (``EP_NUM_TOPK_IDX_BITS`` 64);
  ``csrc/kernels/legacy/internode.cu``: an 8-byte ``SourceMeta`` per token.
"""
from __future__ import annotations

# EP size -> ((nvl recv, rdma send, rdma recv) of the dispatch config, the same of the combine config), tokens
CONFIGS: dict[int, tuple[tuple[int, int, int], tuple[int, int, int]]] = {
    2: ((256, 6, 128), (256, 6, 128)),
    4: ((256, 6, 128), (256, 6, 128)),
    8: ((256, 6, 128), (256, 6, 128)),
    16: ((288, 20, 128), (288, 12, 128)),
    24: ((288, 8, 128), (288, 8, 128)),
    32: ((288, 8, 128), (288, 8, 128)),
    48: ((288, 8, 128), (288, 8, 128)),
    64: ((288, 8, 128), (288, 8, 128)),
    96: ((480, 12, 128), (480, 8, 128)),
    128: ((560, 12, 128), (560, 8, 128)),
    144: ((720, 12, 128), (720, 8, 128)),
    160: ((720, 12, 128), (720, 8, 128)),
}
NVL_PEERS = 8  # LEGACY_NUM_MAX_NVL_PEERS
MAX_TOPK = MAX_SCALES = 128  # kNumMaxTopK, kNumMaxScales
TOPK_IDX_BYTES = 8  # int64 top-k indices
SOURCE_META_BYTES = 8  # SourceMeta: src_rdma_rank, is_token_in_nvl_rank_bits
INT_BYTES, FLOAT_BYTES, INT4_BYTES = 4, 4, 16
WORKSPACE_BYTES = 32 * 1024 * 1024


def _align(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def nvl_bytes(hidden_bytes: int, ranks: int, num_sms: int, nvl_recv: int) -> int:
    """``Config::get_nvl_buffer_size_hint``: per channel (num_sms / 2) and NVLink peer, counters and
    ``nvl_recv`` tokens of data, source metadata, top-k indices and weights, and scales."""
    rdma_ranks, nvl_ranks, channels = max(ranks // NVL_PEERS, 1), min(ranks, NVL_PEERS), num_sms // 2
    per = channels * nvl_ranks
    n = per * (2 * rdma_ranks + 3) * INT_BYTES
    n += per * nvl_recv * (hidden_bytes + SOURCE_META_BYTES + MAX_TOPK * (TOPK_IDX_BYTES + FLOAT_BYTES)
                           + MAX_SCALES * FLOAT_BYTES)
    return _align(n, 128)


def rdma_bytes(hidden_bytes: int, ranks: int, num_sms: int, rdma_send: int, rdma_recv: int) -> int:
    """``Config::get_rdma_buffer_size_hint``: nothing within one NVLink group; else per channel and RDMA peer,
    counters and twice (send and receive halves) the rdma receive tokens' data, metadata, indices, weights,
    scales and one int4."""
    if ranks <= NVL_PEERS:
        return 0
    rdma_ranks, channels = ranks // NVL_PEERS, num_sms // 2
    recv = _align(rdma_recv, rdma_send)
    per = channels * rdma_ranks
    n = per * (NVL_PEERS * 2 + 2) * 2 * INT_BYTES
    n += per * recv * 2 * (hidden_bytes + SOURCE_META_BYTES + MAX_TOPK * (TOPK_IDX_BYTES + FLOAT_BYTES)
                           + MAX_SCALES * FLOAT_BYTES + INT4_BYTES)
    return _align(n, 128)


def buffer_bytes(hidden_bytes: int, ranks: int, num_sms: int) -> int:
    """GPU bytes of the ``Buffer`` Megatron-Core's ``get_buffer`` makes: the larger NVL and RDMA hints of the
    dispatch and combine configurations, and the workspace. ``ranks`` must be a key of CONFIGS."""
    nvl = max(nvl_bytes(hidden_bytes, ranks, num_sms, c[0]) for c in CONFIGS[ranks])
    rdma = max(rdma_bytes(hidden_bytes, ranks, num_sms, c[1], c[2]) for c in CONFIGS[ranks])
    return nvl + rdma + WORKSPACE_BYTES
