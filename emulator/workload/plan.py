"""The build plan: everything about a scenario's workload that does not depend on the rank —
the validated model (with Megatron's padded vocabulary), the micro-batches per pipeline,
each virtual stage's units (embedding, its layers as split by emulator/scenario/stages.py, head) with
their per-layer steps from :mod:`.layer`, the element sizes of activations and of the
gradient reduction, and the rank grid for folding.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from emulator.devices.compute import precision_peak
from emulator.errors import ScenarioError
from emulator.scenario.rules import layout_violations
from emulator.scenario.spec import GpuSpec, ModelSpec, ParallelSpec, Scenario, TrainingSpec
from emulator.scenario.stages import V_SHAPED, ChunkPlan, model_chunks, rank_of
from emulator.workload import hybrid
from emulator.workload import layer as Ly
from emulator.workload import models as M
from emulator.workload import mtp as MTP
from emulator.workload.placement import Layout
from emulator.workload.recompute import backward_with_modules
from emulator.workload.schedules import check_schedule

# tf32: fp32 storage, TF32 matmuls; 1: a quantised precision (its GEMMs' operands; layer.py's recipes)
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "tf32": 4, "fp8": 1, "mxfp8": 1, "nvfp4": 1}
ADAM_FLOPS_PER_PARAM = 12.0


@dataclass
class Unit:
    """One piece of a model chunk with its own parameters: the embedding, a layer, the head."""

    name: str
    layer: int  # global layer index; -1 embedding, layers for the head
    fwd: list  # Ly.Step
    bwd: list
    params: float  # parameters on this GPU (dense)
    expert_params: float = 0.0


@dataclass
class Plan:
    """Everything about a scenario that does not depend on the rank."""

    sc: Scenario
    layout: Layout
    model: ModelSpec
    micro: int
    v: int
    chunk_units: dict = field(default_factory=dict)  # virtual stage → list[Unit]
    chunk_layers: tuple = ()  # layers of each virtual stage (stages.py)
    chunks: ChunkPlan | None = None  # what each virtual stage holds, the MTP layers' too (stages.py)
    dtype: int = 2
    flash: bool = False
    grad_dtype: int = 2  # bytes per gradient element in the data-parallel reduction
    optimizer_s_per_param: float | None = None  # a profiled optimizer step's seconds per parameter (profiled.py)
    v_shape: bool = False  # chunks placed in a V (zb-v, dualpipev, dualpipe: scenario/stages.py rank_of)
    dual: bool = False  # dualpipe: virtual stage vs holds model stage vs mod pp (two directions, two copies)
    step: int = 0  # the training step whose drawn MoE loads the units carry (model.moe_load_seed)
    param_q: float = 0.0  # bytes a quantised GEMM weight moves in the parameter all-gather (fp8_params); 0: none
    host_bound: bool | None = None  # whether the host's issuing is emitted (builder.py, host.py); None: not decided

    def gathered(self, u: Unit) -> tuple[float, float]:
        """(dense, expert) bytes of unit ``u``'s parameters in the data-parallel parameter all-gather: at
        ``dtype``, but with ``training.fp8_params`` a layer's GEMM weights at ``param_q`` (Megatron keeps
        quantised parameters in a uint8 buffer and gathers that: distributed/param_and_grad_buffer.py
        group_params_for_buffers @ d98e8a64dd); its norms, biases and router, the embedding, the head and
        the BF16 layers of first_last_layers_bf16 stay at ``dtype``."""
        dense, expert = u.params * self.dtype, u.expert_params * self.dtype
        m = self.model
        if not self.param_q or u.layer < 0 or u.layer == m.layers or \
                (u.layer < m.layers and bf16_layer(self.sc.training, m.layers, u.layer)):
            return dense, expert
        lin = self._linear(u.layer)  # an MTP module's layer: the last layer's kind, or its depth's (layer_parts)
        return dense - lin * (self.dtype - self.param_q), u.expert_params * self.param_q

    def _linear(self, layer: int) -> float:
        """GEMM weights on one GPU of layer ``layer``'s part every expert-parallel rank holds (attention, the
        dense MLP or the shared experts)."""
        m, t = self.model, self.sc.parallel.tp
        return sum(M.part_linear(m, part, layer) for part in M.layer_parts(m, layer)) / t

    def model_stage(self, vs: int) -> int:
        """The model chunk (of ``chunk_layers``) that virtual stage ``vs`` runs: itself, or with dualpipe
        vs mod pp (virtual stages 0 … pp − 1 carry the forward direction, pp … 2·pp − 1 the reverse)."""
        return vs % len(self.chunk_layers) if self.dual else vs

    def starts(self, vs: int) -> bool:
        """Whether ``vs`` is where a micro-batch enters (no activations come in)."""
        return self.model_stage(vs) == 0

    def ends(self, vs: int) -> bool:
        """Whether ``vs`` is where a micro-batch's forward ends (the loss; no gradient comes in)."""
        return self.model_stage(vs) == len(self.chunk_layers) - 1


def _check(sc: Scenario) -> ModelSpec:
    """What a model workload needs beyond the rule book (a model, a GPU type, a known precision)."""
    if sc.model is None:
        raise ScenarioError("a workload needs a model (or workload.trace)", key="model")
    if sc.cluster.node is None:
        raise ScenarioError("the model workload needs a node type with a gpu", key="cluster.node")
    tr = sc.training
    if tr.precision not in DTYPE_BYTES:
        raise ScenarioError(f"expected one of {', '.join(DTYPE_BYTES)}, got {tr.precision!r}", key="training.precision")
    precision_peak(sc.cluster.node.gpu, tr.precision)  # refuses a precision the GPU has no rate for
    if tr.recompute not in ("none", "selective", "full"):
        raise ScenarioError(f"expected none, selective or full, got {tr.recompute!r}", key="training.recompute")
    if sc.simulation.detail not in ("layer", "op"):
        raise ScenarioError(f"expected layer or op, got {sc.simulation.detail!r}", key="simulation.detail")
    broken = layout_violations(sc.model, tr, sc.parallel)
    if broken:
        raise broken[0].error()
    node = sc.cluster.node
    if (tr.fine_grained_activation_offloading or tr.cpu_offloading) and not node.host_bandwidth:
        what = "fine_grained_activation_offloading" if tr.fine_grained_activation_offloading else "cpu_offloading"
        raise ScenarioError(f"{what} copies activations to the host, but node "
                            f"{node.name} gives no host_bandwidth: set it to the GPU's measured copy rate "
                            f"(nvbandwidth host_to_device), e.g. \"55 GB/s\" over PCIe Gen5 x16",
                            key="cluster.node.host_bandwidth")
    return sc.model


def _units_of(plan: Plan, vs: int, L: Ly.LayerShape) -> list[Unit]:
    """The units of virtual stage ``vs``: [embedding], its layers, [head]. An MoE model's
    ``first_dense_layers`` get the dense layer's steps and hold no experts."""
    sc, m = plan.sc, plan.model
    par = sc.parallel
    k = plan.model_stage(vs)
    per, first = plan.chunk_layers[k], sum(plan.chunk_layers[:k])
    t = par.tp
    units: list[Unit] = []
    learned_pos = M.learned_positions(m)
    if k == 0:
        p = m.vocab * m.hidden / t + (m.seq_len * m.hidden if learned_pos else 0)
        units.append(Unit("embed", -1, Ly.embedding_forward(L, learned_pos), Ly.embedding_backward(L), p))
    if hybrid.is_hybrid(m):
        units += _hybrid_units(plan, L, first, per)
        if plan.chunks is not None and plan.chunks.mtp_chunk == k:  # MTP modules around a layer of their depth
            i = m.layers + 1  # an MTP module's index (models.layer_parts)
            Lm = Ly.part_shape(L, M.layer_parts(m, i))
            fwd = Ly.forward_steps(Lm)
            bwd = layer_backward(Lm, sc.training.recompute, sc.training.recompute_modules)
            expert = M.routed_params(m) / ((par.etp or t) * par.ep) if M.is_moe_layer(m, i) else 0.0
            units += _mtp_units(plan, Lm, fwd, bwd, M.shared_layer_params(m, i) / t, expert, learned_pos, vs,
                                _LayerSteps(plan, Lm))
        return units + _head_unit(plan, L, k)
    fwd = Ly.forward_steps(L)
    bwd = layer_backward(L, sc.training.recompute, sc.training.recompute_modules)
    plain: tuple[list, list] | None = None  # a BF16 layer of a quantised run (first_last_layers_bf16)
    if L.fp8 and sc.training.first_last_layers_bf16:
        Lb = Ly.unquantised(L)
        plain = (Ly.forward_steps(Lb), layer_backward(Lb, sc.training.recompute, sc.training.recompute_modules))
    dense = M.dense_layer_params(m, bool(m.experts)) / t
    expert = M.routed_params(m) / ((par.etp or t) * par.ep) if m.experts else 0.0  # etp: the experts' TP
    lead: tuple[list, list, float] | None = None  # a dense leading layer of an MoE model
    if m.experts and first < m.first_dense_layers:
        Ld = Ly.dense_shape(L)
        lead = (Ly.forward_steps(Ld), layer_backward(Ld, sc.training.recompute, sc.training.recompute_modules),
                M.dense_layer_params(m, False) / t)
    own = _LayerSteps(plan, L)  # MoE layers with loads of their own (models.loads_vary), layers' own attention
    for i in range(first, first + per):
        bf16 = plain is not None and bf16_layer(sc.training, m.layers, i)
        if M.layers_differ(m):  # each layer its own attention (a ratio, DSA's top-k sharing) and load
            moe = M.is_moe_layer(m, i)
            units.append(Unit(f"layer{i}", i, *own.of(i, bf16, not moe), M.shared_layer_params(m, i) / t,
                              expert if moe else 0.0))
        elif M.loads_vary(m) and M.is_moe_layer(m, i):
            units.append(Unit(f"layer{i}", i, *own.of(i, bf16), dense, expert))
        elif lead is not None and not M.is_moe_layer(m, i):
            if bf16:
                Lbd = Ly.unquantised(Ly.dense_shape(L))
                units.append(Unit(f"layer{i}", i, Ly.forward_steps(Lbd),
                                  layer_backward(Lbd, sc.training.recompute, sc.training.recompute_modules),
                                  lead[2], 0.0))
            else:
                units.append(Unit(f"layer{i}", i, lead[0], lead[1], lead[2], 0.0))
        elif bf16 and plain is not None:
            units.append(Unit(f"layer{i}", i, plain[0], plain[1], dense, expert))
        else:
            units.append(Unit(f"layer{i}", i, fwd, bwd, dense, expert))
    chunks = plan.chunks
    if chunks is not None and chunks.mtp_chunk == k:
        units += _mtp_units(plan, L, fwd, bwd, dense, expert, learned_pos, vs, own)
    return units + _head_unit(plan, L, k)


def _hybrid_units(plan: Plan, L: Ly.LayerShape, first: int, per: int) -> list[Unit]:
    """Layers ``first`` … ``first + per − 1`` of a hybrid model (workload/hybrid.py), each its pattern's part
    (Ly.part_shape), an E layer with its own load where the loads differ by layer; steps built once per
    distinct (part, load, BF16)."""
    sc, m = plan.sc, plan.model
    tr, par = sc.training, sc.parallel
    expert = M.routed_params(m) / ((par.etp or par.tp) * par.ep) if m.experts else 0.0
    built: dict[tuple[str, float, bool], tuple[list, list]] = {}
    units: list[Unit] = []
    for i in range(first, first + per):
        part = M.layer_parts(m, i)
        Li = Ly.layer_load_shape(Ly.part_shape(L, part), m, i, plan.step)
        bf16 = L.fp8 and tr.first_last_layers_bf16 and bf16_layer(tr, m.layers, i)
        key = (part, Li.load, bf16)
        if key not in built:
            Lb = Ly.unquantised(Li) if bf16 else Li
            built[key] = (Ly.forward_steps(Lb), layer_backward(Lb, tr.recompute, tr.recompute_modules))
        units.append(Unit(f"layer{i}", i, *built[key], M.shared_layer_params(m, i) / par.tp,
                          expert if part == hybrid.MOE else 0.0))
    return units


def _head_unit(plan: Plan, L: Ly.LayerShape, k: int) -> list[Unit]:
    """The LM head of the last model chunk (with its passes over the MTP modules' hidden states); [] elsewhere."""
    sc, m = plan.sc, plan.model
    par = sc.parallel
    t = par.tp
    V = len(plan.chunk_layers)  # model chunks (pp·v; pp with dualpipe, whose 2·pp chunks hold two copies)
    units: list[Unit] = []
    if k == V - 1:
        # its final norm, and its output layer's weight over TP: its own (untied), or a copy of a tied word
        # embedding where the head is on another rank than the embedding's (not pp 1, a V, or DualPipe's, each end
        # rank holding an embedding and a head)
        apart = not plan.dual and rank_of(V - 1, par.pp, plan.v_shape) != 0
        p = M.head_params(m) + (m.vocab * m.hidden / t if (m.tied_embeddings and apart) else 0)
        if not m.tied_embeddings:
            p -= m.vocab * m.hidden * (1 - 1 / t)
        mtp = m.mtp_num_layers
        hf, hb = Ly.head_forward(L, m.vocab), Ly.head_backward(L, m.vocab)
        if mtp:  # the output head's passes over the MTP modules' hidden states (mtp.py)
            hf, hb = hf + MTP.mtp_head_forward(L, m.vocab, mtp), MTP.mtp_head_backward(L, m.vocab, mtp) + hb
        units.append(Unit("head", m.layers, hf, hb, p))
    return units


class _LayerSteps:
    """The forward and backward steps of MoE layers whose loads differ by layer (a row of moe_expert_load
    each, or drawn from moe_load_seed at the plan's step), and of a model whose layers' attention differs
    (models.layers_differ: a ratio, DSA's top-k sharing; ``dense``: a dense one), built once per distinct (load,
    ratio, sharing, BF16, dense)."""

    def __init__(self, plan: Plan, L: Ly.LayerShape) -> None:  # noqa: D107
        self.plan, self.L = plan, L
        self.built: dict[tuple[float, int, bool, bool, bool], tuple[list, list]] = {}

    def of(self, layer: int, bf16: bool = False, dense: bool = False) -> tuple[list, list]:
        tr, m = self.plan.sc.training, self.plan.model
        Li = Ly.attention_shape(Ly.dense_shape(self.L) if dense else Ly.layer_load_shape(self.L, m, layer,
                                                                                         self.plan.step), m, layer)
        key = (Li.load, Li.csa, Li.dsa_skip, bf16, dense)
        if key not in self.built:
            Lb = Ly.unquantised(Li) if bf16 else Li
            self.built[key] = (Ly.forward_steps(Lb), layer_backward(Lb, tr.recompute, tr.recompute_modules))
        return self.built[key]


def _mtp_units(plan: Plan, L: Ly.LayerShape, fwd: list, bwd: list, dense: float, expert: float,
               learned_pos: bool, vs: int, own: _LayerSteps) -> list[Unit]:
    """The MTP modules of virtual stage ``vs``: each one more (MoE) layer with eh_proj and its norms, and
    a copy of the word embedding when the stage is not the embedding's (Megatron's GPTModel builds an
    embedding where ``pre_process or mtp_process``; its gradient is all-reduced with the first stage's).
    An MTP module's MoE layer has its own load where the layers' loads differ (index layers + 1 + d)."""
    m, t = plan.model, plan.sc.parallel.tp
    # the MTP layer is the decoder's last layer's kind, or a hybrid model's MTP depth's (``L`` is its layer already)
    moe = M.is_moe_layer(m, m.layers + 1)
    if not moe and not hybrid.is_hybrid(m):
        L = Ly.dense_shape(L)
        fwd = Ly.forward_steps(L)
        bwd = layer_backward(L, plan.sc.training.recompute, plan.sc.training.recompute_modules)
        dense, expert = M.dense_layer_params(m, False) / t, 0.0
    norm = MTP.mtp_extra_params(m) - 2 * m.hidden * m.hidden
    copy = not plan.dual and rank_of(vs, plan.sc.parallel.pp, plan.v_shape) != 0  # not on an embedding's rank
    params = dense + 2 * m.hidden * m.hidden / t + norm
    each = moe and (M.loads_vary(m) or M.layers_differ(m))
    f, b = MTP.mtp_forward(L, fwd, learned_pos), MTP.mtp_backward(L, bwd)
    units = []
    for d in range(m.mtp_num_layers):
        i = m.layers + 1 + d
        if each:
            fi, bi = own.of(i)
            f, b = MTP.mtp_forward(L, fi, learned_pos), MTP.mtp_backward(L, bi)
        # one embedding copy for the stage's modules; with mtp_use_repeated_layer one module's weights for all
        mine = d == 0 or not m.mtp_use_repeated_layer
        embedding = m.vocab * m.hidden / t if copy and d == 0 else 0.0
        units.append(Unit(f"mtp{d}", i, f, b, (params if mine else 0.0) + embedding, expert if mine else 0.0))
    return units


def layer_backward(L: Ly.LayerShape, recompute: str, modules: tuple[str, ...] | None) -> list:
    """A layer's backward: with recompute_modules (under selective) per module (recompute.py), else
    layer.backward_steps."""
    if recompute == "selective" and modules is not None:
        return backward_with_modules(L, modules)
    return Ly.backward_steps(L, recompute)


def grad_reduce_bytes(precision: str, grad_reduce: str) -> int:
    """Bytes per gradient element reduced across data-parallel ranks. ``auto`` follows
    Megatron-LM: bf16 training accumulates and all-reduces its gradients in fp32
    (arguments.py forces accumulate_allreduce_grads_in_fp32 with --bf16), and so does fp8
    training, which runs with --bf16 (FP8 only in the GEMMs); fp16 and fp32 reduce in
    their own type."""
    if grad_reduce == "auto":  # fp8 training keeps bf16 weights and fp32 main gradients (Transformer Engine)
        return 4 if precision in ("bf16", "fp8", "mxfp8", "nvfp4") else DTYPE_BYTES[precision]
    return DTYPE_BYTES[grad_reduce]


def non_tn_fp8(gpu: GpuSpec) -> bool:
    """Whether the GPU runs FP8 GEMMs of every operand layout, so Transformer Engine's per-tensor FP8 makes
    no transposes: sm_100 and later (transformer_engine/common/transformer_engine.cpp @ d0067d0,
    ``nvte_is_non_tn_fp8_gemm_supported``: compute capability 10.x, and 13.0 on; Hopper takes only TN),
    which in the catalog are the GPUs with block-scaled tensor cores (a ``peak_flops_fp4``)."""
    return gpu.peak_flops_fp4 > 0


def param_gather_bytes(tr: TrainingSpec) -> float:
    """Bytes a GEMM weight element moves in the parameter all-gather when it is quantised (Plan.gathered; 0: not):
    1 with ``fp8_params`` (Megatron's --fp8-param-gather); with ``fp4_param`` (--fp4-param-gather) NVFP4's
    row-wise values and their 16×16-block scales, 1/2 + 1/256 (ASSUMPTION: the column-wise copy is made after
    the gather, TE's manual_post_all_gather_processing, as Megatron-Core's fp4_utils.py asks for it)."""
    if tr.fp8_params and tr.precision in ("fp8", "mxfp8"):
        return 1.0
    if tr.fp4_param and tr.precision == "nvfp4":
        return Ly.NVFP4_WEIGHT_COPY
    return 0.0


def bf16_layer(tr: TrainingSpec, layers: int, i: int) -> bool:
    """Whether global layer ``i`` runs in BF16 in a quantised run: Megatron-LM's is_first_last_bf16_layer
    (megatron/core/fp8_utils.py @ d98e8a64dd): the first ``num_layers_at_start_in_bf16`` and the last
    ``num_layers_at_end_in_bf16`` with ``first_last_layers_bf16``."""
    if not tr.first_last_layers_bf16:
        return False
    return i < tr.num_layers_at_start_in_bf16 or i >= layers - tr.num_layers_at_end_in_bf16


def make_plan(sc: Scenario, step: int = 0) -> Plan:
    """Validate ``sc`` and precompute its per-chunk units (``step``: whose drawn MoE loads they carry)."""
    model = _check(sc)
    par, tr = sc.parallel, sc.training
    layout = Layout.from_parallel(par, sc.gpus, par.order or None)
    micro = tr.global_batch // (tr.micro_batch * par.dp)
    check_schedule(par.schedule, par.pp, micro, par.virtual_stages)
    m = replace(M.resolve(model), vocab=M.padded_vocab(M.resolve(model).vocab, par.tp))
    dtype = DTYPE_BYTES[tr.precision]
    flash = getattr(tr, "attention", "unfused") in ("flash", "fa2")
    assert sc.cluster.node is not None  # _check: a model workload has a node type
    gpu = sc.cluster.node.gpu
    L = Ly.layer_shape(m, tr.micro_batch, par.tp, par.sequence_parallel, par.cp, par.ep, dtype, flash,
                       micro_batches=micro, fp8_params=tr.fp8_params or tr.fp4_param, fa2=tr.attention == "fa2",
                       etp=par.etp,
                       recipe=Ly.recipe_of(tr.precision, tr.fp8_recipe), non_tn=non_tn_fp8(gpu),
                       parallel=par, sm_count=gpu.sm_count, fp8_dpa=tr.fp8_dot_product_attention,
                       fp8_head=tr.fp8_output_proj)
    # fp8 (Transformer Engine): GEMM operands in FP8, the activations that move in BF16, the weights too but with
    # fp8_params (Plan.gathered)
    chunks = chunk_plan(m, par)
    dual = par.schedule == "dualpipe"  # two copies of the pp stages, one a direction, placed as a V
    plan = Plan(sc, layout, m, micro, 2 if dual else par.virtual_stages, dtype=2 if dtype == 1 else dtype,
                flash=flash or par.cp > 1, grad_dtype=grad_reduce_bytes(tr.precision, tr.grad_reduce),
                chunk_layers=chunks.layers, chunks=chunks, v_shape=par.schedule in V_SHAPED or dual, dual=dual,
                step=step, param_q=param_gather_bytes(tr))
    for vs in range(par.pp * plan.v):
        plan.chunk_units[vs] = _block_recompute(plan, vs, _units_of(plan, vs, L))
    return plan


def _block_recompute(plan: Plan, vs: int, units: list[Unit]) -> list[Unit]:
    """``units`` of virtual stage ``vs`` under Megatron-Core's block recompute (training.recompute full with
    recompute_method block): only the chunk's first recompute_num_layers layers rerun their forward before their
    backward (recompute.py @ d98e8a64dd, _checkpointed_forward); the others, and the MTP modules (multi_token_
    prediction.py: "block is not supported for MTP yet. Skipping recompute."), drop their RECOMPUTE steps."""
    tr = plan.sc.training
    if tr.recompute != "full" or tr.recompute_method != "block":
        return units
    k = plan.model_stage(vs)
    first = sum(plan.chunk_layers[:k])
    stripped: dict[int, list] = {}  # a unit's backward steps are shared between layers: strip each list once
    out: list[Unit] = []
    for u in units:
        if u.name.startswith("layer") and u.layer < first + tr.recompute_num_layers:
            out.append(u)
            continue
        if id(u.bwd) not in stripped:
            stripped[id(u.bwd)] = [st for st in u.bwd if st.category != Ly.RECOMPUTE]
        out.append(replace(u, bwd=stripped[id(u.bwd)]))
    return out


def chunk_plan(m: ModelSpec, par: ParallelSpec) -> ChunkPlan:
    """What each virtual stage holds (scenario/stages.py): from the layout, or the first/last split."""
    return model_chunks(m.layers, par.pp, par.virtual_stages, par.first_chunk_layers, par.last_chunk_layers,
                        par.pipeline_model_parallel_layout, m.mtp_num_layers)


def fold_grid(sc: Scenario) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The rank grid in placement order (slowest axis first) and the axis names."""
    layout = Layout.from_parallel(sc.parallel, sc.gpus, sc.parallel.order or None)
    return layout.shape, layout.order
