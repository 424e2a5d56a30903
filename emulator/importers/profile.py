"""A one-GPU profile of a user's own training script, split into the parts of its model.

Reads one PyTorch profiler (Kineto) trace, taken with ``record_shapes=True``, and returns a
frozen :class:`Profile`: the kernels of one step with their measured times, in launch order,
split into the embedding, the repeated block (forward and backward, found by repetition: the
``layers`` repeats of one kernel sequence), the head and loss, and the optimizer step. Every
kernel keeps its class (GEMM, attention, element-wise, optimizer, memory), its dtype, and its
shapes with every dimension named by a model symbol (``emulator.devices.reshape``):

- a GEMM's (batch, M, N, K) from its innermost aten op (``mm``, ``addmm``, ``bmm``, ``linear``);
  the token dimension (b·s) is told from the weight dimensions by the model's parameter shapes
  (a weight gradient ``Xᵀ·dY`` contracts over the tokens, a forward or input gradient has them
  as rows);
- an attention kernel's (batch, heads, kv heads, sequence, head dim) from its SDPA op;
- an element-wise kernel's tensors from its innermost aten op ([b, s, ...] activations,
  [T, ...] flattened ones, parameter-shaped tensors).

The user states what the trace cannot tell (``workload.profiled``); what the trace contradicts
(the embedding table, the attention shapes) is an error naming both. Pure parsing: no Program.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field, replace

from emulator.devices.kernels import DTYPE_BYTES
from emulator.devices.reshape import WIDTHS, Dim, Dims, Shape
from emulator.importers.kineto_reader import GpuOp, HostCall, RankTrace, read_rank
from emulator.importers.native import TraceError
from emulator.scenario.spec import ProfiledSpec

# s of host time the PyTorch profiler adds to each op it records (record_shapes=True, CPU activity, no
# with_stack): benchmarks/profiler_overhead.py, 1.43 us (rounded here), the median of 21 interleaved rounds
# of the thread's CPU time on this project's shared 2-core x86 machine (torch 2.13), the ops counted as the
# importer counts them (every ``cpu_op`` event); conditions, spread and load average in
# benchmarks/results/profiler_overhead.json. The host that ran a profile is another CPU: the figure stands
# for it (benchmarks/gpu_profile_check.py --cross measures it on a GPU's own host).
PROFILER_OP_S = 1.4e-6
# s of host time CUPTI adds to each CUDA launch it records (the profiler's CUDA activity): not measured
# (it needs a GPU; benchmarks/gpu_profile_check.py --cross times it), and no public figure was found in
# Kineto's source (libkineto/src/CuptiActivityApi.cpp records CUPTI's own overhead activities, buffer
# flushes and instrumentation, not a per-launch cost). 0: nothing is taken out, so a host-bound prediction
# stays an upper bound by that cost.
PROFILER_LAUNCH_S = 0.0
GEMM, ATTENTION, ELEMENTWISE, OPTIMIZER, MEMORY = "gemm", "attention", "elementwise", "optimizer", "memory"
FWD, BWD, OPT = "fwd", "bwd", "optimizer"
_GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm", "aten::linear",
             "aten::matmul")
_ATTENTION_KERNEL = ("sdpa", "flash", "fmha", "attention")
_DTYPES = {"c10::bfloat16": "bf16", "c10::half": "fp16", "float": "fp32", "double": "fp64",
           "c10::float8_e4m3fn": "fp8", "c10::float8_e5m2": "fp8"}


@dataclass(frozen=True)
class ProfiledKernel:
    """One kernel of the profiled step: what it is, its shapes by symbol, what it took."""

    name: str
    cls: str  # gemm | attention | elementwise | optimizer | memory
    seconds: float  # measured (a block's kernel: the mean over the layers)
    phase: str  # fwd | bwd | optimizer
    op: str = ""  # the innermost aten op
    dtype: str = ""  # of the op's first tensor operand: bf16 | fp16 | fp32 | fp8
    tensors: tuple[Dims, ...] = ()  # the op's tensors (element-wise kernels scale with their elements)
    gemm: tuple[Dim, Dim, Dim, Dim] | None = None  # (batch, M, N, K)
    attention: tuple[Dim, Dim, Dim, Dim, Dim] | None = None  # (b, heads, kv heads, seq, head dim)
    launch_gap: float = 0.0  # s of host time since the previous launch (syncs left out)
    sync: bool = False  # the host waits for this kernel (a device-to-host copy)
    dispatch: float = 0.0  # s the GPU idled before it though it was already queued (inter-kernel latency)
    compiled: bool = False  # a torch.compile (Inductor) kernel: its record's tensors stand for its op's
    kernel_flop: float = 0.0  # FLOPs its Inductor record declares (kernel_flop); 0: none declared
    kernel_bytes: float = 0.0  # bytes its Inductor record declares (kernel_num_gb x 1e9); 0: none declared

    @property
    def unscaled(self) -> bool:
        """A kernel under no aten op and no Inductor record (a custom CUDA extension's): no shapes, so at
        another size it scales by the tokens (devices/reshape.py ``tokens_time``)."""
        return self.cls == MEMORY and not self.name.startswith(("Memset", "Memcpy"))


@dataclass(frozen=True)
class Profile:
    """One profiled step, split into its parts."""

    path: str
    shape: Shape  # what it ran (workload.profiled)
    step_s: float  # the profiled step as the host timed it (ProfilerStep)
    embed_fwd: tuple[ProfiledKernel, ...]
    block_fwd: tuple[ProfiledKernel, ...]
    head_fwd: tuple[ProfiledKernel, ...]
    head_bwd: tuple[ProfiledKernel, ...]
    block_bwd: tuple[ProfiledKernel, ...]
    embed_bwd: tuple[ProfiledKernel, ...]
    optimizer: tuple[ProfiledKernel, ...]
    embed_params: tuple[Dims, ...]
    block_params: tuple[Dims, ...]
    head_params: tuple[Dims, ...]
    tied: bool  # the head reuses the embedding table
    param_bytes: int  # bytes of one parameter element (4: fp32 weights, autocast)
    dtype: str  # of the GEMMs (bf16 under autocast)
    causal: bool | None = None  # the SDPA op's is_causal (None: not recorded)
    device: str = ""  # the CUDA name of the GPU it ran on (deviceProperties); "": not recorded

    @property
    def kernel_seconds(self) -> float:
        """The GPU time of one profiled step: every part, the block ``layers`` times."""
        L = self.shape.layers
        parts = (self.embed_fwd, self.head_fwd, self.head_bwd, self.embed_bwd, self.optimizer)
        return sum(k.seconds for p in parts for k in p) + L * sum(k.seconds for k in self.block_fwd + self.block_bwd)


def shape_of(p: ProfiledSpec) -> Shape:
    """The profiled sizes, defaults filled (kv heads as heads, the MLP 4 x hidden)."""
    return Shape(b=p.micro_batch, s=p.seq_len, layers=p.layers, h=p.hidden, heads=p.heads,
                 kvh=p.kv_heads or p.heads, ffn=p.ffn_hidden or 4 * p.hidden, V=p.vocab)


# ---------------------------------------------------------------------------- reading


def read_profile(path: str, profiled: ProfiledSpec) -> Profile:
    """Read ``path`` (the last complete ProfilerStep) into a :class:`Profile`."""
    rt = read_rank(path)
    if any(g.is_nccl for g in rt.gpu_ops):
        raise TraceError(f"{path}: the profile has NCCL kernels; a profile is one GPU of a script without "
                         "communication (replay a multi-GPU trace with workload.trace instead)")
    _check_recorded(rt, path)
    P = shape_of(profiled)
    _check_shapes(rt, P, path)
    ctx = _Symbols(P, _param_shapes(rt.gpu_ops))
    phases = _phases(rt.gpu_ops)
    gaps, waits = launch_gaps(rt), _dispatch(rt.gpu_ops)
    kernels = [replace(_kernel(g, ph, gap, ctx), dispatch=w) for g, ph, gap, w in zip(rt.gpu_ops, phases, gaps, waits)]
    fwd = [k for k in kernels if k.phase == FWD]
    bwd = [k for k in kernels if k.phase == BWD]
    opt = tuple(k for k in kernels if k.phase == OPT)
    if not [k for k in bwd if k.cls != MEMORY]:
        raise TraceError(f"{path}: the profiled step has no backward pass ({len(fwd)} forward kernels, none "
                         "under autograd's backward); profile a training step: the forward, loss.backward() "
                         "and optimizer.step()")
    fwd_ops = [g for g, ph in zip(rt.gpu_ops, phases) if ph == FWD]
    found = _repeats(fwd, P.layers), _repeats(bwd, P.layers)
    if None in found:  # memsets (cuBLAS workspaces) need not repeat with the layers: without them
        keep = [k.cls != MEMORY for k in kernels]
        fwd_ops = [g for g, ph, kp in zip(rt.gpu_ops, phases, keep) if ph == FWD and kp]
        fwd, bwd = [k for k in fwd if k.cls != MEMORY], [k for k in bwd if k.cls != MEMORY]
        found = _repeats(fwd, P.layers), _repeats(bwd, P.layers)
    (o_f, p_f), (o_b, p_b) = (_blocks(ks, f, P.layers, path, what)
                              for ks, f, what in ((fwd, found[0], "forward"), (bwd, found[1], "backward")))
    _one_pass(fwd, o_f, p_f, P.layers, path, stepped=rt.step is not None)
    embed_params, block_params, head_params = _unit_params(fwd_ops, o_f, p_f, P.layers, ctx)
    tied = _tied(rt.gpu_ops, phases, P)
    if tied:
        head_params = tuple(p for p in head_params if {d[0] for d in p} != {"V", "h"})
    block_fwd = _queries(_mean_block(fwd[o_f:o_f + P.layers * p_f], p_f, P.layers), forward=True)
    block_bwd = _queries(_mean_block(bwd[o_b:o_b + P.layers * p_b], p_b, P.layers), forward=False)
    _check_widths(block_fwd, block_params, P, profiled, path)
    return Profile(path=path, shape=P, step_s=rt.step_dur, embed_fwd=tuple(fwd[:o_f]), block_fwd=block_fwd,
                   head_fwd=tuple(fwd[o_f + P.layers * p_f:]), head_bwd=tuple(bwd[:o_b]), block_bwd=block_bwd,
                   embed_bwd=tuple(bwd[o_b + P.layers * p_b:]), optimizer=opt, embed_params=embed_params,
                   block_params=tuple(_square_q(p) for p in block_params), head_params=head_params, tied=tied,
                   param_bytes=_param_bytes(fwd_ops), dtype=_gemm_dtype(kernels), causal=_causal(rt.gpu_ops),
                   device=rt.device)


def _phases(ops: list[GpuOp]) -> list[str]:
    """fwd | bwd | optimizer of each op; a memset or memcpy takes the phase of its surroundings."""
    out: list[str] = []
    for g in ops:
        if g.category in (FWD, BWD, OPT):
            out.append(g.category)
        elif "Backward" in g.node or "backward" in g.node:
            out.append(BWD)
        else:
            out.append(out[-1] if out else FWD)
    return out


def launch_gaps(rt: RankTrace) -> list[float]:
    """Host seconds between one launch and the next, less any time the host spent in a sync and
    less the profiler's own cost of the ops it recorded in between (PROFILER_OP_S each) and of the
    launch (PROFILER_LAUNCH_S)."""
    out: list[float] = []
    prev = rt.step_start
    for g in rt.gpu_ops:
        ops = bisect.bisect_right(rt.host_op_ts, g.launch_ts) - bisect.bisect_right(rt.host_op_ts, prev)
        gap = g.launch_ts - prev - _synced(rt.host_calls, prev, g.launch_ts) - ops * PROFILER_OP_S \
            - PROFILER_LAUNCH_S
        out.append(max(0.0, gap))
        prev = g.launch_ts
    return out


def _dispatch(ops: list[GpuOp]) -> list[float]:
    """The GPU's idle time before each kernel that was launched before its predecessor ended (so
    it waited on the GPU's own dispatch, not on the host): 1-2 us a kernel on the H200 profile,
    about 4 ms of its 261 ms step."""
    out: list[float] = []
    prev_end = None
    for g in ops:
        queued = prev_end is not None and g.launch_ts <= prev_end
        out.append(max(0.0, g.ts - prev_end) if queued and prev_end is not None else 0.0)
        prev_end = g.end if prev_end is None else max(prev_end, g.end)
    return out


def _synced(calls: list[HostCall], t0: float, t1: float) -> float:
    return sum(max(0.0, min(c.end, t1) - max(c.ts, t0)) for c in calls if c.kind == "sync")


def _repeats(ks: list[ProfiledKernel], layers: int) -> tuple[int, int] | None:
    """(offset, period) of ``layers`` repeats of one kernel sequence: the longest period, the
    earliest start (the embedding's kernels come before the first block); None if none repeats so."""
    names = [k.name for k in ks]
    n = len(names)
    for period in range(n // layers, 0, -1):
        for off in range(0, n - layers * period + 1):
            first = names[off:off + period]
            if all(names[off + i * period:off + (i + 1) * period] == first for i in range(1, layers)):
                return off, period
    return None


def _unit(names: list[str], off: int, period: int) -> int:
    """The shortest sequence the found period is made of: ``period`` kernels that are k copies of one
    block (workload.profiled.layers given as a k-th of the blocks) give that block's length."""
    for p in range(1, period + 1):
        if period % p == 0 and names[off:off + period] == names[off:off + p] * (period // p):
            return p
    return period


def _run(names: list[str], off: int, p: int) -> int:
    """How many times in a row the block of ``p`` kernels at ``off`` runs (before and after ``off`` too)."""
    block = names[off:off + p]
    start = off
    while start - p >= 0 and names[start - p:start] == block:
        start -= p
    end = off + p
    while names[end:end + p] == block:
        end += p
    return (end - start) // p


def _blocks(ks: list[ProfiledKernel], found: tuple[int, int] | None, layers: int, path: str,
            what: str) -> tuple[int, int]:
    """(offset, period) of the block in a pass, checked: its kernel sequence runs exactly ``layers``
    times in a row, else workload.profiled.layers is refused with the count the trace has."""
    names = [k.name for k in ks]
    if found is None:
        for n in range(layers - 1, 1, -1):  # the most repeats there are, below what was given
            f = _repeats(ks, n)
            if f is not None:
                p = _unit(names, *f)
                _wrong_layers(path, layers, _run(names, f[0], p), p, what)
        raise TraceError(f"{path}: no kernel sequence repeats {layers} times in the {what} pass "
                         f"({len(ks)} kernels); is workload.profiled.layers ({layers}) the number of blocks the "
                         "script ran?")
    p = _unit(names, *found)
    count = _run(names, found[0], p)
    if layers == 1:  # the whole pass "repeats once": is there a block that runs over half of it?
        two = _repeats(ks, 2)
        if two is not None:
            p2 = _unit(names, *two)
            if p2 * _run(names, two[0], p2) * 2 > len(names):
                p, count = p2, _run(names, two[0], p2)
    if count != layers:
        _wrong_layers(path, layers, count, p, what)
    return found


def _wrong_layers(path: str, layers: int, count: int, p: int, what: str) -> None:
    raise TraceError(f"{path}: workload.profiled.layers is {layers}, but the trace's block ({p} kernels) runs "
                     f"{count} times in a row in the {what} pass; expected them to agree (give layers: {count})")


def _one_pass(ks: list[ProfiledKernel], off: int, period: int, layers: int, path: str, stepped: bool = True) -> None:
    """Refuse a step that runs the model more than once (gradient accumulation, several micro-batches,
    or a trace of several steps without ProfilerStep marks): the block's kernel sequence appears
    again after its ``layers`` repeats."""
    names = [k.name for k in ks]
    block, rest = names[off:off + period], names[off + layers * period:]
    if not any(rest[i:i + period] == block for i in range(len(rest) - period + 1)):
        return
    if not stepped:
        raise TraceError(f"{path}: the trace has no ProfilerStep, so it is read whole, and it runs the model's "
                         f"blocks more than {layers} times (several steps); profile with a schedule and "
                         "prof.step() after each step (torch.profiler.schedule), or profile exactly one step")
    raise TraceError(f"{path}: the profiled step runs the model's blocks more than {layers} times (gradient "
                     "accumulation or several micro-batches a step?); profile a step of one forward and one "
                     "backward, or give workload.profiled.layers as the blocks of one pass")


def _mean_block(ks: list[ProfiledKernel], period: int, layers: int) -> tuple[ProfiledKernel, ...]:
    """One block: the first layer's kernels with each time and launch gap the mean over the layers."""
    out = []
    for i in range(period):
        same = ks[i::period]
        out.append(replace(same[0], seconds=sum(k.seconds for k in same) / layers,
                           launch_gap=sum(k.launch_gap for k in same) / layers,
                           dispatch=sum(k.dispatch for k in same) / layers))
    return tuple(out)


def _square_q(dims: Dims) -> Dims:
    """A block's [h, h] weight (or its cast, gradient): one side is the query heads' width ``q``
    (attention output projection, a separate query projection), split under tensor parallelism."""
    if len(dims) == 2 and dims[0][0] == dims[1][0] == "h":
        return dims[0], ("q", dims[1][1])
    return dims


def _queries(block: tuple[ProfiledKernel, ...], forward: bool) -> tuple[ProfiledKernel, ...]:
    """Name the query width ``q`` where the block's values cannot tell it from ``h``: a GEMM with an
    [h, h] weight reads it (K, a row-parallel output projection) after the attention, and writes it
    (N, a column-parallel query projection) before; backward, one side of the square weight."""
    att = next((i for i, k in enumerate(block) if k.cls == ATTENTION), -1)
    out = []
    for i, k in enumerate(block):
        g = k.gemm
        if g is not None and sum(d[0] == "h" for d in g[1:]) == 2:
            side = (2 if i < att else 3) if forward else next(j for j in (1, 2, 3) if g[j][0] == "h")
            named = [("q", d[1]) if j == side else d for j, d in enumerate(g)]
            k = replace(k, gemm=(named[0], named[1], named[2], named[3]))
        out.append(replace(k, tensors=tuple(_square_q(t) for t in k.tensors)))
    return tuple(out)


# ---------------------------------------------------------------------------- kernels


def _kernel(g: GpuOp, phase: str, gap: float, ctx: "_Symbols") -> ProfiledKernel:
    """One GPU op of the profiled step, classed by the innermost aten op it ran under. A compiled
    (Inductor) kernel under no aten op is element-wise by its record's tensors: it rescales by their
    bytes, whatever it fuses (a Triton GEMM template too: an ASSUMPTION, stated in the guide)."""
    inner = g.cpu_inner or g.compiled or {}
    op = str(inner.get("name", ""))
    args = inner.get("args", {}) if isinstance(inner.get("args"), dict) else {}
    dims, types = args.get("Input Dims") or [], args.get("Input type") or []
    dtype = next((_DTYPES[str(t).lower()] for t in types if str(t).lower() in _DTYPES), "")
    k = ProfiledKernel(g.name[:160], MEMORY, g.dur, phase, op, dtype, launch_gap=gap)
    if g.cpu_inner is None and g.compiled is not None:
        k = replace(k, compiled=True, kernel_flop=_number(args.get("kernel_flop")),
                    kernel_bytes=_number(args.get("kernel_num_gb")) * 1e9)
    if g.cat != "kernel":
        return replace(k, sync="DtoH" in g.name)
    if phase == OPT:
        return replace(k, cls=OPTIMIZER)
    if not op:
        return k
    if k.compiled:
        return replace(k, cls=ELEMENTWISE, tensors=tuple(ctx.tensor(d, g.node, []) for d in _tensor_dims(dims)))
    if "attention" in op and any(a in g.name.lower() for a in _ATTENTION_KERNEL):
        att = _attention_dims(op, dims, ctx)
        if att is not None:
            return replace(k, cls=ATTENTION, attention=att)
    if op in _GEMM_OPS:
        gd = _gemm_dims(op, dims, ctx, phase, g)
        if gd is not None:
            return replace(k, cls=GEMM, gemm=gd)
    weights = _weight_operands(g.cpu_op, ctx.P.h)
    return replace(k, cls=ELEMENTWISE, tensors=tuple(ctx.tensor(d, g.node, weights) for d in _tensor_dims(dims)))


def _number(v: object) -> float:
    """A non-negative number an Inductor record declares; 0 when absent or not a number."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else 0.0


def _weight_operands(cpu: dict | None, h: int) -> list[list[int]]:
    """The shapes of the outer aten op's parameter operands that none of its other operands has: a
    kernel inside it (autocast's cast of ``aten::addmm``'s weight) on a tensor of such a shape works on
    the parameter, whatever its dimensions' values (the MLP down weight [ffn, h] of a step whose
    b·s tokens equal ffn)."""
    params = _op_params(cpu, h)
    if not params or cpu is None:
        return []
    every = _tensor_dims((cpu.get("args") or {}).get("Input Dims"))
    return [w for w in params if every.count(w) == params.count(w)]


def _tensor_dims(dims: object) -> list[list[int]]:
    """The tensors of an op's 'Input Dims' (a TensorList's members too); scalars and empties left out."""
    out: list[list[int]] = []
    if not isinstance(dims, list):
        return out
    for d in dims:
        if isinstance(d, list) and d and all(isinstance(x, int) for x in d):
            out.append(d)
        elif isinstance(d, list):
            out += _tensor_dims(d)
    return out


def _attention_dims(op: str, dims: list, ctx: "_Symbols") -> tuple[Dim, Dim, Dim, Dim, Dim] | None:
    """(b, heads, kv heads, seq, head dim) from q [b, heads, s, hd] and k (after grad_out in a backward)."""
    ts = _tensor_dims(dims)
    i = 1 if "backward" in op else 0
    if len(ts) < i + 2 or len(ts[i]) != 4 or len(ts[i + 1]) != 4:
        return None
    q, k = ts[i], ts[i + 1]
    P = ctx.P
    return (("b", q[0]) if q[0] == P.b else ("", q[0]), ctx.width(q[1]), ctx.width(k[1]),
            ("s", q[2]) if q[2] == P.s else ("", q[2]), ("hd", q[3]) if q[3] == P.hd else ("", q[3]))


def _gemm_dims(op: str, dims: list, ctx: "_Symbols", phase: str, g: GpuOp) -> tuple[Dim, Dim, Dim, Dim] | None:
    """(batch, M, N, K) of a GEMM op, each dimension named."""
    ts = _tensor_dims(dims)
    if op in ("aten::addmm", "aten::baddbmm"):
        ts = ts[1:] if len(ts) >= 3 else ts
    if len(ts) < 2:
        return None
    a, b = ts[0], ts[1]
    if op == "aten::linear":  # x [..., K], weight [N, K]
        return ("", 1), ctx.tokens(a[:-1]), ctx.width(b[0]), ctx.width(a[-1])
    if len(a) == 3 and len(b) == 3:  # batched: [bt, M, K] @ [bt, K, N]
        return ctx.batched(a[0]), ctx.seqlike(a[1]), ctx.seqlike(b[2]), ctx.seqlike(a[2])
    if len(a) > 2 and len(b) == 2:  # matmul of an activation by a weight
        return ("", 1), ctx.tokens(a[:-1]), ctx.width(b[1]), ctx.width(a[-1])
    if len(a) != 2 or len(b) != 2:
        return None
    M, K, N = a[0], a[1], b[1]
    where = ctx.token_side(M, N, K, phase, g)
    named = {"M": ctx.width(M), "N": ctx.width(N), "K": ctx.width(K)}
    if where:
        named[where] = ("T", ctx.P.b * ctx.P.s)
    return ("", 1), named["M"], named["N"], named["K"]


def _gemm_dtype(kernels: list[ProfiledKernel]) -> str:
    """The dtype most of the GEMM time ran in."""
    by: dict[str, float] = {}
    for k in kernels:
        if k.cls == GEMM and k.dtype:
            by[k.dtype] = by.get(k.dtype, 0.0) + k.seconds
    return max(by, key=lambda d: by[d]) if by else "bf16"


# ---------------------------------------------------------------------------- symbols


@dataclass
class _Symbols:
    """Names the dimensions of the profile's tensors by model symbol."""

    P: Shape
    params: set[tuple[int, int]]  # 2-D parameter shapes, both orientations
    _gemm_seen: dict[int, int] = field(default_factory=dict)  # autograd node instance -> GEMMs so far

    def width(self, v: int) -> Dim:
        for sym in WIDTHS:
            if self.P.value(sym) == v:
                return sym, v
        return "", v

    def tokens(self, lead: list[int]) -> Dim:
        n = 1
        for x in lead:
            n *= x
        return ("T", n) if n == self.P.b * self.P.s else ("", n)

    def batched(self, v: int) -> Dim:
        return ("bheads", v) if v == self.P.b * self.P.heads else ("", v)

    def seqlike(self, v: int) -> Dim:
        return ("s", v) if v == self.P.s else self.width(v)

    def token_side(self, M: int, N: int, K: int, phase: str, g: GpuOp) -> str:
        """Which of M, N, K is the tokens of a 2-D GEMM (the other two make a weight)."""
        T = self.P.b * self.P.s
        cands = [side for side, v, rest in (("M", M, (K, N)), ("K", K, (M, N)), ("N", N, (M, K)))
                 if v == T and rest in self.params]
        nth = self._gemm_seen.get(g.node_instance, 0)
        self._gemm_seen[g.node_instance] = nth + 1
        if len(cands) > 1 and "M" in cands and "K" in cands:
            # autograd's mm backward: the input gradient (tokens as rows) first, then the weight
            # gradient (contracting the tokens) -- torch/csrc/autograd/FunctionsManual.cpp mm_mat1/2_backward
            return "M" if nth == 0 or phase == FWD else "K"
        if cands:
            return cands[0]
        return next((side for side, v in (("M", M), ("K", K), ("N", N)) if v == T), "")

    def tensor(self, d: list[int], node: str, weights: list[list[int]] | None = None) -> Dims:
        """An element-wise op's tensor: [b, s, ...], [b, heads, s, hd], [T, ...] or parameter-shaped
        (a parameter operand of the op it runs in, ``weights``, or a weight's gradient cast back)."""
        P = self.P
        n = len(d)
        if weights and d in weights:
            return tuple(self.width(x) for x in d)
        if n >= 2 and d[0] == P.b and P.s in d[1:]:
            # batch-first activations: [b, s, ...], [b, heads, s, hd], [b, kv heads, groups, s, hd]:
            # the first later dimension of the sequence's length is the sequence, the rest are widths
            at = d.index(P.s, 1)
            return (("b", d[0]),) + tuple(("s", x) if i == at else self.width(x) for i, x in enumerate(d) if i)
        weight = n == 2 and (d[0], d[1]) in self.params and "ToCopyBackward" in node
        if d[0] == P.b * P.s and not weight:
            return (("T", d[0]),) + tuple(self.width(x) for x in d[1:])
        return tuple(self.width(x) for x in d)


def _param_shapes(ops: list[GpuOp]) -> set[tuple[int, int]]:
    """2-D parameter shapes (both orientations): the weights of the forward's linear layers and
    embedding tables."""
    out: set[tuple[int, int]] = set()
    for g in ops:
        for w in _op_params(g.cpu_op, 0):
            if len(w) == 2:
                out |= {(w[0], w[1]), (w[1], w[0])}
    return out


def _op_params(cpu: dict | None, h: int) -> list[list[int]]:
    """The parameter operands of a forward aten op (weights, biases, norm gains and shifts); with
    ``h``, also the [h] gain of a norm written as a product (Hugging Face's RMSNorm: weight * x)."""
    if not cpu:
        return []
    name = str(cpu.get("name", ""))
    args = cpu.get("args", {}) if isinstance(cpu.get("args"), dict) else {}
    dims = args.get("Input Dims") or []
    pick: tuple[int, ...] = {"aten::addmm": (0, 2), "aten::linear": (1, 2), "aten::layer_norm": (2, 3),
                             "aten::embedding": (0,), "aten::rms_norm": (2,), "aten::group_norm": (2, 3)}.get(name, ())
    if name == "aten::mul" and h and len(dims) == 2 and [h] in dims and any(len(d) == 3 for d in dims):
        pick = (dims.index([h]),)
    return [dims[i] for i in pick if i < len(dims) and isinstance(dims[i], list) and dims[i]
            and all(isinstance(x, int) for x in dims[i])]


def _unit_params(fwd_ops: list[GpuOp], off: int, period: int, layers: int,
                 ctx: _Symbols) -> tuple[tuple[Dims, ...], tuple[Dims, ...], tuple[Dims, ...]]:
    """The parameters of the embedding, one block and the head: the parameter operands of the
    aten ops their forward kernels run under (each op instance once)."""
    def of(ops: list[GpuOp], embedding: bool) -> tuple[Dims, ...]:
        seen: set[int] = set()
        out: list[Dims] = []
        for g in ops:
            if g.cpu_op is None or g.cpu_instance in seen:
                continue
            seen.add(g.cpu_instance)
            for w in _op_params(g.cpu_op, ctx.P.h):
                emb = embedding and str(g.cpu_op.get("name")) == "aten::embedding"
                out.append(_embedding_dims(w, ctx) if emb else tuple(ctx.width(x) for x in w))
        return tuple(out)
    end = off + layers * period
    return of(fwd_ops[:off], True), of(fwd_ops[off:off + period], False), of(fwd_ops[end:], False)


def _embedding_dims(w: list[int], ctx: _Symbols) -> Dims:
    """An embedding table [rows, h]: rows are the vocabulary, or a fixed count (positions)."""
    rows: Dim = ("V", w[0]) if w[0] == ctx.P.V else ("", w[0])
    return (rows,) + tuple(ctx.width(x) for x in w[1:])


def _tied(ops: list[GpuOp], phases: list[str], P: Shape) -> bool:
    """The head reuses the embedding table: its two gradients are added in the backward (an
    aten::add_ of two [V, h] tensors)."""
    for g, ph in zip(ops, phases):
        cpu = g.cpu_inner or {}
        if ph == BWD and cpu.get("name") == "aten::add_":
            ts = _tensor_dims(cpu.get("args", {}).get("Input Dims"))
            if len(ts) >= 2 and ts[0] == ts[1] and sorted(ts[0]) == sorted([P.V, P.h]):
                return True
    return False


def _param_bytes(fwd_ops: list[GpuOp]) -> int:
    """Bytes of a parameter element: the dtype of the first embedding table or weight."""
    for g in fwd_ops:
        cpu = g.cpu_op or {}
        if str(cpu.get("name")) in ("aten::embedding", "aten::linear", "aten::addmm"):
            types = cpu.get("args", {}).get("Input type") or []
            i = {"aten::embedding": 0, "aten::linear": 1, "aten::addmm": 2}[str(cpu.get("name"))]
            if i < len(types):
                return DTYPE_BYTES.get(_DTYPES.get(str(types[i]).lower(), ""), 2)
    return 4


# ---------------------------------------------------------------------------- checks


def _check_recorded(rt: RankTrace, path: str) -> None:
    """The shapes are what lets a kernel be rescaled: refuse a trace recorded without them (as
    ``emulator calibrate --kineto`` does)."""
    ops = {g.cpu_instance: g.cpu_op for g in rt.gpu_ops if g.cpu_op is not None}
    if not any((op.get("args") or {}).get("Input Dims") for op in ops.values()):
        raise TraceError(f"{path}: the trace was recorded without shapes: none of its {len(ops)} aten ops that "
                         "launch kernels has 'Input Dims', so no kernel can be rescaled; profile with "
                         "record_shapes=True")


def _sdpa(rt: RankTrace) -> tuple[list[int], list[int], dict] | None:
    """q, k and the op of the first forward scaled-dot-product attention."""
    for g in rt.gpu_ops:
        cpu = g.cpu_op or {}
        ts = _tensor_dims((cpu.get("args") or {}).get("Input Dims"))
        if "scaled_dot_product" in str(cpu.get("name", "")) and len(ts) >= 2 and len(ts[0]) == 4 \
                and len(ts[1]) == 4 and g.category == FWD:
            return ts[0], ts[1], cpu
    return None


def _causal(ops: list[GpuOp]) -> bool | None:
    """aten::scaled_dot_product_attention's is_causal (its sixth input, in 'Concrete Inputs')."""
    for g in ops:
        cpu = g.cpu_op or {}
        if cpu.get("name") == "aten::scaled_dot_product_attention":
            concrete = (cpu.get("args") or {}).get("Concrete Inputs") or []
            if len(concrete) > 5 and concrete[5] in ("True", "False"):
                return concrete[5] == "True"
    return None


def _check_shapes(rt: RankTrace, P: Shape, path: str) -> None:
    """What the trace says against workload.profiled: the attention's q [micro_batch, heads, seq_len,
    hidden/heads] and k [., kv heads, ., .], the token ids' length, then the embedding tables: one of
    [vocab, hidden] (the others, a learned position table, have as many rows as the script's
    maximum length)."""
    att = _sdpa(rt)
    tables: list[list[int]] = []
    lengths: list[list[int]] = []
    for g in rt.gpu_ops:
        cpu = g.cpu_op or {}
        ts = _tensor_dims((cpu.get("args") or {}).get("Input Dims"))
        if cpu.get("name") == "aten::embedding" and len(ts) >= 2 and len(ts[0]) == 2 and g.category == FWD:
            tables.append(ts[0])
            lengths.append(ts[1])
    if att is not None:
        q, k, _ = att
        for key, want, got in (("micro_batch", P.b, q[0]), ("seq_len", P.s, q[2]), ("heads", P.heads, q[1]),
                               ("hidden", P.h, q[1] * q[3])):
            if want != got:
                _contradict(path, key, want, f"{got} in the attention's q", q)
        if k[1] not in (P.kvh, P.heads):  # k with all the heads: repeated key/value heads (checked by width)
            _contradict(path, "kv_heads", P.kvh, f"{k[1]} key heads in the attention's k", k)
    elif lengths and lengths[0][-1] != P.s:
        _contradict(path, "seq_len", P.s, f"token ids of length {lengths[0][-1]}", lengths[0])
    vocab = [t for t in tables if t[0] == P.V]
    if tables and not vocab:
        big = max(tables, key=lambda t: t[0])
        _contradict(path, "vocab", P.V, f"no embedding table of {P.V} rows (the largest has {big[0]})", big)
    if vocab and vocab[0][-1] != P.h:
        _contradict(path, "hidden", P.h, f"an embedding width of {vocab[0][-1]}", vocab[0])


def _check_widths(block: tuple[ProfiledKernel, ...], params: tuple[Dims, ...], P: Shape, given: ProfiledSpec,
                  path: str) -> None:
    """The block's forward GEMMs against the MLP width and the key/value heads: the MLP's down
    projection has ``ffn`` among its dimensions, a key/value or fused QKV projection the key/value
    width."""
    syms = {d[0] for k in block if k.gemm for d in k.gemm[1:]}

    def widths(but: tuple[str, ...]) -> str:
        ws = sorted({d[1] for w in params for d in w if d[0] not in but} - {1})
        return ", ".join(map(str, ws)) or "none"
    if "ffn" not in syms:  # the MLP's down projection reads ffn (a fused gate and up writes 2·ffn)
        default = "" if given.ffn_hidden else " (absent: 4 x hidden)"
        raise TraceError(f"{path}: workload.profiled.ffn_hidden is {P.ffn}{default}, but no GEMM of the block reads "
                         f"the MLP width {P.ffn}: the block's weights have the widths "
                         f"{widths(('h', 'qkv', 'kv', 'q'))} besides the hidden size and the attention's; expected "
                         "the MLP's width among them")
    if not syms & {"qkv", "kv"} and P.kvh != P.heads:
        default = "" if given.kv_heads else " (absent: heads)"
        raise TraceError(f"{path}: workload.profiled.kv_heads is {P.kvh}{default}, but no GEMM of the block has the "
                         f"key/value width {P.kvh} x {P.hd} = {P.kvh * P.hd} (or the fused QKV "
                         f"{(P.heads + 2 * P.kvh) * P.hd}): the block's weights have the widths "
                         f"{widths(('h', 'ffn', 'ffn2'))} besides the hidden size and the MLP's; "
                         "expected them to agree")


def _contradict(path: str, key: str, want: int, got: str, dims: list[int]) -> None:
    raise TraceError(f"{path}: workload.profiled.{key} is {want}, but the trace has {got} "
                     f"(shape {dims}); expected them to agree")
