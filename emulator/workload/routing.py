"""How MoE routing spreads tokens: the busiest expert-parallel rank's load, capacity, and who gets each token.

Pure functions of a ModelSpec (no SimPy). Megatron-Core's router (megatron/core/transformer/moe/router.py,
moe_utils.py @ d98e8a64dd) decides three things the cost depends on:

- **Force load balancing** (``moe_router_force_load_balancing``, router.py ``apply_random_logits``: the logits
  are replaced by random normals). Each token then takes top_k distinct experts uniformly at random, so the
  copies that land on one EP rank (local = E/ep experts) over one step are a sum of N independent draws,
  N the tokens routed over the EP group; this module takes that count as Binomial(N·top_k, local/E) (each of
  the N·top_k copies lands there with probability local/E; the draws of one token are not independent, which
  a binomial slightly overstates). The busiest of the ep ranks is the expected maximum of ep such
  counts, taken as independent: E[max] = Σ_{x ≥ 0} (1 − F(x)^ep), F the binomial CDF
  (:func:`binomial_max_mean`). It exceeds the mean by a margin that shrinks as N·top_k/ep grows.
- **Capacity** (``moe_expert_capacity_factor`` c, moe_utils.py ``get_capacity``: ceil(tokens·top_k/E·c) per
  expert, on each rank's own tokens). A dropping router caps every expert at c times the mean, so the
  busiest rank's load is min(load, c) (``moe_token_drop_policy`` only picks which tokens go); padding
  (``moe_pad_expert_input_to_capacity``) runs every expert at exactly its capacity: load c on every rank,
  and the all-to-all carries the padded copies (token_dispatcher.py, ``drop_and_pad``), c times the mean.
  So under a capacity factor, ``moe_imbalance`` is the routing's imbalance before the drop, not the cost's.
- **Group-limited routing** (``moe_router_num_groups`` G, ``moe_router_group_topk`` g; moe_utils.py
  ``group_limited_topk``, as DeepSeek-V3 routes): a token picks g of the G contiguous expert groups, then
  its top_k experts among those groups' experts: the dispatch's traffic (network/dispatch.py,
  ``use_probability``) counts the nodes and GPUs a token reaches from the placement.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from emulator.scenario.spec import ModelSpec

WINDOW_SD = 14.0  # the binomial beyond ±14 standard deviations of its mean: below 1e-40 of its mass


@functools.lru_cache(maxsize=1024)  # a scenario asks the same one for each layer and each report
def binomial_max_mean(n: int, p: float, count: int) -> float:
    """E[max of ``count`` independent Binomial(n, p)] = Σ_{x=0}^{n−1} (1 − F(x)^count), exact over the
    whole range for small n, else over the mean ± WINDOW_SD standard deviations (below it every term is 1
    to double precision, above it 0). The upper tail 1 − F is summed from the top, so small tails keep
    their digits: 1 − F^count = −expm1(count·log1p(−S)), S = 1 − F."""
    if n <= 0 or p <= 0.0:
        return 0.0
    if p >= 1.0 or count <= 1:
        return n * min(p, 1.0)
    mean, sd = n * p, math.sqrt(n * p * (1.0 - p))
    lo = 0 if n <= 20000 else max(0, int(mean - WINDOW_SD * sd))
    hi = n if n <= 20000 else min(n, int(mean + WINDOW_SD * sd) + 1)
    lp, lq = math.log(p), math.log1p(-p)
    lg = math.lgamma(n + 1)
    pmf = [math.exp(lg - math.lgamma(x + 1) - math.lgamma(n - x + 1) + x * lp + (n - x) * lq)
           for x in range(lo, hi + 1)]
    total = float(lo)  # x < lo: F(x) = 0 to double precision, each term 1
    tail = 0.0  # S(x) = P(X > x), built from the top
    terms = []
    for i in range(len(pmf) - 1, 0, -1):  # x = hi − 1 … lo
        tail += pmf[i]
        terms.append(-math.expm1(count * math.log1p(-min(tail, 1.0))) if tail < 1.0 else 1.0)
    return total + math.fsum(terms)


def force_balance_load(tokens: int, top_k: int, experts: int, ep: int) -> float:
    """The busiest EP rank's routed copies over the mean under random routing: E[max of ep
    Binomial(tokens·top_k, local/E)] / (tokens·top_k/ep), ``tokens`` the tokens routed over the EP group
    in one step; 1 without EP (every rank holds every expert)."""
    if ep <= 1 or tokens <= 0:
        return 1.0
    local = max(1, experts // ep)
    n = tokens * top_k
    p = local / experts
    return binomial_max_mean(n, p, ep) / (n * p)


@functools.lru_cache(maxsize=1 << 14)
def drawn_load(seed: int, step: int, layer: int, experts: int, copies: int,
               concentration: float | None) -> tuple[float, ...]:
    """Layer ``layer``'s routed copies per expert at step ``step`` of ``model.moe_load_seed`` ``seed``: the
    experts' shares from a symmetric Dirichlet of ``concentration`` (None: equal shares), then the
    ``copies`` (tokens × top_k of one micro-batch over the EP group) fall on them multinomially. Each
    (seed, step, layer) has its own stream (numpy's SeedSequence of the three), so a layer's draw does
    not depend on how many others are drawn. Equal shares give Megatron-Core's random router
    (``moe_router_force_load_balancing``) sampled once, where :func:`force_balance_load` takes the
    expectation of its maximum; one expert's share spreads by about 1/sqrt(concentration) of the mean
    (the Dirichlet's coefficient of variation, sqrt((E − 1)/(E·α + 1)))."""
    rng = np.random.default_rng([seed, step, layer])
    shares = rng.dirichlet(np.full(experts, concentration)) if concentration else np.full(experts, 1.0 / experts)
    if copies <= 0:  # no token count known (a memory estimate without one): the shares themselves
        return tuple(float(x) for x in shares)
    return tuple(float(x) for x in rng.multinomial(copies, shares))


def capped_load(load: float, spec: ModelSpec) -> float:
    """The busiest rank's load under a capacity factor c: c with padding, min(load, c) with drops, else load;
    then at most HybridEP's rank budget (:func:`rank_budget`)."""
    c = spec.moe_expert_capacity_factor
    if c is not None:
        load = c if spec.moe_pad_expert_input_to_capacity else min(load, c)
    f = spec.moe_expert_rank_capacity_factor
    return load if f is None else min(load, f)


def rank_budget(spec: ModelSpec) -> float | None:
    """HybridEP's static receive budget over the mean (``moe_expert_rank_capacity_factor`` f; None: dropless,
    sized per step). Megatron-Core's _HybridEPManager.setup_metadata (token_dispatcher.py @ d98e8a64dd) sets
    num_permuted_tokens = tokens·top_k·f, rounded up to the quantised alignment, on every rank: HybridEP drops
    the copies past it (so the busiest rank's load is at most f), and the permuted buffer, which the experts'
    GEMMs read and their backward keeps, has that many rows whatever the routing (the rounding is left out)."""
    return spec.moe_expert_rank_capacity_factor


def stashed_load(spec: ModelSpec, load: float) -> float:
    """The rows over the mean that one MoE layer in flight keeps for its backward, per micro-batch, with the
    busiest rank's actual ``load``: dropless, that load; under HybridEP's budget, the budget's static rows; with
    Megatron-Core's paged stash (moe/paged_stash.py @ d98e8a64dd, ``allocate_stash_buffers``), the GPU buffer's
    share: |moe_paged_stash_buffer_size_factor_cuda| of the mean (positive: ``avg_num_tokens`` = the budget / f)
    or of the actual load (negative). What overflows it goes to the host buffer (:func:`stash_spill`)."""
    f = rank_budget(spec)
    if f is None:
        return load
    if not spec.moe_paged_stash:
        return f
    cuda = spec.moe_paged_stash_buffer_size_factor_cuda
    return cuda if cuda >= 0 else -cuda * load


def stash_spill(spec: ModelSpec, load: float) -> tuple[float, float]:
    """(to the host, past both buffers) over the mean, of the busiest rank's ``load`` under the paged stash: what
    its pages take past the GPU buffer (:func:`stashed_load`) goes to the pinned host buffer, sized as the GPU
    one by moe_paged_stash_buffer_size_factor_cpu (0: none); what passes that too sets Megatron-Core's overflow
    flag, and the step is run again without the stash (paged_stash.py: "prepare_for_rerun clears the capacity
    factor ... and disables paged stashing"). The actual load's own stash (factor < 0) never overflows."""
    if not spec.moe_paged_stash or rank_budget(spec) is None:
        return 0.0, 0.0
    past = max(0.0, load - stashed_load(spec, load))
    c = spec.moe_paged_stash_buffer_size_factor_cpu
    host = c if c >= 0 else -c * load
    return min(past, host), max(0.0, past - host)


def padded(spec: ModelSpec) -> bool:
    """Every expert runs exactly its capacity (Megatron-Core's drop and pad)."""
    return spec.moe_expert_capacity_factor is not None and spec.moe_pad_expert_input_to_capacity
