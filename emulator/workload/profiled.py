"""A profiled workload: the user's own script, from a one-GPU profile, at this scenario's model,
batch and parallel layout.

The profile (``workload.profile``, read by :mod:`emulator.importers.profile`) gives the step's
parts: embedding, one repeated block (forward and backward), head and loss, optimizer. Each
kernel is reshaped to the scenario's sizes by the law of its class
(:mod:`emulator.devices.reshape`; GEMMs and attention through the GPU's kernel model,
:func:`emulator.workload.kernel_cost.kernel_cost`), and the parts become the build plan's units
(``embed``, ``layer{i}``, ``head``). Everything else is the one workload builder's: pipeline stages
and schedules, data-parallel gradient buckets (DDP: 25 MiB, reduced in the parameters' dtype),
ZeRO-1/2/3 and FSDP gathers, on the emulated fabric. What a profile cannot say (how the script's
own layers split over tensor-parallel GPUs) is refused by the loader's checks (scenario/checks.py).

Host time: the GPU waits for the host wherever the host launches slower than the GPU runs, and
after a synchronisation (a device-to-host copy such as HF's attention-mask check). Every kernel
keeps its launch gap (host seconds since the previous launch, measured), and
:func:`host_idle` replays two steps back to back, host and GPU, at the reshaped kernel times; the
GPU's idle time in the second step goes into each part as a ``host`` kernel.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Callable

from emulator.devices import compute
from emulator.devices import reshape as R
from emulator.devices import translation as TR
from emulator.errors import ScenarioError
from emulator.importers import profile as PI
from emulator.importers.profile import ATTENTION, GEMM, MEMORY, OPTIMIZER, Profile, ProfiledKernel, read_profile
from emulator.scenario import catalog
from emulator.scenario.checks import shown
from emulator.scenario.spec import GpuSpec, ProfiledSpec, Scenario
from emulator.scenario.units import format_bytes
from emulator.workload import kernel_cost as KC
from emulator.workload import layer as Ly
from emulator.workload.plan import Plan, Unit

PARTS = ("embed_fwd", "block_fwd", "head_fwd", "head_bwd", "block_bwd", "embed_bwd", "optimizer")


@lru_cache(maxsize=4)
def load(path: str, profiled: ProfiledSpec) -> Profile:
    """The profile of ``path`` (read once per process: sweeps reuse it)."""
    return read_profile(path, profiled)


def profile_of(sc: Scenario) -> Profile:
    """The scenario's profile, read once per process, with the keys it records checked against it."""
    assert sc.workload.profile is not None and sc.workload.profiled is not None  # the rule book checked it
    prof = load(sc.workload.profile, sc.workload.profiled)
    check_keys(sc, prof)
    check_gpu(sc, prof)
    return prof


# ---------------------------------------------------------------------------- another GPU


def source_gpu(sc: Scenario, prof: Profile) -> GpuSpec | None:
    """The catalog GPU the profile ran on when it is not the scenario's node GPU: its kernels are
    then translated (:mod:`emulator.devices.translation`). None when it is the node's GPU, or when the
    trace names no GPU (its kernel times are taken as the node GPU's), or names one the catalog does
    not know (:func:`check_gpu` refuses that unless it is the node GPU's own name)."""
    assert sc.cluster.node is not None  # the builder checked it
    target = sc.cluster.node.gpu
    name = TR.catalog_name(prof.device) if prof.device else None
    if name is None or name == target.name:
        return None
    return catalog.gpu(name)


def kernel_dtypes(prof: Profile) -> set[str]:
    """The dtypes the profile's GEMMs and attention kernels ran in."""
    return {k.dtype for name in PARTS for k in getattr(prof, name) if k.cls in (GEMM, ATTENTION) and k.dtype}


def check_gpu(sc: Scenario, prof: Profile) -> None:
    """A profile from a GPU the catalog does not know, predicted on another GPU, is refused with its
    name; so is one whose kernels' precision the node's GPU cannot run (translation.refusal)."""
    assert sc.cluster.node is not None
    target = sc.cluster.node.gpu
    where = dict(sc.given).get("workload.profile", sc.path)
    if prof.device and TR.catalog_name(prof.device) is None and prof.device != target.name:
        known = ", ".join(sorted(TR.CUDA_NAMES))
        raise ScenarioError(f"the profile ran on GPU {prof.device!r} (its deviceProperties), which no catalog GPU "
                            f"is known by, so its kernels cannot be translated to {target.name}; expected one of "
                            f"{known}, or predict it on a node whose GPU is named {prof.device!r}", where,
                            "workload.profile")
    source = source_gpu(sc, prof)
    if source is None:
        return
    why = TR.refusal(target, kernel_dtypes(prof))
    if why is not None:
        raise ScenarioError(f"the profile ran on {source.name} ({prof.device}) and the node's GPU is {target.name}: "
                            f"{why}", where, "workload.profile")


def check_keys(s: Scenario, prof: Profile) -> None:
    """Keys whose value the profile records (``checks.PROFILE_RECORDS``, given in the file): the
    precision its GEMMs ran in, its attention kernels and mask, a tied embedding, its weights' type for
    the optimizer's states, a peak above its own states. Given as the profile has them they are
    accepted; else refused with both values, at the key's place in the file."""
    given = dict(s.given)
    t = s.training

    def fail(kp: str, message: str) -> ScenarioError:
        return ScenarioError(message, given.get(kp, s.path), kp)

    if "training.precision" in given and t.precision != prof.dtype:
        raise fail("training.precision", f"training.precision is {t.precision}, but the profiled script's "
                                         f"GEMMs ran in {prof.dtype}; the profile fixes the precision its "
                                         "kernels ran in: leave training.precision out")
    if "training.attention" in given:
        att = next((k.name for k in prof.block_fwd if k.cls == "attention"), "")
        kind = f"its own fused kernel ({att[:60]})" if att else "unfused (no fused attention kernel)"
        raise fail("training.attention", f"training.attention is {t.attention}, but the profiled "
                                         f"script's attention is {kind}; the profile fixes it: leave "
                                         "training.attention out")
    m = s.model
    if m is not None and "model.causal" in given and prof.causal is not None and m.causal != prof.causal:
        raise fail("model.causal", f"model.causal is {shown(m.causal)}, but the profiled attention has "
                                   f"is_causal={prof.causal}; the profile fixes its mask: leave model.causal out")
    if m is not None and "model.tied_embeddings" in given and m.tied_embeddings != prof.tied:
        head = "reuses the" if prof.tied else "has its own"
        raise fail("model.tied_embeddings", f"model.tied_embeddings is {shown(m.tied_embeddings)}, but the "
                                            f"profiled head {head} embedding table; the profile fixes it: leave "
                                            "model.tied_embeddings out")
    if t.fine_grained_activation_offloading:  # what a script's modules save is not in its profile
        raise fail("training.fine_grained_activation_offloading",
                   "fine-grained activation offloading is Megatron-Core's, by module; a profiled script's saved "
                   "tensors are its own: leave it out")
    _check_peak(s, prof, fail)
    if t.optimizer in ("muon", "dist_muon"):  # its matrices are the model description's (workload/muon.py)
        raise fail("training.optimizer", f"training.optimizer is {t.optimizer}, Megatron-Core's Muon, whose "
                                         "matrices come from a model description; a profiled script's step is "
                                         "its own: leave training.optimizer out")
    if "training.optimizer" in given and prof.param_bytes not in (2,):
        raise fail("training.optimizer", f"training.optimizer is {t.optimizer}, which keeps an fp32 main copy "
                                         "of 16-bit weights, but the profiled script's weights are "
                                         f"{prof.param_bytes * 8}-bit ({prof.param_bytes} B): they are their own "
                                         "main copy and Adam's two moments are 8 B a parameter whichever "
                                         "optimizer; leave training.optimizer out")


def _check_peak(s: Scenario, prof: Profile, fail: Callable[[str, str], ScenarioError]) -> None:
    """A given peak below the profiled run's own optimizer states is refused with both."""
    assert s.workload.profiled is not None
    peak = s.workload.profiled.peak_memory
    if not peak:
        return
    psi = R.params(prof.embed_params + prof.head_params) + prof.shape.layers * R.params(prof.block_params)
    states = 4 * prof.param_bytes * psi  # the profiled run's AdamW: weight, gradient, two moments
    if peak < states:
        raise fail("workload.profiled.peak_memory",
                   f"workload.profiled.peak_memory is {format_bytes(peak)}, below the optimizer's own states in "
                   f"the profiled run: {psi:,} parameters x {4 * prof.param_bytes} B (weight, gradient, AdamW's "
                   f"two moments) = {format_bytes(states)}; expected the peak torch.cuda.max_memory_allocated() "
                   "printed after a step")


def target_shape(sc: Scenario) -> R.Shape:
    """The sizes the scenario predicts the script at (its model and micro-batch). ``model.head_dim``
    changes the query and key/value widths (heads x head_dim) and the attention's head dim; absent,
    hidden/heads."""
    assert sc.model is not None  # the reader made it from workload.profiled
    m = sc.model
    return R.Shape(b=sc.training.micro_batch, s=m.seq_len, layers=m.layers, h=m.hidden, heads=m.heads,
                   kvh=m.kv_heads or m.heads, ffn=m.ffn_hidden or 4 * m.hidden, V=m.vocab, head_dim=m.head_dim)


# ---------------------------------------------------------------------------- one kernel


def _gemm(dims: list[int], k: ProfiledKernel, gpu: GpuSpec) -> tuple[float, float]:
    """(seconds by the kernel model, FLOPs) of a GEMM of (batch, M, N, K); its token dimension (no
    operand's leading dimension) is exempt from cuBLAS's alignment rule (compute.gemm_cost)."""
    b, m, n, kk = dims
    assert k.gemm is not None
    rows = next((i for i in (1, 3, 2) if k.gemm[i][0] == "T"), 1)
    return compute.gemm_cost(m, n, kk, gpu, k.dtype if k.dtype in compute.DTYPE_BYTES else "bf16", b, rows)[0], \
        2.0 * b * m * n * kk


def _attention(dims: list[int], k: ProfiledKernel, gpu: GpuSpec) -> tuple[float, float]:
    """(seconds by the kernel model, FLOPs) of a causal fused attention of (b, heads, kvh, s, hd)."""
    b, heads, kvh, s, hd = dims
    back = k.phase == "bwd"
    t, _ = compute.attention_cost(b, heads, kvh, s, hd, gpu, causal=True, backward=back, dtype="bf16")
    return t, compute.attention_flops(b, heads, s, s, hd, True, back)


def _dtype(k: ProfiledKernel) -> str:
    """The dtype a GEMM or attention kernel is costed in: its own, else bf16."""
    return k.dtype if k.dtype in compute.DTYPE_BYTES else "bf16"


def host_copy(k: ProfiledKernel) -> bool:
    """A copy between host and device: it runs at the host link's rate, not the GPU's."""
    return k.cls == MEMORY and ("HtoD" in k.name or "DtoH" in k.name)


def translated(k: ProfiledKernel, source: GpuSpec | None, gpu: GpuSpec) -> float:
    """The measured time of a kernel that is no GEMM or attention, on ``gpu``: by the ratio of achieved
    HBM bandwidths when the profile ran on another GPU ``source`` (translation.memory_time), or, for a
    compiled kernel whose Inductor record declares its FLOPs and bytes, by the ratio of the two GPUs'
    rooflines of them; a copy to or from the host as measured."""
    if source is None or host_copy(k):
        return k.seconds
    if k.kernel_flop or k.kernel_bytes:  # a compiled kernel that declares its work: the rooflines' ratio
        f, b = k.kernel_flop, k.kernel_bytes
        return TR.modelled_time(k.seconds, compute.roofline_time(f, b, TR.roofline_gpu(source)),
                                compute.roofline_time(f, b, TR.roofline_gpu(gpu)))
    return TR.memory_time(k.seconds, source, gpu)


def reshaped(k: ProfiledKernel, P: R.Shape, Q: R.Shape, gpu: GpuSpec, params_ratio: float = 1.0,
             source: GpuSpec | None = None) -> "Reshaped":
    """Kernel ``k`` of a profile taken at ``P`` (on GPU ``source``, when not ``gpu``), at shape ``Q`` on
    ``gpu``: measured where nothing changes, else rescaled by its class's law (its source then
    "interpolated"). Translated first (a GEMM or attention kernel by the ratio of the two GPUs'
    rooflines at ``P``, any other by translation.memory_time), then reshaped on ``gpu`` (the kernel
    model's ratio, ``Q`` over ``P``). Never faster than its FLOPs at ``gpu``'s peak (``capped``: an
    efficiency above 1 held at 1)."""
    t, flops, nbytes, capped = k.seconds, 0.0, 0.0, False
    if k.cls in (GEMM, ATTENTION):
        dims = k.gemm if k.cls == GEMM else k.attention
        assert dims is not None  # the importer gives every GEMM and attention kernel its dims
        before, after = [d[1] for d in dims], [R.size(d, Q) for d in dims]
        cost = _gemm if k.cls == GEMM else _attention
        model_after, flops = cost(after, k, gpu)
        if source is not None:  # on the target at the profiled shape: the rooflines' ratio (translation.py)
            t = TR.modelled_time(t, cost(before, k, TR.roofline_gpu(source))[0],
                                 cost(before, k, TR.roofline_gpu(gpu))[0])
        if after != before:
            t = R.ratio_time(t, cost(before, k, gpu)[0], model_after)
        floor = TR.peak_floor(flops, gpu, _dtype(k) if k.cls == GEMM else "bf16")
        capped = t < floor
        t = max(t, floor)
    else:
        m = translated(k, source, gpu)
        if k.cls == OPTIMIZER:
            t = m * params_ratio
        elif k.cls != MEMORY:
            t = m if R.bytes_ratio(k.tensors, Q) == 1.0 else R.elementwise_time(m, k.tensors, Q)
            nbytes = sum(R.elements(x, Q) for x in k.tensors) * compute.DTYPE_BYTES.get(k.dtype, 2)
        elif k.unscaled and (Q.b, Q.s) != (P.b, P.s):
            t = R.tokens_time(m, P, Q)
        else:
            t = m
    origin = "measured" if t == k.seconds and source is None else "interpolated"
    return Reshaped(_short(k.name), "elementwise" if k.cls not in (GEMM, ATTENTION) else "gemm", flops, nbytes,
                    category=k.phase if k.phase in ("fwd", "bwd") else "optimizer",
                    dtype=compute.DTYPE_BYTES.get(k.dtype, 2), seconds=t, source=origin,
                    sides=(k.gemm[1][0], k.gemm[2][0], k.gemm[3][0]) if k.gemm else ("", "", ""),
                    attention=k.cls == ATTENTION, capped=capped)


@dataclass(frozen=True)
class Reshaped(KC.Timed):
    """A profiled kernel at the scenario's shape: its time, and what placing the tensor-parallel
    all-reduces needs (the symbols of its GEMM's M, N, K; whether it is the attention)."""

    sides: tuple[str, str, str] = ("", "", "")
    attention: bool = False
    capped: bool = False  # its translated or reshaped time was below its FLOPs at the GPU's peak, held there


def _short(name: str) -> str:
    return name if len(name) <= 60 else name[:57] + "..."


# ---------------------------------------------------------------------------- the host


def host_idle(seq: list[tuple[float, float, bool, float]]) -> list[float]:
    """GPU idle before each kernel in the second of two back-to-back steps.

    ``seq``: (GPU seconds, host seconds since the previous launch, the host waits for it, the
    GPU's own dispatch latency before it) per kernel in launch order. The host launches kernel i
    at C_i = C_{i-1} + gap_i (after a synchronising kernel, no earlier than that kernel's end); the
    GPU runs it from max(G_{i-1} + dispatch_i, C_i) to that + its time. The first step fills the
    pipeline as a steady state would; the second is the period.
    """
    C = G = 0.0
    idle: list[float] = []
    for rep in (0, 1):
        for g, gap, sync, dispatch in seq:
            C += gap
            start = max(G + dispatch, C)
            if rep:
                idle.append(start - G)
            G = start + g
            if sync:
                C = max(C, G)
    return idle


# ---------------------------------------------------------------------------- the plan


def _kernels(prof: Profile, Q: R.Shape, gpu: GpuSpec, source: GpuSpec | None = None) -> dict[str, list[KC.Timed]]:
    """Every part's kernels at ``Q`` on ``gpu`` (translated from ``source``, the GPU the profile ran on,
    when given), one for one with the profile's."""
    P = prof.shape
    after = R.params(prof.embed_params + prof.head_params, Q) + Q.layers * R.params(prof.block_params, Q)
    ratio = after / (R.params(prof.embed_params + prof.head_params) + P.layers * R.params(prof.block_params))
    return {name: [reshaped(k, P, Q, gpu, ratio, source) for k in getattr(prof, name)] for name in PARTS}


def _parts(prof: Profile, Q: R.Shape, gpu: GpuSpec, source: GpuSpec | None = None) -> dict[str, list[KC.Timed]]:
    """:func:`_kernels`, each part led by the GPU's idle time waiting on the host (its launch gaps as
    measured: the host is assumed unchanged)."""
    parts = _kernels(prof, Q, gpu, source)
    order = _order(Q)
    idle = host_idle(_sequence(prof, parts, Q))
    i = 0
    for name, n in order:
        size = len(parts[name]) * n
        waited = sum(idle[i:i + size]) / n
        i += size
        if waited > 0:
            cat = "optimizer" if name == "optimizer" else name.split("_")[1]
            parts[name].insert(0, KC.Timed("host", "elementwise", 0.0, 0.0, category=cat, seconds=waited))
    return parts


def _order(Q: R.Shape) -> list[tuple[str, int]]:
    """The parts of one step in launch order, each with how many times it runs (the block ``layers`` times)."""
    return [("embed_fwd", 1), ("block_fwd", Q.layers), ("head_fwd", 1), ("head_bwd", 1),
            ("block_bwd", Q.layers), ("embed_bwd", 1), ("optimizer", 1)]


def _sequence(prof: Profile, parts: dict[str, list[KC.Timed]], Q: R.Shape) -> list[tuple[float, float, bool, float]]:
    """(GPU seconds at ``Q``, launch gap, sync, dispatch) of every kernel of one step, in launch order
    (:func:`host_idle`'s input)."""
    return [(t.seconds, k.launch_gap, k.sync, k.dispatch) for name, n in _order(Q) for _ in range(n)
            for t, k in zip(parts[name], getattr(prof, name))]


def host_load(seq: list[tuple[float, float, bool, float]]) -> tuple[float, float, float]:
    """(host floor, GPU busy, step) of one replayed step, s: the host's own launch time (the sum of its
    launch gaps, syncs left out), the GPU's kernel time, and the period of two back-to-back steps
    (the kernels plus the GPU's idle time, :func:`host_idle`)."""
    busy = sum(g for g, _, _, _ in seq)
    return sum(gap for _, gap, _, _ in seq), busy, busy + sum(host_idle(seq))


def host_bound(sc: Scenario) -> dict | None:
    """The host floor of one GPU's step when it sets the step: one micro-batch's forward, backward and
    optimizer at the scenario's sizes on the node's GPU (its tensor-parallel share, translated from the
    profile's GPU), replayed host and GPU. Host-bound when the host's launches take at least the GPU's
    kernel time: the GPU then waits on the host whatever its speed, and a faster GPU cannot shorten the
    step. A step whose GPU idles after synchronisations but runs longer than the host's launches is not:
    the waits follow the GPU's own work, which a faster GPU shortens. None when not host-bound. With
    pipeline stages each GPU runs a share of the layers, host and kernels alike: the whole model's step
    stands for the ratio."""
    assert sc.cluster.node is not None  # the builder checked it
    prof = profile_of(sc)
    Q = target_shape(sc).per_gpu(sc.parallel.tp)
    floor, busy, step = host_load(_sequence(prof, _kernels(prof, Q, sc.cluster.node.gpu, source_gpu(sc, prof)), Q))
    if floor < busy:
        return None
    return {"host_floor_s": floor, "gpu_busy_s": busy, "step_s": step, "profiler_op_s": PI.PROFILER_OP_S,
            "profiler_launch_s": PI.PROFILER_LAUNCH_S}


_COLUMN_OUT = ("qkv", "q", "kv", "ffn", "ffn2")  # outputs of Megatron's column-parallel layers
_ROW_IN = ("q", "ffn", "ffn2")  # inputs of its row-parallel layers


def _tp_comms(parts: dict[str, list], Q: R.Shape, param_bytes: int) -> dict[str, list[Ly.Step]]:
    """The tensor-parallel all-reduces of b·s·h elements Megatron-LM runs (Shoeybi et al. 2019, as in
    emulator/workload/layer.py): forward after each row-parallel GEMM (attention output projection,
    MLP down), and after the vocab-parallel embedding lookup; backward after the input gradient of the
    column-parallel GEMMs (one all-reduce for the QKV side, one for the MLP up side), overlapping the
    weight-gradient GEMM that follows, and after the vocab-parallel head's input gradient."""
    T_h = Q.b * Q.s * Q.h

    def ar(name: str, nbytes: float, cat: str, overlap: int) -> Ly.Comm:
        return Ly.Comm(name, "tp", "all_reduce", T_h * nbytes, overlap=overlap, category=cat)

    def gemm_sides(t: KC.Timed) -> tuple[str, str, str]:
        return t.sides if isinstance(t, Reshaped) else ("", "", "")

    out: dict[str, list[Ly.Step]] = {name: list(ks) for name, ks in parts.items()}
    fwd: list[Ly.Step] = []
    for t in parts["block_fwd"]:
        fwd.append(t)
        if gemm_sides(t)[2] in _ROW_IN:
            fwd.append(ar("tp_allreduce", t.dtype, "fwd", 0))
    out["block_fwd"] = fwd
    bwd: list[Ly.Step] = []
    col = [i for i, t in enumerate(parts["block_bwd"]) if gemm_sides(t)[0] == "T" and gemm_sides(t)[2] in _COLUMN_OUT]
    att = next((i for i, t in enumerate(parts["block_bwd"]) if isinstance(t, Reshaped) and t.attention), -1)
    last = {max((i for i in col if i < att), default=-1), max((i for i in col if i > att), default=-1)} - {-1}
    for i, t in enumerate(parts["block_bwd"]):
        bwd.append(t)
        if i in last:
            bwd.append(ar("tp_allreduce", t.dtype, "bwd", 1))
    out["block_bwd"] = bwd
    out["embed_fwd"] = list(parts["embed_fwd"]) + [ar("tp_allreduce", param_bytes, "fwd", 0)]
    head: list[Ly.Step] = []
    for t in parts["head_bwd"]:
        head.append(t)
        if gemm_sides(t)[0] == "T" and gemm_sides(t)[2] == "V":
            head.append(ar("tp_allreduce", t.dtype, "bwd", 1))
    out["head_bwd"] = head
    return out


def reshape_plan(plan: Plan, sc: Scenario) -> None:
    """Replace ``plan``'s units (made for a generated model) by the profile's parts at the scenario's
    sizes, one tensor-parallel GPU's share of them (``parallel.tp``) with their all-reduces."""
    assert sc.cluster.node is not None  # the builder checked it
    prof = profile_of(sc)
    tp = sc.parallel.tp
    Q = target_shape(sc).per_gpu(tp)
    parts: dict[str, list] = dict(_parts(prof, Q, sc.cluster.node.gpu, source_gpu(sc, prof)))
    if tp > 1:
        parts = _tp_comms(parts, Q, prof.param_bytes)
    emb, head = R.params(prof.embed_params, Q), R.params(prof.head_params, Q)
    block = R.params(prof.block_params, Q)
    par = sc.parallel
    V = par.pp * plan.v
    table = Q.V * Q.h if prof.tied and par.pp > 1 else 0  # the last stage's own copy of a tied table (V/tp)
    for vs in range(V):
        per, first = plan.chunk_layers[vs], sum(plan.chunk_layers[:vs])
        units: list[Unit] = []
        if vs == 0:
            units.append(Unit("embed", -1, list(parts["embed_fwd"]), list(parts["embed_bwd"]), emb))
        units += [Unit(f"layer{i}", i, parts["block_fwd"], parts["block_bwd"], block)
                  for i in range(first, first + per)]
        if vs == V - 1:
            units.append(Unit("head", Q.layers, list(parts["head_fwd"]), list(parts["head_bwd"]), head + table))
        plan.chunk_units[vs] = units
    total = emb + head + Q.layers * block
    opt = sum(t.seconds for t in parts["optimizer"])
    plan.optimizer_s_per_param = opt / total if total else 0.0  # the step scales with the parameters it updates
    plan.dtype = prof.param_bytes
    plan.grad_dtype = grad_bytes(sc, prof)
    plan.model = replace(plan.model, tied_embeddings=prof.tied)


def grad_bytes(sc: Scenario, prof: Profile) -> int:
    """Bytes of a gradient element the data-parallel reduction sends: ``training.grad_reduce`` where
    given (DDP's bf16_compress_hook, fp16_compress_hook: the fp32 gradients reduced in 16 bits), else
    the gradients' own type: fp32 in Megatron-Core's DDP buffer under its distributed optimizers
    (``training.optimizer`` megatron or apex given), else the script's, that of its weights
    (memory.profiled_state_bytes holds them at these sizes)."""
    if sc.training.grad_reduce != "auto":
        return compute.DTYPE_BYTES[sc.training.grad_reduce]
    return 4 if sc.training.optimizer in ("megatron", "apex") else prof.param_bytes


# ---------------------------------------------------------------------------- the translation report


HOST_ASSUMPTION = ("host time (launch gaps, synchronisations) as measured: the host is assumed unchanged; a Grace "
                   "CPU (GB200, GB300) is not the x86 host the profile ran on, and its launch rate was not measured")


def _law_class(k: ProfiledKernel) -> str:
    """The translation law a kernel follows, as the report names it."""
    if k.cls in (GEMM, ATTENTION):
        return k.cls
    if host_copy(k):
        return "host_copies"
    return "launch_bound" if k.seconds <= 2 * R.FIXED_S else "memory_bound"


def _laws(source: GpuSpec, target: GpuSpec) -> dict[str, str]:
    ratio = TR.bandwidth_ratio(source, target)
    bw = f"{source.name} {TR.achieved_bandwidth(source) / 1e9:,.0f} GB/s / {target.name} " \
         f"{TR.achieved_bandwidth(target) / 1e9:,.0f} GB/s achieved HBM"
    fixed = f"{R.FIXED_S * 1e6:.1f} us"
    return {
        "gemm": "measured x the kernel model's time on the target / on the source (devices/compute.py gemm_cost, "
                "the rooflines); never faster than its FLOPs at the target's peak",
        "attention": "measured x the kernel model's time on the target / on the source (devices/compute.py "
                     "attention_cost, the rooflines); never faster than its FLOPs at the target's peak",
        "memory_bound": f"{fixed} as measured + the rest x {ratio:.4f} ({bw})",
        "launch_bound": f"kernels of at most {2 * R.FIXED_S * 1e6:.1f} us: their first {fixed} as measured, "
                        f"the rest x {ratio:.4f}",
        "host_copies": "as measured (copies to and from the host: the host link is assumed unchanged)",
        "host": HOST_ASSUMPTION,
    }


def translation_report(sc: Scenario) -> dict | None:
    """How the profile's kernels were carried to the node's GPU, per law: each class's share of the
    profiled step, its time as measured and on the target (both at the profiled sizes), and the law;
    None when the profile ran on the node's GPU (nothing translated)."""
    prof = profile_of(sc)
    source = source_gpu(sc, prof)
    if source is None:
        return None
    assert sc.cluster.node is not None
    target = sc.cluster.node.gpu
    P = prof.shape
    laws = _laws(source, target)
    sums = {name: [0.0, 0.0] for name in laws}
    capped = 0
    for part in PARTS:
        n = P.layers if part.startswith("block") else 1
        for k in getattr(prof, part):
            r = reshaped(k, P, P, target, 1.0, source)
            row = sums[_law_class(k)]
            row[0] += n * k.seconds
            row[1] += n * r.seconds
            capped += n * r.capped
    step = prof.step_s
    idle = max(0.0, step - prof.kernel_seconds)
    sums["host"] = [idle, idle]
    classes = {name: {"share": m / step if step > 0 else 0.0, "measured_s": m, "translated_s": t, "law": laws[name]}
               for name, (m, t) in sums.items()}
    return {"from": source.name, "device": prof.device, "to": target.name, "profiled_step_s": step,
            "bandwidth_ratio": TR.bandwidth_ratio(source, target), "capped_kernels": capped, "classes": classes}


def kernel_shares(sc: Scenario) -> dict | None:
    """Shares of the profiled step's GPU time in compiled (Inductor) kernels, those of them whose record
    declares their FLOPs or bytes, and kernels with no shapes at all (under no aten op and no Inductor
    record, such as a custom CUDA extension's: scaled by tokens); None when the profile has
    neither compiled nor unscaled kernels."""
    prof = profile_of(sc)
    P = prof.shape
    total = compiled = declared = unscaled = 0.0
    for part in PARTS:
        n = P.layers if part.startswith("block") else 1
        for k in getattr(prof, part):
            total += n * k.seconds
            compiled += n * k.seconds * k.compiled
            declared += n * k.seconds * (k.compiled and bool(k.kernel_flop or k.kernel_bytes))
            unscaled += n * k.seconds * k.unscaled
    if not (compiled or unscaled) or total <= 0:
        return None
    return {"compiled_share": compiled / total, "compiled_declared_share": declared / total,
            "unscaled_share": unscaled / total}
