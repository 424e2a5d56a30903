"""HybridEP's communication buffers: the GPU memory one ``HybridEPBuffer`` holds for an EP group.

Megatron-Core's flex dispatcher with the hybridep backend (megatron/core/transformer/moe/fused_a2a.py @ d98e8a64dd,
``init_hybrid_ep_buffer``) makes one buffer for its EP group at the first dispatch, for the tokens of that
dispatch's input (``max_num_of_tokens_per_rank``: one rank's rows, T), the hidden size h and the local experts,
with bf16 tokens (its ``fp8_dispatch`` is False: "HybridEP dispatcher does not support fp8 dispatch now"). DeepEP's
hybrid-ep branch (deepseek-ai/DeepEP @ 94a9f8f) splits the group into R ranks per NVLink domain
(``NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN``, else the ranks it detects) and N = ep / R domains
(deep_ep/hybrid_ep_buffer.py ``HybridEPBuffer.__init__``), and allocates, with its default ``use_shared_buffer``
(the dispatch's output shares the combine's input):

- within the domain (csrc/hybrid_ep/buffer/intranode.cu, ``NVLCoordinator``), for the worst case of every token
  of the group on one rank, M = T·R·N rows: the combine's input tokens, M·h bf16 (``expert_input_token``); its
  probabilities, M·(E_l·R) fp32 (``expert_input_prob``, E_l the local experts); the dispatch's scaling factors,
  M·h/128 fp32 (``expert_output_scaling_factor``, allocated whatever the token type);
- across domains, where N > 1 (csrc/hybrid_ep/buffer/internode_doca.cu, ``RDMACoordinator``): the dispatch's
  attention-side input, T·h tokens, T·(E_l·R·N) probabilities and T·h/128 scales; its inter-domain group,
  T·(N − 1) times h tokens, E_l·R probabilities and h/128 scales; the combine's reduction and inter-domain
  group, each T·(N − 1) times h bf16 tokens and E_l·R probabilities.

Flags, chunk counters and the preprocessing scratch (a few KB) are left out.
"""
from __future__ import annotations

TOKEN_BYTES = 2  # bf16 tokens (Megatron-Core passes use_fp8=False)
FLOAT_BYTES = 4
SCALE_BLOCK = 128  # one fp32 scaling factor per 128 elements of a row


def intranode_bytes(tokens: int, hidden: int, local_experts: int, per_domain: int, domains: int) -> int:
    """``NVLCoordinator``'s combine input (tokens, probabilities) and dispatch scales, for M = T·R·N rows."""
    rows = tokens * per_domain * domains
    return rows * (hidden * TOKEN_BYTES + local_experts * per_domain * FLOAT_BYTES
                   + hidden // SCALE_BLOCK * FLOAT_BYTES)


def internode_bytes(tokens: int, hidden: int, local_experts: int, per_domain: int, domains: int) -> int:
    """``RDMACoordinator``'s dispatch and combine buffers; 0 within one domain."""
    if domains <= 1:
        return 0
    probs = local_experts * per_domain * FLOAT_BYTES  # one domain's experts, fp32, per row
    scales = hidden // SCALE_BLOCK * FLOAT_BYTES
    row = hidden * TOKEN_BYTES
    attn = tokens * (row + local_experts * per_domain * domains * FLOAT_BYTES + scales)
    dispatch_group = tokens * (domains - 1) * (row + probs + scales)
    combine = 2 * tokens * (domains - 1) * (row + probs)  # the reduction's and the inter-domain group's
    return attn + dispatch_group + combine


def buffer_bytes(tokens: int, hidden: int, local_experts: int, per_domain: int, ep: int) -> int:
    """One GPU's ``HybridEPBuffer`` for an EP group of ``ep`` ranks, ``per_domain`` of them in each NVLink
    domain, ``tokens`` rows a rank."""
    domains = max(1, ep // max(1, per_domain))
    return intranode_bytes(tokens, hidden, local_experts, per_domain, domains) \
        + internode_bytes(tokens, hidden, local_experts, per_domain, domains)
