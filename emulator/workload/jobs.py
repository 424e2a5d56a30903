"""Jobs: the Programs of several jobs, placed on their nodes of one cluster and merged.

A multi-job scenario (``jobs:``) runs each job's own Program (built for a cluster of
the job's size) on the nodes the loader allocated to it (``JobSpec.nodes_assigned``,
emulator/scenario/allocation.py). Job rank r runs on cluster GPU

    nodes_assigned[r // gpus_per_node] · gpus_per_node + r mod gpus_per_node,

so a job keeps its layout (TP inside a node, the rest across its nodes) wherever its
nodes are. Every rank, group, peer and root of its ops is renumbered that way and its
op ids are shifted by a per-job base, so the jobs' ops can share one Program and one
engine (one fabric) without meeting anywhere but on the links.

A job that starts at an offset gets one fixed-duration op per rank on the ``cpu``
stream ("waiting for job start"), which every first op of its streams depends on; the
metrics do not count that lane as GPU work (emulator/outputs/metrics.py).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from emulator.program import COMPUTE, Fold, Op, Part, Program
from emulator.scenario.spec import ClusterSpec, JobSpec, Scenario

START_STREAM = "cpu"  # the lane of the start-offset op: not GPU work for the metrics
START_NAME = "waiting for job start"


@dataclass(frozen=True)
class PlacedJob:
    """One job's ops on the cluster's GPUs: ``gpus[r]`` is the cluster GPU of job rank r."""

    job: JobSpec
    gpus: tuple[int, ...]
    program: Program  # ranks renumbered to cluster GPUs, ``ranks`` = the cluster's GPUs


def job_scenario(scenario: Scenario, job: JobSpec, fold: str = "off", iterations: int = 1) -> Scenario:
    """A one-job Scenario of ``job`` on a cluster of its own size (to build its Program and work out its
    fold). By default folding off (the copies of a job need not be alike on the shared fabric) and one
    iteration (repeated later); the job's alone run keeps the scenario's ``fold`` and ``iterations``."""
    cluster = dataclasses.replace(scenario.cluster, nodes=len(job.nodes_assigned), overrides=())
    sim = dataclasses.replace(scenario.simulation, iterations=iterations, fold=fold)
    return dataclasses.replace(scenario, name=job.name, cluster=cluster, model=job.model, training=job.training,
                               parallel=job.parallel, workload=job.workload, simulation=sim, jobs=())


def gpu_map(nodes: tuple[int, ...], gpus_per_node: int) -> tuple[int, ...]:
    """Cluster GPU of each job rank: ranks fill the job's nodes in order, ``gpus_per_node`` each."""
    return tuple(n * gpus_per_node + local for n in nodes for local in range(gpus_per_node))


def embeds_alike(cluster: ClusterSpec, nodes: tuple[int, ...]) -> bool:
    """Whether ``nodes`` (in rank order) sit in ``cluster`` as nodes 0..n−1 of a cluster of the job's own
    size sit in theirs, up to an automorphism of the fabric: then the symmetry folding finds on that
    cluster (``emulator.run.folding.choose_fold``) holds for the job on these nodes, and its run alone
    here is its single-job run, folded.

    Only the two-level fat-tree and rail fabrics fold across nodes (``folding._node_axes``: nodes in
    a leaf, and whole leaves, are interchangeable), so there the job's nodes, cut in runs of
    ``leaf_size``, must each lie in one leaf, and two runs never in the same leaf. Elsewhere only
    node interiors fold, which any placement keeps. Nodes must rise with rank (a group's members then
    keep their order as GPUs) and the cluster have no overrides (its faults are on given GPUs and links).
    """
    if cluster.overrides or list(nodes) != sorted(nodes):
        return False
    if cluster.fabric.kind not in ("fat_tree", "rail") or cluster.nodes == 1:
        return True
    leaf = max(1, min(cluster.fabric.leaf_size, cluster.nodes))
    runs = [nodes[i:i + leaf] for i in range(0, len(nodes), leaf)]
    leaves = [{n // leaf for n in run} for run in runs]
    return all(len(x) == 1 for x in leaves) and len(set().union(*leaves)) == len(runs)


def fold_holds(fold: Fold, gpus: tuple[int, ...], cluster: ClusterSpec, gpus_per_node: int) -> bool:
    """Whether every translation of ``fold`` (a job's fold over its own ranks, from a cluster of its own
    size) maps the job, placed on ``gpus``, onto itself by an automorphism of the fabric.

    A unit step along each folded axis moves job rank r to r'; it moves r's node to r''s node. That map
    must be a function of the node (a node's GPUs keep their local index: ``gpu_map``), and it must
    carry whole leaves onto whole leaves, two leaves never onto one: nodes of a leaf, and leaves of a
    two-level fat-tree or rail fabric, are interchangeable (``folding._node_axes``); on a three-level
    fat-tree, whole pods onto whole pods too; on one switch, any nodes; elsewhere a node only onto
    itself. Spread placements pass where a data-parallel step turns the leaves round (issue 29's
    2 × Llama-3 70B: 64 ranks per simulated rank instead of 8); random ones mostly fold their
    tensor-parallel peers only."""
    kind = cluster.fabric.kind
    leaf = max(1, min(cluster.fabric.leaf_size, cluster.nodes))
    pod = leaf * max(1, cluster.fabric.pod_size)
    blocks = {"fat_tree": (leaf,), "rail": (leaf,), "fat_tree3": (leaf, pod)}.get(kind)
    for axis, folded in enumerate(fold.folded):
        if not folded or fold.shape[axis] == 1:
            continue
        step = tuple(1 if a == axis else 0 for a in range(len(fold.shape)))
        moves: dict[int, int] = {}
        for r in range(len(gpus)):
            a, b = gpus[r] // gpus_per_node, gpus[fold.translate(r, step)] // gpus_per_node
            if moves.setdefault(a, b) != b:
                return False
        if kind == "single_switch" or cluster.nodes == 1:
            continue
        if blocks is None:
            if any(a != b for a, b in moves.items()):
                return False
            continue
        for size in blocks:
            images: dict[int, int] = {}
            for a, b in moves.items():
                if images.setdefault(a // size, b // size) != b // size:
                    return False
            if len(set(images.values())) != len(images):
                return False
    return True


def place(program: Program, gpus: tuple[int, ...], world: int, id_base: int) -> Program:
    """``program`` with rank r renamed ``gpus[r]`` (groups re-sorted, a block's parts' too) and op ids
    shifted by ``id_base``.

    Each op is made by ``Op``'s positional constructor (``program._fast_init``, ~1 µs), not by
    ``dataclasses.replace`` (~4 µs: it reads every field by name): a 512-GPU GPT-3 175B job is
    1.8M ops (issue 29: 44% of a one-job run was these replaces)."""
    if program.ranks > len(gpus):
        raise ValueError(f"the workload has {program.ranks} ranks but the job has {len(gpus)} GPUs")
    groups: dict[tuple[int, ...], tuple[int, ...]] = {}
    blocks: dict[int, tuple[Part, ...]] = {}  # a block's parts (shared by the builder's blocks), by id

    def group(g: tuple[int, ...]) -> tuple[int, ...]:
        tg = groups.get(g)
        if tg is None:
            tg = groups[g] = tuple(sorted(gpus[r] for r in g))
        return tg

    out: list[Op] = []
    append = out.append
    for op in program.ops:
        g = group(op.group) if op.group else ()
        parts = op.parts
        if parts:
            placed = blocks.get(id(parts))
            if placed is None:
                placed = blocks[id(parts)] = tuple(dataclasses.replace(p, group=group(p.group)) if p.group else p
                                                   for p in parts)
            parts = placed
        deps = tuple([d + id_base for d in op.deps]) if id_base else op.deps
        append(Op(op.id + id_base, gpus[op.rank], op.kind, op.stream, deps, op.name, op.duration, op.flops,
                  op.bytes, op.category, op.collective, g, gpus[op.root] if op.root >= 0 else -1,
                  gpus[op.peer] if op.peer >= 0 else -1, op.tag, op.microbatch, op.stage, op.layer, op.costed,
                  parts))
    return Program(world, out, None, program.meta)


def delayed(program: Program, start: float, id_base: int) -> Program:
    """``program`` whose every rank waits ``start`` seconds first (no-op for 0): one op per rank,
    ids from ``id_base``, that the first op of each of the rank's streams depends on."""
    if start <= 0.0:
        return program
    ranks = sorted({op.rank for op in program.ops})
    wait = {r: id_base + i for i, r in enumerate(ranks)}
    head: set[tuple[int, str]] = set()
    ops = [Op(id=wait[r], rank=r, kind=COMPUTE, stream=START_STREAM,
              name=START_NAME, duration=start, category="idle") for r in ranks]
    for op in program.ops:
        key = (op.rank, op.stream)
        if key not in head:
            head.add(key)
            op = dataclasses.replace(op, deps=op.deps + (wait[op.rank],))
        ops.append(op)
    return Program(program.ranks, ops, None, program.meta)


def merge(programs: list[Program], world: int) -> Program:
    """One Program holding the ops of every job (ids already disjoint)."""
    return Program(world, [op for p in programs for op in p.ops], None)


def id_span(program: Program) -> int:
    """One more than the largest op id (0 for no ops): the next job's id base."""
    return max((op.id for op in program.ops), default=-1) + 1
