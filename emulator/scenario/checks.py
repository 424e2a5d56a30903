"""The loader's checks: the cross-key checks of a freshly read scenario, with file positions.

:class:`ScenarioChecks` adds what needs the whole scenario: world = tp·pp·dp·cp against
the cluster's GPUs (deriving dp when it was left out), override targets, NVLS, a mirrored
trace's ranks against the GPUs, a profiled workload's keys, the jobs and their placement;
for a model it applies the rule book (rules.py: :func:`layout_violations`). Each
failure is a ScenarioError that names the file, line and key path.
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Callable

import yaml

from emulator.errors import ScenarioError
from emulator.scenario.allocation import LEAF_FABRICS, AllocationError, Request, allocate
from emulator.scenario.rules import layout_violations, model_violations, schedule_violations
from emulator.scenario.spec import (
    PRECISION_PEAK,
    QUANTISED,
    JobSpec,
    ModelSpec,
    ParallelSpec,
    Scenario,
    TrainingSpec,
    precision_refusal,
)
from emulator.scenario.stages import LAYOUT_KEY, V_SHAPED, parse_layout
from emulator.scenario.yamltree import show

TARGET = re.compile(r"^(gpu|node):(\d+)$")  # an override target that names a GPU or a node
FABRIC_ONLY = {  # fabric keys that only some kinds read
    "spines": ("fat_tree", "rail", "fat_tree3", "multi_plane"),
    "pod_size": ("fat_tree3",),
    "cores": ("fat_tree3",),
    "group_size": ("dragonfly",),
    "global_links": ("dragonfly",),
}
# The fabric kinds that read each fabric key (topology.py, BUILDERS): a key given for another kind
# would be ignored, so the loader refuses it. single_switch reads none (its ports are the NICs').
_SPINES = ("fat_tree", "rail", "fat_tree3", "multi_plane")  # leaf/rail switches joined by spines
_LINKS = (*_SPINES, "dragonfly", "ring", "torus")  # kinds with fabric links of their own
FABRIC_KEY_KINDS: dict[str, tuple[str, ...]] = {
    "oversubscription": _SPINES,
    "leaf_size": (*_SPINES, "dragonfly"),
    "link_bandwidth": _LINKS,
    "latency": _LINKS,
    "torus_dims": ("torus",),
    "graph": ("custom",),
}

SCRIPT_OPTIMIZER = "script"  # training.optimizer of a profiled workload not given: the script's own (AdamW)
# model keys a profile cannot honour: the profiled script's own kernels fix them (what each fixes)
_MLP = "MLP (dense or experts)"
PROFILE_FIXES = {
    "experts": _MLP, "top_k": _MLP, "expert_ffn_hidden": _MLP, "shared_experts": _MLP, "shared_expert_ffn_hidden": _MLP,
    "first_dense_layers": _MLP, "moe_imbalance": _MLP, "moe_expert_load": _MLP, "moe_load_seed": _MLP,
    "moe_load_concentration": _MLP, "swiglu": "MLP activation",
    "activation": "MLP activation", "biases": "biases", "dropout": "dropout", "norm": "norms",
    "q_lora_rank": "attention projections", "kv_lora_rank": "attention projections",
    "qk_nope_head_dim": "attention projections", "qk_rope_head_dim": "attention projections",
    "v_head_dim": "attention projections",
}


# keys whose value the profile records (its GEMMs' precision, attention kernel and mask, a tied head, its
# weights' type, its peak): given, each is checked against the profile once it is read (profiled.check_keys)
PROFILE_RECORDS = ("training.precision", "training.attention", "model.causal", "model.tied_embeddings",
                   "training.optimizer", "workload.profiled.peak_memory")


def shown(v: object) -> str:
    """A key's value as the user wrote it."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, tuple):
        return "[" + ", ".join(map(str, v)) + "]"
    return str(v)


def require_workload(s: Scenario) -> None:
    """For ``emulator run``: a scenario needs a model or a workload.trace."""
    if s.model is None and s.workload.trace is None and not s.jobs:
        raise ScenarioError("a run needs a workload: give a model (model.preset, or layers, hidden, "
                            "heads, seq_len, vocab) or a workload.trace", s.path or "<string>", "model")


def graph_gpus(path: str | None) -> int | None:
    """Best effort: the number of gpu nodes in a custom graph file (None if unknown)."""
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(64 << 20)
        data = json.loads(text) if not path.endswith((".yaml", ".yml")) else yaml.safe_load(text)
        return sum(1 for n in data["nodes"] if isinstance(n, dict) and n.get("kind") == "gpu") or None
    except Exception:  # the topology builder reports a bad graph file
        return None


class ScenarioChecks:
    """The cross-key checks of a freshly read scenario. ``where(key path)`` says where a key (or its
    nearest given parent) is in the file; ``given(key path)`` whether the file gave it."""

    def __init__(self, s: Scenario, where: Callable[[str], str], given: Callable[[str], bool]) -> None:
        self.s = s
        self.where = where
        self.given = given

    def fail(self, kp: str, message: str) -> ScenarioError:
        return ScenarioError(message, self.where(kp), kp)

    def gpus(self) -> int:
        s = self.s
        if s.cluster.fabric.kind == "custom" and not self.given("cluster.nodes"):
            return graph_gpus(s.cluster.fabric.graph) or s.gpus
        return s.gpus

    def run(self) -> Scenario:
        s = self.s
        p = s.parallel
        if s.jobs:
            self.check_no_top_workload(s)
        self.check_one_workload("", s.workload.trace)
        p = self.derive_virtual_stages(p)
        if (p.schedule in V_SHAPED and not p.pipeline_model_parallel_layout
                and not self.given("parallel.virtual_stages")):
            p = dataclasses.replace(p, virtual_stages=2)  # a V: two chunks per rank (scenario/stages.py)
        for v in schedule_violations(p):
            if v.key in ("parallel.virtual_stages", "parallel.schedule", LAYOUT_KEY) and (p.virtual_stages > 1
                                                                               or p.schedule in V_SHAPED):
                raise self.fail(v.key, v.message)
        p = self.derive_pipeline_split(p, s.model)
        p = self.derive_dp(p)
        s = dataclasses.replace(s, parallel=p)
        node = s.cluster.node
        if s.collectives.algorithm == "nvls" and (node is None or not node.nvls_busbw
                                                  or s.cluster.fabric.kind == "custom"):
            raise self.fail("collectives.algorithm", "nvls needs a catalog or inline node with NVLink SHARP "
                                                     "(nvls_busbw, e.g. dgx-h100, dgx-h200)")
        self.check_domain(s)
        self.check_fabric(s)
        self.check_sharp(s)
        self.check_targets(s)
        if s.workload.comm_groups is not None and s.workload.format != "chakra":
            raise self.fail("workload.comm_groups", f"a communicator-group file applies to chakra traces only "
                                                    f'(workload.format is "{s.workload.format}")')
        self.check_timing(s)
        s = self.check_profile(s)
        self.check_mirror(s)
        self.check_live(s)
        if s.model is not None:
            self.check_layout(s.model, s.training, p)
            precision = s.training.precision
            if node is not None and precision in PRECISION_PEAK and node.gpu.peak_at(precision) <= 0:
                raise self.fail("training.precision", precision_refusal(node.gpu, precision))
            if s.training.fp4_param and precision != "nvfp4":  # Megatron-Core transformer_config.py line 1578
                raise self.fail("training.fp4_param", f"NVFP4 weights need training.precision: nvfp4 (it is "
                                                      f"{precision}; Megatron: \"fp4_param must be used together "
                                                      "with fp4 mode\"); remove fp4_param or set the precision")
            if s.training.fp8_params and precision not in ("fp8", "mxfp8"):
                raise self.fail("training.fp8_params", f"fp8 weights need training.precision: fp8 (it is "
                                                       f"{precision}); remove fp8_params or set the precision")
            if s.training.fp8_recipe and precision != "fp8":
                raise self.fail("training.fp8_recipe", f"an fp8 scaling recipe needs training.precision: fp8 (it "
                                                       f"is {precision}); remove fp8_recipe or set the precision")
            if s.training.first_last_layers_bf16 and precision not in QUANTISED:
                raise self.fail("training.first_last_layers_bf16",
                                f"BF16 first and last layers need a quantised training.precision (fp8, mxfp8 or "
                                f"nvfp4; it is {precision}); remove first_last_layers_bf16 or set the precision")
            self.check_hybridep(s, p)
        if s.jobs:
            s = dataclasses.replace(s, jobs=self.check_jobs(s))
        return s

    def check_hybridep(self, s: Scenario, p: ParallelSpec) -> None:
        """HybridEP splits the EP group into NVLink domains of equal rank counts (DeepEP hybrid-ep
        deep_ep/hybrid_ep_buffer.py ``HybridEPBuffer.__init__``: "The number of ranks ... should be divisible
        by the number of ranks per node", its NVLink domain's; one ``num_of_ranks_per_node`` for all). With
        flex dispatch (expert tensor parallelism 1) and Megatron's rank order (TP fastest) an EP group is ep
        consecutive ranks from a multiple of ep, rank r in NVLink domain r // domain (network/domain.py).
        Another ``parallel.order`` is not checked: the plan relays within whatever domains its group has."""
        node = s.cluster.node
        if (p.moe_token_dispatcher_type != "flex" or p.moe_flex_dispatcher_backend != "hybridep" or node is None
                or p.ep <= 1 or p.order not in ((), ("pp", "dp", "cp", "tp"))):
            return
        d, world = node.domain, p.tp * p.pp * p.dp * p.cp
        for first in range(0, world, p.ep):
            counts = {r // d: 0 for r in range(first, first + p.ep)}
            for r in range(first, first + p.ep):
                counts[r // d] += 1
            if len(set(counts.values())) > 1:
                split = " + ".join(str(c) for c in counts.values())
                raise self.fail("parallel.moe_flex_dispatcher_backend",
                                f"hybridep needs each EP group to hold the same number of ranks in each NVLink "
                                f"domain it spans; ranks {first}-{first + p.ep - 1} (ep {p.ep}) split {split} over "
                                f"domains of {d} GPUs (DeepEP hybrid-ep HybridEPBuffer); choose ep dividing the "
                                "domain or a multiple of it, or use deepep")

    def check_domain(self, s: Scenario) -> None:
        """``cluster.node.nvlink_domain``: whole nodes of NVLink-switched GPUs (network/domain.py)."""
        node = s.cluster.node
        if node is None or not node.nvlink_domain or node.nvlink_domain == node.gpus_per_node:
            return
        g, d = node.gpus_per_node, node.nvlink_domain
        if d < g or d % g:
            raise self.fail("cluster.node.nvlink_domain", f"expected a multiple of gpus_per_node ({g}): an NVLink "
                                                          f"domain is made of whole nodes, got {d}")
        if node.intra != "nvswitch":
            raise self.fail("cluster.node.nvlink_domain", f"an NVLink domain of {d} GPUs needs intra: nvswitch "
                                                          f'(intra is "{node.intra}")')

    def check_no_top_workload(self, s: Scenario) -> None:
        """With jobs, the workload keys belong to each job: none at the top level."""
        if s.model is not None or s.workload.trace is not None:
            which = "model" if s.model is not None else "workload.trace"
            raise self.fail(which, "a scenario with jobs gives each job its own model (or workload.trace); "
                                   f"move the top-level {which} into a job")
        for section in ("training", "parallel", "workload"):
            if self.given(section):
                raise self.fail(section, f"a scenario with jobs reads {section} inside each job "
                                         f"(jobs[i].{section}); move the top-level {section} into the jobs")

    def check_one_workload(self, kp: str, trace: str | None) -> None:
        """A model or a workload.trace, not both: the trace would run and the model be dropped. (Given
        by the user: a profiled workload's model comes from its profile, and check_profile speaks.)"""
        if self.given(f"{kp}model") and trace is not None:
            raise self.fail(f"{kp}workload.trace", f"give one or the other: a {kp}model or a {kp}workload.trace "
                                                   "(the trace would run and the model be ignored)")

    def check_jobs(self, s: Scenario) -> tuple[JobSpec, ...]:
        """Each job's workload and layout against its own nodes, then their placement on the cluster."""
        node = s.cluster.node
        if node is None or s.cluster.fabric.kind == "custom":
            raise self.fail("jobs", "jobs need a cluster of nodes (cluster.nodes and cluster.node), "
                                    "not a custom graph")
        names: dict[str, int] = {}
        jobs = []
        for i, job in enumerate(s.jobs):
            kp = f"jobs[{i}]"
            if job.name in names:
                raise self.fail(f"{kp}.name", f"job name {show(job.name)} is also the name of jobs[{names[job.name]}]; "
                                              "names must be unique")
            names[job.name] = i
            jobs.append(self.check_job(kp, job, node.gpus_per_node))
        leaf = s.cluster.fabric.leaf_size if s.cluster.fabric.kind in LEAF_FABRICS else s.cluster.nodes
        requests = [Request(j.name, j.nodes, j.placement, j.node_list, j.seed) for j in jobs]
        try:
            placed = allocate(requests, s.cluster.nodes, leaf)
        except AllocationError as err:
            raise self.fail(f"jobs[{err.index}].{err.key}", err.message) from None
        return tuple(dataclasses.replace(j, nodes_assigned=p) for j, p in zip(jobs, placed))

    def check_job(self, kp: str, job: JobSpec, gpus_per_node: int) -> JobSpec:
        """One job: its node count, a workload, and its layout on nodes x gpus_per_node GPUs."""
        if job.placement == "list":
            if self.given(f"{kp}.nodes") and job.nodes != len(job.node_list):
                raise self.fail(f"{kp}.nodes", f"nodes is {job.nodes} but the placement lists {len(job.node_list)} "
                                               "nodes; give one or the other")
            job = dataclasses.replace(job, nodes=len(job.node_list))
        elif not self.given(f"{kp}.nodes"):
            raise self.fail(f"{kp}.nodes", "this key is required with placement "
                                           f"{job.placement} (how many nodes the job runs on)")
        if self.given(f"{kp}.seed") and job.placement != "random":
            raise self.fail(f"{kp}.seed", f'seed is only read with placement: random (placement is "{job.placement}")')
        self.check_one_workload(f"{kp}.", job.workload.trace)
        if job.workload.profile is not None or job.workload.profiled is not None:
            key = f"{kp}.workload.{'profile' if job.workload.profile is not None else 'profiled'}"
            raise self.fail(key, "a profiled workload runs as a scenario's one workload, not as a job: move "
                                 "workload.profile and workload.profiled to the top level and leave jobs out "
                                 "(a job takes a model or a workload.trace)")
        if job.model is None and job.workload.trace is None:
            raise self.fail(f"{kp}.model", "a job needs a workload: give a model (model.preset, or layers, hidden, "
                                           "heads, seq_len, vocab) or a workload.trace")
        gpus = job.nodes * gpus_per_node
        p = job.parallel
        if not self.given(f"{kp}.parallel.dp"):
            rest = p.tp * p.pp * p.cp
            if gpus % rest and job.model is not None:
                raise self.fail(f"{kp}.parallel", f"tp*pp*cp = {p.tp}*{p.pp}*{p.cp} = {rest} does not divide the "
                                                  f"job's {gpus} GPUs, so dp cannot be derived; change them")
            p = dataclasses.replace(p, dp=max(1, gpus // rest))
        job = dataclasses.replace(job, parallel=p)
        if job.model is None:
            return job
        shape = model_violations(job.model)
        if shape:
            raise self.fail(f"{kp}.{shape[0].key}", shape[0].message)
        world = p.tp * p.pp * p.dp * p.cp
        if world != gpus:
            raise self.fail(f"{kp}.parallel", f"tp*pp*dp*cp = {p.tp}*{p.pp}*{p.dp}*{p.cp} = {world}, but the job "
                                              f"has {gpus} GPUs ({job.nodes} nodes x {gpus_per_node}); they must "
                                              "be equal (leave dp out to derive it)")
        t = job.training
        if not self.given(f"{kp}.training.global_batch") and t.micro_batch * p.dp > 1:
            raise self.fail(f"{kp}.training.global_batch", "this key is required with a model (sequences per "
                                                           f"iteration, a multiple of micro_batch*dp = "
                                                           f"{t.micro_batch * p.dp})")
        broken = layout_violations(job.model, t, p)
        if broken:
            raise self.fail(f"{kp}.{broken[0].key}", broken[0].message)
        return job

    def check_sharp(self, s: Scenario) -> None:
        """In-network reduction needs switches; collnet needs in-network reduction."""
        fabric = s.cluster.fabric
        if fabric.sharp and fabric.kind in ("ring", "torus"):
            raise self.fail("cluster.fabric.sharp", f"in-network reduction needs switches, and a {fabric.kind} "
                                                    "fabric has none: use single_switch, fat_tree, rail or custom")
        if s.collectives.algorithm == "collnet" and not fabric.sharp:
            raise self.fail("collectives.algorithm", "collnet reduces in the switches: set cluster.fabric.sharp: "
                                                     "true (InfiniBand SHARP) or choose another algorithm")

    def derive_pipeline_split(self, p: ParallelSpec, model: ModelSpec | None) -> ParallelSpec:
        """Megatron-Core's account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split as the
        chunk sizes they give (transformer_block.py @ d98e8a64dd, get_num_layers_to_build): (layers + 1 for each)
        split evenly over the pp x virtual_stages chunks, the first chunk one layer fewer for the embedding, the last
        one fewer for the loss. Megatron-Core takes them with neither an uneven first or last stage nor a layout."""
        flags = [name for name in ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split")
                 if getattr(p, name)]
        if not flags or model is None:
            return p
        for other in ("first_chunk_layers", "last_chunk_layers", "pipeline_model_parallel_layout"):
            if getattr(p, other) is not None:
                raise self.fail(f"parallel.{flags[0]}", f"{flags[0]} splits the layers evenly: it does not go with "
                                                        f"parallel.{other} (Megatron-Core refuses the two together)")
        chunks = p.pp * p.virtual_stages
        if chunks < 2:
            return p
        total = model.resolved().layers + len(flags)
        if total % chunks:
            raise self.fail(f"parallel.{flags[0]}", f"the layers with the embedding and loss counted, {total}, must "
                                                    f"split evenly over pp x virtual_stages = {chunks} chunks")
        per = total // chunks
        embed, loss = (int(getattr(p, name)) for name in ("account_for_embedding_in_pipeline_split",
                                                          "account_for_loss_in_pipeline_split"))
        return dataclasses.replace(p, first_chunk_layers=per - embed, last_chunk_layers=per - loss)

    def derive_virtual_stages(self, p: ParallelSpec) -> ParallelSpec:
        """With a pipeline layout, the virtual stages are its stages over pp (Megatron-LM arguments.py:
        ``virtual_pipeline_model_parallel_size = num_stages // pipeline_model_parallel_size``); a
        ``virtual_stages`` given beside it must be that count (transformer_config.py @ d98e8a64dd asserts that
        the two agree)."""
        text = p.pipeline_model_parallel_layout
        if not text:
            return p
        for key in ("first_chunk_layers", "last_chunk_layers"):
            if self.given(f"parallel.{key}"):
                raise self.fail(f"parallel.{key}", f"pipeline_model_parallel_layout places every layer itself: "
                                                   f"remove {key} (Megatron takes the layout or the first/last "
                                                   "split, not both)")
        try:
            stages = len(parse_layout(text))
        except ScenarioError as err:
            raise self.fail(LAYOUT_KEY, err.message) from None
        if p.pp < 1 or stages % p.pp:
            raise self.fail(LAYOUT_KEY, f"pipeline_model_parallel_layout has {stages} stages, which must be pp "
                                        f"({p.pp}) x virtual stages: {stages} is not a multiple of {p.pp}")
        if self.given("parallel.virtual_stages") and p.virtual_stages != stages // p.pp:
            raise self.fail("parallel.virtual_stages", f"virtual_stages ({p.virtual_stages}) conflicts with "
                                                       f"pipeline_model_parallel_layout, whose {stages} stages over "
                                                       f"pp {p.pp} are {stages // p.pp} virtual stages (Megatron-Core "
                                                       f"asserts they agree): give {stages // p.pp}, or leave it out")
        return dataclasses.replace(p, virtual_stages=stages // p.pp)

    def derive_dp(self, p: ParallelSpec) -> ParallelSpec:
        gpus = self.gpus()
        if self.given("parallel.dp") or not gpus:
            return p
        rest = p.tp * p.pp * p.cp
        if gpus % rest == 0:
            return dataclasses.replace(p, dp=gpus // rest)
        if self.s.model is not None:
            raise self.fail("parallel", f"tp*pp*cp = {p.tp}*{p.pp}*{p.cp} = {rest} does not divide "
                                        f"the {gpus} GPUs, so dp cannot be derived; change them")
        return p

    def check_fabric(self, s: Scenario) -> None:
        """Keys of one fabric kind given with another, and the dragonfly's global links."""
        f, kp = s.cluster.fabric, "cluster.fabric"
        for key, kinds in FABRIC_ONLY.items():
            if self.given(f"{kp}.{key}") and f.kind not in kinds:
                raise self.fail(f"{kp}.{key}", f"{key} is only read with kind: {' | '.join(kinds)} "
                                               f'(kind is "{f.kind}")')
        if self.given(f"{kp}.seed") and f.routing != "ecmp_hash":
            raise self.fail(f"{kp}.seed", f'seed is only read with routing: ecmp_hash (routing is "{f.routing}")')
        if f.kind == "dragonfly" and f.global_links > f.group_size:
            raise self.fail(f"{kp}.global_links", f"global_links ({f.global_links}) must be at most group_size "
                                                  f"({f.group_size}): each router holds one link to a group")

    def check_timing(self, s: Scenario) -> None:
        """``at``/``until`` only on link faults, until after at, no timed extra latency."""
        for i, o in enumerate(s.cluster.overrides):
            kp = f"cluster.overrides[{i}]"
            timed = o.at is not None or o.until is not None
            if timed and o.kind not in ("link_degrade", "link_fail"):
                key = "at" if o.at is not None else "until"
                raise self.fail(f"{kp}.{key}", f"{key} is only read with kind: link_degrade | link_fail (a link "
                                               f'that fails or degrades in the middle of a run; kind is "{o.kind}")')
            if o.until is not None and o.until <= (o.at or 0.0):
                raise self.fail(f"{kp}.until", f"until ({o.until:g} s) must be after at ({o.at or 0.0:g} s)")
            if timed and o.extra_latency:
                raise self.fail(f"{kp}.extra_latency", "extra_latency cannot be timed (a flow's latency is paid "
                                                       "when it starts); give it without at/until, or use factor")

    def check_targets(self, s: Scenario) -> None:
        gpus, nodes = s.gpus, (s.cluster.nodes if s.cluster.node is not None else 0)
        for i, o in enumerate(s.cluster.overrides):
            kp = f"cluster.overrides[{i}].target"
            m = TARGET.match(o.target)
            link = "->" in o.target or not m
            allowed = {"gpu_slowdown": ("gpu", "node"), "node_fail": ("node",)}.get(o.kind)
            kind = "link" if link else (m.group(1) if m else None)
            if allowed is not None and kind not in allowed:  # links are checked on the topology
                forms = {"gpu": '"gpu:N"', "node": '"node:N"', "link": '"src->dst"'}
                raise self.fail(kp, f"expected {' or '.join(forms[a] for a in allowed)} for {o.kind}, "
                                    f"got {show(o.target)}")
            if m and kind == "gpu" and gpus and int(m.group(2)) >= gpus:
                raise self.fail(kp, f"there is no gpu {m.group(2)}: the cluster has GPUs 0 to {gpus - 1}")
            if m and kind == "node" and nodes and int(m.group(2)) >= nodes:
                raise self.fail(kp, f"there is no node {m.group(2)}: the cluster has nodes 0 to {nodes - 1}")
            if o.kind == "node_fail":  # faults.py refuses it too; here it is named with its file and line
                raise self.fail(f"cluster.overrides[{i}]", f"{o.target} has failed and a job cannot run on a failed "
                                                           "node; reduce cluster.nodes (and the parallel layout) "
                                                           "to leave it out")

    def check_live(self, s: Scenario) -> None:
        """The skew model's parameters are read only with ``live.skew: model``."""
        if s.live.skew == "model":
            return
        for key in ("skew_base", "skew_slope"):
            if self.given(f"live.{key}"):
                raise self.fail(f"live.{key}", f"{key} is only read with live.skew: model (live.skew is "
                                               f'"{s.live.skew}"); set live.skew: model, or leave {key} out')

    def check_profile(self, s: Scenario) -> Scenario:
        """A profiled workload (``workload.profile``): what a one-GPU profile can be predicted at, and
        by default the batch it ran (the profiled micro-batch, one per data-parallel rank and step)."""
        w = s.workload
        if w.profile is None:
            if w.profiled is not None:
                raise self.fail("workload.profiled", "profiled describes a workload.profile; give the profile, "
                                                     "or leave profiled out")
            return s
        if w.trace is not None:
            raise self.fail("workload.profile", "give workload.profile (predict your script from its profile) or "
                                                "workload.trace (replay a trace as it ran), not both")
        if w.profiled is None:
            raise self.fail("workload.profile", "a profile needs workload.profiled: {micro_batch, seq_len, layers, "
                                                "hidden, heads, vocab}, what the profiled step ran")
        if w.mirror:
            raise self.fail("workload.mirror", "mirror replays a trace; a profile runs data-parallel by parallel.dp")
        for key in ("format", "comm_groups"):
            if self.given(f"workload.{key}"):
                raise self.fail(f"workload.{key}", f"workload.{key} is {getattr(w, key)!r}: it reads a "
                                                   "workload.trace; a workload.profile is always a PyTorch profiler "
                                                   f"(Kineto) trace: leave workload.{key} out")
        for key in PROFILE_FIXES:
            if self.given(f"model.{key}"):
                value = getattr(s.model, key, None) if s.model is not None else None
                raise self.fail(f"model.{key}", f"model.{key} is {shown(value)}, but the profiled script fixes "
                                                f"its {PROFILE_FIXES[key]}: its own kernels, in the trace, are "
                                                f"what runs; leave model.{key} out (or profile a script with it)")
        if self.given("training.fp8_params"):
            fp8 = shown(s.training.fp8_params)
            raise self.fail("training.fp8_params", f"training.fp8_params is {fp8}, but the profiled "
                                                   "script fixes its weights' type (the trace's parameters); "
                                                   "leave training.fp8_params out")
        p, t = s.parallel, s.training
        for key, value in (("cp", p.cp), ("ep", p.ep)):
            if value > 1:
                raise self.fail(f"parallel.{key}", f"{key} = {value}: a one-GPU profile does not say how the "
                                                   "script's attention or experts would split over GPUs; "
                                                   "profiled workloads run dp, zero (1-3, FSDP), pp and tp")
        if p.sequence_parallel:
            raise self.fail("parallel.sequence_parallel", "sequence parallelism is not derived from a profile: "
                                                          "which of the script's element-wise kernels run on "
                                                          "sequence shards is not in it (tp alone is)")
        if t.recompute != "none":
            raise self.fail("training.recompute", "the profile already holds whatever the script recomputes; "
                                                  "training.recompute applies to generated workloads")
        mb = t.micro_batch if self.given("training.micro_batch") else w.profiled.micro_batch
        gb = t.global_batch if self.given("training.global_batch") else mb * p.dp
        # absent, the optimizer is the profiled script's own (memory.profiled_state_bytes)
        opt = t.optimizer if self.given("training.optimizer") else SCRIPT_OPTIMIZER
        # the keys the profile itself records, checked against it when it is read (workload/profiled.py
        # ``check_keys``), and workload.profile itself (``check_gpu``): where the file gave each, for the message
        given = tuple((kp, self.where(kp)) for kp in PROFILE_RECORDS + ("workload.profile",) if self.given(kp))
        return dataclasses.replace(s, training=dataclasses.replace(t, micro_batch=mb, global_batch=gb, optimizer=opt),
                                   given=given)

    def check_mirror(self, s: Scenario) -> None:
        """A mirrored trace replays one rank as ``mirror`` ranks: at most one per GPU (checked here,
        before the importer builds them all)."""
        gpus = self.gpus()
        if s.workload.mirror and gpus and s.workload.mirror > gpus:
            raise self.fail("workload.mirror", f"mirror {s.workload.mirror} replays the trace as "
                                               f"{s.workload.mirror} ranks, but the cluster has {gpus} GPUs; "
                                               f"expected at most {gpus}")

    def check_layout(self, m: ModelSpec, t: TrainingSpec, p: ParallelSpec) -> None:
        """The model's shape, the world size against the cluster, the batch being given, then the rule book."""
        shape = model_violations(m)
        if shape:
            raise self.fail(shape[0].key, shape[0].message)
        gpus = self.gpus()
        world = p.tp * p.pp * p.dp * p.cp
        if gpus and world != gpus:
            c = self.s.cluster
            nodes = f" ({c.nodes} nodes x {c.node.gpus_per_node})" if c.node else ""
            raise self.fail("parallel.dp" if self.given("parallel.dp") else "parallel",
                            f"tp*pp*dp*cp = {p.tp}*{p.pp}*{p.dp}*{p.cp} = {world}, but the cluster has "
                            f"{gpus} GPUs{nodes}; they must be equal (leave dp out to derive it)")
        per_step = t.micro_batch * p.dp
        if not self.given("training.global_batch") and per_step > 1 and self.s.workload.profile is None:
            raise self.fail("training.global_batch", f"this key is required with a model (sequences per "
                                                     f"iteration, a multiple of micro_batch*dp = {per_step})")
        broken = layout_violations(m, t, p)
        if broken:
            raise self.fail(broken[0].key, broken[0].message)
