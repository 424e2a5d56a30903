"""Cross-key checks of a loaded scenario (Megatron's rules): world = tp·pp·dp·cp,
the divisibilities of layers, heads, batches and micro-batches, schedule options,
override targets; dp is derived when it was left out.

Each failure is a ScenarioError that names the file, line and key path, through
the reader that loaded the scenario.
"""
from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING

import yaml

from .errors import ScenarioError
from .scenario import ModelSpec, ParallelSpec, Scenario, TrainingSpec
from .workload.stages import chunk_layers
from .yamltree import _TARGET, _show

if TYPE_CHECKING:
    from .scenario_reader import _Reader


def _graph_gpus(path: str | None) -> int | None:
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


class _Checks:
    """Cross-key rules (Megatron's): world = tp*pp*dp*cp, divisibilities, schedule options."""

    def __init__(self, reader: _Reader, s: Scenario) -> None:
        self.r = reader
        self.s = s

    def fail(self, kp: str, message: str) -> ScenarioError:
        return self.r.fail(self.r.where(kp), kp, message)

    def given(self, kp: str) -> bool:
        return kp in self.r.seen

    def gpus(self) -> int:
        s = self.s
        if s.cluster.fabric.kind == "custom" and not self.given("cluster.nodes"):
            return _graph_gpus(s.cluster.fabric.graph) or s.gpus
        return s.gpus

    def run(self) -> Scenario:
        s = self.s
        p = s.parallel
        if p.virtual_stages > 1 and p.schedule != "interleaved-1f1b":
            raise self.fail("parallel.virtual_stages", f"virtual_stages > 1 needs schedule: "
                                                       f'interleaved-1f1b (schedule is "{p.schedule}")')
        p = self.derive_dp(p)
        s = dataclasses.replace(s, parallel=p)
        node = s.cluster.node
        if s.collectives.algorithm == "nvls" and (node is None or not node.nvls_busbw
                                                  or s.cluster.fabric.kind == "custom"):
            raise self.fail("collectives.algorithm", "nvls needs a catalog or inline node with NVLink SHARP "
                                                     "(nvls_busbw, e.g. dgx-h100, dgx-h200)")
        self.check_targets(s)
        if s.model is not None:
            self.check_model(s.model)
            self.check_parallel(s.model, s.training, p)
        return s

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

    def check_targets(self, s: Scenario) -> None:
        gpus, nodes = s.gpus, (s.cluster.nodes if s.cluster.node is not None else 0)
        for i, o in enumerate(s.cluster.overrides):
            kp = f"cluster.overrides[{i}].target"
            m = _TARGET.match(o.target)
            link = "->" in o.target or not m
            allowed = {"gpu_slowdown": ("gpu", "node"), "node_fail": ("node",)}.get(o.kind)
            kind = "link" if link else (m.group(1) if m else None)
            if allowed is not None and kind not in allowed:  # links are checked on the topology
                forms = {"gpu": '"gpu:N"', "node": '"node:N"', "link": '"src->dst"'}
                raise self.fail(kp, f"expected {' or '.join(forms[a] for a in allowed)} for {o.kind}, "
                                    f"got {_show(o.target)}")
            if m and kind == "gpu" and gpus and int(m.group(2)) >= gpus:
                raise self.fail(kp, f"there is no gpu {m.group(2)}: the cluster has GPUs 0 to {gpus - 1}")
            if m and kind == "node" and nodes and int(m.group(2)) >= nodes:
                raise self.fail(kp, f"there is no node {m.group(2)}: the cluster has nodes 0 to {nodes - 1}")

    def check_model(self, m: ModelSpec) -> None:
        for name in ("layers", "hidden", "heads", "seq_len", "vocab"):
            if getattr(m, name) < 1:
                raise self.fail(f"model.{name}", f"the model needs {name} of at least 1, got {getattr(m, name)}")
        if m.hidden % m.heads:
            raise self.fail("model.heads", f"hidden ({m.hidden}) must be divisible by heads ({m.heads})")
        if m.kv_heads and (m.kv_heads > m.heads or m.heads % m.kv_heads):
            raise self.fail("model.kv_heads", f"kv_heads ({m.kv_heads}) must divide heads ({m.heads})")
        if m.experts and m.top_k > m.experts:  # top_k 0: the model's default (1)
            raise self.fail("model.top_k", f"top_k ({m.top_k}) must be at most experts ({m.experts})")
        if not m.experts and m.top_k:
            raise self.fail("model.top_k", f"top_k ({m.top_k}) needs experts > 0 (an MoE model)")

    def check_parallel(self, m: ModelSpec, t: TrainingSpec, p: ParallelSpec) -> None:
        gpus = self.gpus()
        world = p.tp * p.pp * p.dp * p.cp
        if gpus and world != gpus:
            c = self.s.cluster
            shape = f" ({c.nodes} nodes x {c.node.gpus_per_node})" if c.node else ""
            raise self.fail("parallel.dp" if self.given("parallel.dp") else "parallel",
                            f"tp*pp*dp*cp = {p.tp}*{p.pp}*{p.dp}*{p.cp} = {world}, but the cluster has "
                            f"{gpus} GPUs{shape}; they must be equal (leave dp out to derive it)")
        if (p.dp * p.cp) % p.ep:
            raise self.fail("parallel.ep", f"ep ({p.ep}) must divide dp*cp = {p.dp}*{p.cp} = {p.dp * p.cp}")
        if p.ep > 1 and not m.experts:
            raise self.fail("parallel.ep", f"ep = {p.ep} needs an MoE model (model.experts > 0)")
        if m.experts and m.experts % p.ep:
            raise self.fail("parallel.ep", f"ep ({p.ep}) must divide model.experts ({m.experts})")
        per_step = t.micro_batch * p.dp
        if not self.given("training.global_batch") and per_step > 1:
            raise self.fail("training.global_batch", f"this key is required with a model (sequences per "
                                                     f"iteration, a multiple of micro_batch*dp = {per_step})")
        if t.global_batch % per_step:
            raise self.fail("training.global_batch", f"global_batch ({t.global_batch}) must be divisible "
                                                     f"by micro_batch*dp = {t.micro_batch}*{p.dp} = {per_step}")
        try:
            chunk_layers(m.layers, p.pp, p.virtual_stages, p.first_chunk_layers, p.last_chunk_layers)
        except ScenarioError as err:
            raise self.fail(err.key or "parallel.pp", err.message) from None
        if m.heads % p.tp:
            raise self.fail("parallel.tp", f"model.heads ({m.heads}) must be divisible by tp ({p.tp})")
        if m.ffn_hidden and m.ffn_hidden % p.tp:
            raise self.fail("parallel.tp", f"model.ffn_hidden ({m.ffn_hidden}) must be divisible by tp ({p.tp})")
        if m.kv_heads and m.kv_heads % p.tp and p.tp % m.kv_heads:  # kv heads may be replicated
            raise self.fail("parallel.tp", f"model.kv_heads ({m.kv_heads}) and tp ({p.tp}) must divide "
                                           "one another")
        split = p.cp * (p.tp if p.sequence_parallel else 1)
        if m.seq_len % split:
            what = f"cp*tp = {p.cp}*{p.tp}" if p.sequence_parallel else "cp"
            raise self.fail("parallel.cp", f"model.seq_len ({m.seq_len}) must be divisible by {what} = {split}")
        micro_batches = t.global_batch // per_step
        if p.schedule == "interleaved-1f1b" and p.pp > 1 and micro_batches % p.pp:
            raise self.fail("training.global_batch",
                            f"interleaved-1f1b needs the micro-batches per pipeline "
                            f"(global_batch/(micro_batch*dp) = {micro_batches}) to be a multiple of pp ({p.pp})")


