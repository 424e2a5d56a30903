"""The scenario reader: YAML text or a file, read into the frozen dataclasses of spec.py.

The text becomes a YamlValue tree (yamltree.py), the ``--set key.path=value``
assignments are applied to the tree (assignments.py), the tree is read against the key
table that schema.py derives from the spec, and the result goes through the cross-key
checks (checks.py), which apply the rule book (rules.py).

Every problem is a ScenarioError: "FILE:LINE: key.path: expected ..., got ...".
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable, Mapping, Sequence, TypeVar

from emulator.errors import CatalogError, EmulatorError, ScenarioError, UnitError, did_you_mean
from emulator.scenario import catalog, paths, spec, units
from emulator.scenario.assignments import apply_assignments
from emulator.scenario.checks import FABRIC_KEY_KINDS, ScenarioChecks, graph_gpus
from emulator.scenario.expert_load import MAX_LOAD_FILE_BYTES, LoadFileError, parse_loads
from emulator.scenario.schema import (
    AXES,
    CLUSTER_KEYS,
    FABRIC_KEYS,
    GPU_KEYS,
    JOB_KEYS,
    KEYS,
    MODEL_KEYS,
    NODE_KEYS,
    OVERRIDE_KEYS,
    PLACEMENTS,
    SECTION_TYPES,
    UNIT_TYPES,
    Key,
    all_key_paths,
    key_hints,
)
from emulator.scenario.spec import (
    ClusterSpec,
    FabricSpec,
    Fault,
    GpuSpec,
    JobSpec,
    ModelSpec,
    NodeSpec,
    ProfiledSpec,
    Scenario,
)
from emulator.scenario.yamltree import (
    EXPECTED,
    EXTENSION_PREFIX,
    MAX_FILE_BYTES,
    SUB_SECTIONS,
    TAG,
    YamlValue,
    decode,
    describe,
    in_range,
    parse_tree,
    python_value,
    range_text,
    show,
)

T = TypeVar("T")  # a catalog entry: GpuSpec or NodeSpec


def load_scenario_text(text: str | bytes, path: str = "<string>", overrides: Sequence[str] = ()) -> Scenario:
    """A Scenario from YAML text; ``path`` names it in messages and anchors relative paths.
    ``overrides``: the ``--set key.path=value`` assignments to apply first (assignments.py)."""
    source = str(path)
    if isinstance(text, (bytes, bytearray)):
        text = decode(bytes(text), source)
    tree = apply_assignments(parse_tree(text, source), overrides)
    return _Reader(source).scenario(tree)


def load_scenario(path: str | os.PathLike[str], overrides: Sequence[str] = ()) -> Scenario:
    """A Scenario from a YAML file, with the ``--set key.path=value`` assignments ``overrides`` applied.

    Raises ScenarioError (one line: file, line, key path, expected, got) for any bad input.
    """
    source = os.fspath(path)
    try:
        with open(source, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise ScenarioError(f"cannot read the scenario: {err.strerror or err}", source) from None
    if len(raw) > MAX_FILE_BYTES:
        raise ScenarioError(f"more than {MAX_FILE_BYTES} bytes; a scenario is a few kilobytes", source)
    return load_scenario_text(decode(raw, source), source, overrides)


# ------------------------------------------------------------------ reader


class _Reader:
    """Reads a scenario tree against the key table; remembers where each key was."""

    def __init__(self, source: str) -> None:
        self.source = source
        real = source not in ("", "<string>") and not source.startswith("<")
        self.base_dir = os.path.dirname(os.path.abspath(source)) if real else os.getcwd()
        self.seen: dict[str, str] = {}
        self.empty: set[str] = set()  # keys given without a value ("key:" alone)
        self.user_catalog: str | None = None  # cluster.catalog, once read

    # -- messages
    def fail(self, where: str, keypath: str, message: str) -> ScenarioError:
        return ScenarioError(message, where or self.source, keypath)

    def where(self, keypath: str) -> str:
        """Where a key (or its nearest given parent) is in the file."""
        parts = keypath.split(".")
        while parts:
            found = self.seen.get(".".join(parts))
            if found:
                return found
            parts.pop()
        return self.seen.get("", self.source)

    # -- sections
    def section(self, v: YamlValue | None, keys: Mapping[str, Key], kp: str) -> dict[str, YamlValue]:
        if v is None or v.is_null:
            return {}
        if v.mapping is None:
            sample = ", ".join(list(keys)[:4])
            raise self.fail(v.where, kp, f"expected a mapping of keys ({sample}, ...), got {describe(v)}")
        self.seen[kp] = v.key_where or v.where
        for name, item in v.mapping.items():
            if name not in keys and not (kp == "" and name.startswith(EXTENSION_PREFIX)):
                raise self.unknown(name, item, keys, kp)
            if item.is_null:
                self.empty.add(_join(kp, name))
        return {n: i for n, i in v.mapping.items() if not i.is_null and n in keys}

    def unknown(self, name: str, item: YamlValue, keys: Mapping[str, Key], kp: str) -> ScenarioError:
        hint = did_you_mean(name, list(keys))
        if not hint:
            others = key_hints([p for p in all_key_paths() if p.endswith("." + name) or p == name])
            if name in others:  # a top-level key given inside a section: "did you mean" itself says nothing
                hint = f"; {show(name)} is a key of the scenario's top level, not of {kp}"
            elif others:
                hint = "; did you mean " + " or ".join(f'"{o}"' for o in others[:3]) + "?"
            else:
                hint = f"; expected one of: {', '.join(keys)}"
        return self.fail(item.key_where or item.where, _join(kp, name), f"unknown key {show(name)}{hint}")

    def require(self, m: Mapping[str, YamlValue], keys: Mapping[str, Key], kp: str,
                names: Sequence[str] | None = None) -> None:
        wanted = names if names is not None else [n for n, k in keys.items()
                                                 if k.required and k.required_unless is None]
        for name in wanted:
            if name not in m:
                kpn = _join(kp, name)
                state = "has no value" if kpn in self.empty else "is required and missing"
                raise self.fail(self.where(kp), kpn, f"this key {state} ({keys[name].doc.rstrip('.')})")

    def fields(self, m: Mapping[str, YamlValue], keys: Mapping[str, Key], kp: str) -> dict[str, Any]:
        """The plain (non-section, non-catalog) keys of a section, read and converted."""
        out: dict[str, Any] = {}
        for name, item in m.items():
            key = keys[name]
            if key.type in SECTION_TYPES or key.names:
                continue
            out[key.attr or name] = self.read(item, key, _join(kp, name))
        return out

    # -- scalars
    def read(self, v: YamlValue, key: Key, kp: str) -> Any:
        self.seen[kp] = v.where
        t = key.type
        if t == "int_list":
            return self.int_list(v, kp)
        if t == "layer_list":
            return self.layer_list(v, key, kp)
        if t == "number_list":
            return self.number_list(v, kp)
        if t == "name_list":
            return self.name_list(v, key, kp)
        if t == "axis_order":
            return self.axis_order(v, kp)
        if t == "placement":
            return self.placement(v, kp)
        if t == "expert_load":
            return self.expert_load(v, key, kp)
        if v.mapping is not None or v.items is not None:
            raise self.fail(v.where, kp, f"expected {self.expected(key)}, got {describe(v)}")
        if t in ("str", "path", "enum"):
            return getattr(self, "read_" + t)(v, key, kp)
        x = python_value(v)
        if t in UNIT_TYPES or t == "ratio":
            try:
                value = units.parse_ratio(x) if t == "ratio" else units.PARSERS[t](x)
            except UnitError as err:
                raise self.fail(v.where, kp, str(err)) from None
            if not in_range(key, value):
                noun = "a number" if t == "ratio" else units.KINDS[t].name
                raise self.fail(v.where, kp, f"expected {range_text(key, noun)}, got {show(x)}")
            return value
        if t == "bool":
            if not isinstance(x, bool):
                raise self.fail(v.where, kp, f"expected true or false, got {show(x)}")
            return x
        if isinstance(x, bool) or not isinstance(x, (int, float)) or (t == "int" and not isinstance(x, int)):
            raise self.fail(v.where, kp, f"expected {self.expected(key)}, got {show(x)}")
        if isinstance(x, float) and not math.isfinite(x):
            raise self.fail(v.where, kp, f"expected a finite number, got {v.text}")
        if not in_range(key, x):
            raise self.fail(v.where, kp, f"expected {range_text(key, self.expected(key))}, got {show(x)}")
        return x if t == "int" else float(x)

    @staticmethod
    def expected(key: Key) -> str:
        if key.type in UNIT_TYPES:
            kind = units.KINDS[key.type]
            return f"{kind.name} with a unit such as {kind.examples}"
        if key.type == "enum":
            return "one of " + ", ".join(key.enum)
        return EXPECTED.get(key.type, key.type)

    def read_str(self, v: YamlValue, key: Key, kp: str) -> str:
        if not v.text.strip():
            raise self.fail(v.where, kp, "expected a non-empty string, got an empty one")
        if len(v.text) > 500:
            raise self.fail(v.where, kp, f"expected a short string, got {len(v.text)} characters")
        return v.text

    def read_enum(self, v: YamlValue, key: Key, kp: str) -> str:
        text = v.text.strip()
        for choice in key.enum:
            if text.lower() == choice.lower():
                return choice
        choices = ", ".join(key.enum)
        return_hint = did_you_mean(text, list(key.enum))
        raise self.fail(v.where, kp, f"expected one of {choices}, got {show(python_value(v))}{return_hint}")

    def read_path(self, v: YamlValue, key: Key, kp: str) -> str:
        text = self.read_str(v, key, kp)
        path = os.path.normpath(os.path.join(self.base_dir, os.path.expanduser(text)))
        # a trace may be a folder of per-rank files (Kineto, Chakra); the importer checks its contents
        wrong = paths.problem(path, folder_ok=kp == "workload.trace" or kp.endswith("].workload.trace"))  # a job's too
        if wrong is not None:
            relative = "" if os.path.isabs(os.path.expanduser(text)) else \
                f' ("{text}" is read relative to the scenario\'s folder)'
            raise self.fail(v.where, kp, f'{wrong}: "{path}"{relative}')
        return path

    def int_list(self, v: YamlValue, kp: str) -> tuple[int, ...]:
        dim = Key("int", "", minimum=1, maximum=10**6)
        if v.items is not None:
            items = v.items
        elif v.mapping is None and isinstance(python_value(v), str) and "x" in v.text:
            items = [YamlValue(v.where, text=t.strip(), tag=TAG + "int") for t in v.text.split("x")]
        elif v.mapping is None:
            items = [v]
        else:
            raise self.fail(v.where, kp, f"expected {EXPECTED['int_list']}, got a mapping")
        if not 1 <= len(items) <= 6:
            raise self.fail(v.where, kp, f"expected 1 to 6 dimensions, got {len(items)}")
        return tuple(self.read(item, dim, f"{kp}[{i}]") for i, item in enumerate(items))

    def layer_list(self, v: YamlValue, key: Key, kp: str) -> tuple[int, ...]:
        """One integer a layer, each in ``key``'s bounds (model.csa_compress_ratios)."""
        if v.items is None or not v.items:
            raise self.fail(v.where, kp, f"expected {EXPECTED['layer_list']}, got {describe(v)}")
        item = Key("int", "", minimum=key.minimum, maximum=key.maximum)
        return tuple(self.read(x, item, f"{kp}[{i}]") for i, x in enumerate(v.items))

    def number_list(self, v: YamlValue, kp: str) -> tuple[float, ...]:
        """A list of plain numbers of at least 0 (model.moe_expert_load)."""
        if v.items is None or not v.items:
            raise self.fail(v.where, kp, f"expected {EXPECTED['number_list']}, got {describe(v)}")
        item = Key("number", "", minimum=0.0, maximum=1e18)
        return tuple(float(self.read(x, item, f"{kp}[{i}]")) for i, x in enumerate(v.items))

    def expert_load(self, v: YamlValue, key: Key, kp: str) -> tuple[tuple[float, ...], ...]:
        """model.moe_expert_load: one list of numbers (every MoE layer), a list of lists (one per MoE
        layer), or a file of rows (scenario/expert_load.py), read relative to the scenario."""
        if v.items is None and v.mapping is None:
            if not isinstance(python_value(v), str):
                raise self.fail(v.where, kp, f"expected {EXPECTED['expert_load']}, got {describe(v)}")
            return self.load_file(self.read_path(v, key, kp), v, kp)
        if v.items and all(x.items is not None for x in v.items):
            for i, row in enumerate(v.items):
                self.seen[f"{kp}[{i}]"] = row.where
            return tuple(self.number_list(row, f"{kp}[{i}]") for i, row in enumerate(v.items))
        return (self.number_list(v, kp),)

    def load_file(self, path: str, v: YamlValue, kp: str) -> tuple[tuple[float, ...], ...]:
        """The rows of a load file; a problem names the file's line."""
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read(MAX_LOAD_FILE_BYTES + 1)
        except (OSError, UnicodeDecodeError) as err:
            raise self.fail(v.where, kp, f'cannot read "{path}": {err}') from None
        if len(text) > MAX_LOAD_FILE_BYTES:
            raise self.fail(v.where, kp, f'"{path}" is over {MAX_LOAD_FILE_BYTES} bytes')
        try:
            return parse_loads(text)
        except LoadFileError as err:
            at = f"{path}:{err.line}" if err.line else path
            raise self.fail(v.where, kp, f"{at}: {err}") from None

    def name_list(self, v: YamlValue, key: Key, kp: str) -> tuple[str, ...]:
        """A list of names, each one of ``key.enum``, none twice (training.recompute_modules); [] is allowed."""
        if v.items is None:
            raise self.fail(v.where, kp, f"expected a list of names from {', '.join(key.enum)}, got {describe(v)}")
        names = tuple(self.read_enum(item, key, f"{kp}[{i}]") for i, item in enumerate(v.items))
        for i, name in enumerate(names):
            if name in names[:i]:
                raise self.fail(v.items[i].where, f"{kp}[{i}]", f"{name} is given twice")
        return names

    def axis_order(self, v: YamlValue, kp: str) -> tuple[str, ...]:
        if v.items is None:
            raise self.fail(v.where, kp, f"expected {EXPECTED['axis_order']}, got {describe(v)}")
        names = tuple(self.read(item, Key("str", ""), f"{kp}[{i}]").strip().lower() for i, item in enumerate(v.items))
        if sorted(names) != sorted(AXES):
            raise self.fail(v.where, kp, f"expected {EXPECTED['axis_order']}, got [{', '.join(names)}]")
        return names

    def placement(self, v: YamlValue, kp: str) -> str | tuple[int, ...]:
        """A policy name, or a list of node indices (each at least 0)."""
        if v.items is not None:
            if not v.items:
                raise self.fail(v.where, kp, f"expected {EXPECTED['placement']}, got an empty list")
            node = Key("int", "", minimum=0, maximum=10**6)
            return tuple(self.read(item, node, f"{kp}[{i}]") for i, item in enumerate(v.items))
        if v.mapping is not None:
            raise self.fail(v.where, kp, f"expected {EXPECTED['placement']}, got a mapping")
        return self.read_enum(v, Key("enum", "", enum=PLACEMENTS), kp)

    def catalog_gpu(self, v: YamlValue, kp: str) -> GpuSpec:
        return self.catalog(v, kp, catalog.gpu)

    def catalog_node(self, v: YamlValue, kp: str) -> NodeSpec:
        return self.catalog(v, kp, catalog.node)

    def catalog(self, v: YamlValue, kp: str, lookup: Callable[[str, str | None], T]) -> T:
        """A catalog entry by the name ``v`` holds (also from the scenario's own catalog file)."""
        name = self.read(v, Key("str", ""), kp)
        try:
            return lookup(name, self.user_catalog)
        except CatalogError as err:
            raise self.fail(v.where, kp, str(err)) from None
        except EmulatorError as err:
            raise self.fail(self.where("cluster.catalog"), "cluster.catalog", str(err)) from None

    # -- the scenario
    def scenario(self, tree: YamlValue | None) -> Scenario:
        if tree is None:
            raise self.fail(self.source, "", "the file is empty; a scenario needs at least "
                                             "`name` and `cluster`")
        if tree.mapping is None:
            raise self.fail(tree.where, "", "expected a mapping at the top level (name: ..., "
                                            f"cluster: ...), got {describe(tree)}")
        self.seen[""] = tree.where
        top = self.section(tree, KEYS, "")
        self.require(top, KEYS, "")
        name = self.read(top["name"], KEYS["name"], "name")
        cluster = self.cluster(top["cluster"])
        subs = {n: self.flat(top.get(n), n) for n in SUB_SECTIONS}
        if subs["workload"].profile is not None and subs["workload"].profiled is not None:
            model: ModelSpec | None = self.profiled_model(top.get("model"), subs["workload"].profiled)
        else:
            model = self.model(top["model"]) if "model" in top else None
        jobs = self.jobs(top.get("jobs"))
        s = Scenario(name=name, cluster=cluster, model=model, path=self.source, jobs=jobs, **subs)
        return ScenarioChecks(s, self.where, lambda kp: kp in self.seen).run()

    def flat(self, v: YamlValue | None, name: str, keys: Mapping[str, Key] = KEYS, prefix: str = "") -> Any:
        key = keys[name]
        assert key.keys is not None and key.cls is not None
        kp = _join(prefix, name)
        m = self.section(v, key.keys, kp)
        out = self.fields(m, key.keys, kp)
        for sub, sk in key.keys.items():  # nested sections of plain keys (workload.profiled)
            if sk.type == "section" and sk.cls is not None and sk.keys is not None and sub in m:
                self.require(self.section(m[sub], sk.keys, _join(kp, sub)), sk.keys, _join(kp, sub))
                out[sk.attr or sub] = self.flat(m[sub], sub, key.keys, kp)
        return getattr(spec, key.cls)(**out)

    def jobs(self, v: YamlValue | None) -> tuple[JobSpec, ...]:
        """The ``jobs:`` list: each job's own keys, model and sub-sections (checks.py places them)."""
        kp = "jobs"
        if v is None or v.is_null:
            return ()
        if v.items is None or not v.items:
            raise self.fail(v.where, kp, "expected a list of jobs (- name: a, nodes: 2, model: {...}), "
                                         f"got {'an empty list' if v.items is not None else describe(v)}")
        self.seen[kp] = v.key_where or v.where
        out: list[JobSpec] = []
        entries: list[int] = []  # the entry of each job (count: its copies)
        for i, item in enumerate(v.items):
            ikp = f"{kp}[{i}]"
            if item.mapping is None:
                raise self.fail(item.where, ikp, f"expected a mapping (name, nodes, placement, model, ...), "
                                                 f"got {describe(item)}")
            m = self.section(item, JOB_KEYS, ikp)
            self.require(m, JOB_KEYS, ikp)
            given = self.fields(m, JOB_KEYS, ikp)
            placement = given.pop("placement", "contiguous")
            if isinstance(placement, tuple):
                given.update(placement="list", node_list=placement)
            else:
                given["placement"] = placement
            model = self.model(m["model"], f"{ikp}.model") if "model" in m else None
            subs = {n: self.flat(m.get(n), n, JOB_KEYS, ikp) for n in ("training", "parallel", "workload")}
            count, stagger = given.pop("count", 0), given.pop("stagger", 0.0)
            if stagger and not count:
                raise self.fail(self.where(f"{ikp}.stagger"), f"{ikp}.stagger", "stagger is read only with count "
                                                                              "(copy i starts at start + i x stagger)")
            job = JobSpec(model=model, **given, **subs)
            copies = [job] if not count else [dataclasses.replace(job, name=f"{job.name}-{c}", entry=job.name,
                                                                  start=job.start + c * stagger)
                                              for c in range(count)]
            entries += [i] * len(copies)
            out += copies
        if len(entries) != len(v.items):
            self._renumber(entries)
        return tuple(out)

    def _renumber(self, entries: list[int]) -> None:
        """The later checks name a job by its place among the copies (jobs[k]); find each where its
        entry (jobs[entries[k]]) is in the file."""
        given = {kp: w for kp, w in self.seen.items() if kp.startswith("jobs[")}
        for kp in given:
            del self.seen[kp]
        for k, i in enumerate(entries):
            head = f"jobs[{i}]"
            for kp, where in given.items():
                if kp == head or kp.startswith(head + "."):
                    self.seen[f"jobs[{k}]" + kp[len(head):]] = where

    def cluster(self, v: YamlValue) -> ClusterSpec:
        kp = "cluster"
        m = self.section(v, CLUSTER_KEYS, kp)
        if v.is_null or not m:
            raise self.fail(v.where, kp, "expected a mapping with nodes and node (e.g. nodes: 4, "
                                         f"node: dgx-a100), got {describe(v)}")
        fabric = self.fabric(m.get("fabric"))
        if "catalog" in m:
            self.user_catalog = self.read(m["catalog"], CLUSTER_KEYS["catalog"], "cluster.catalog")
        custom = fabric.kind == "custom"
        if not custom:
            self.require(m, CLUSTER_KEYS, kp, ["nodes", "node"])
        node = self.node(m["node"], "cluster.node", lenient=custom) if "node" in m else None
        if "nodes" in m:
            nodes = self.read(m["nodes"], CLUSTER_KEYS["nodes"], "cluster.nodes")
        else:
            count = graph_gpus(fabric.graph) if custom else None
            nodes = max(1, count // node.gpus_per_node) if (count and node) else 1
        faults = self.faults(m.get("overrides"))
        if node is not None and nodes > 1 and node.nics == 0 and not custom:
            raise self.fail(self.where("cluster.node"), "cluster.node.nics",
                            f"a cluster of {nodes} nodes needs at least one NIC per node, got 0")
        return ClusterSpec(nodes=nodes, node=node, fabric=fabric, overrides=faults)

    def fabric(self, v: YamlValue | None) -> FabricSpec:
        kp = "cluster.fabric"
        m = self.section(v, FABRIC_KEYS, kp)
        spec = FabricSpec(**self.fields(m, FABRIC_KEYS, kp))
        if spec.kind == "custom" and spec.graph is None:
            raise self.fail(self.where(kp), kp + ".graph", 'kind "custom" needs a graph file '
                                                           "(graph: path/to/graph.json)")
        for name in m:
            kinds = FABRIC_KEY_KINDS.get(name)
            if kinds is not None and spec.kind not in kinds:
                raise self.fail(self.where(f"{kp}.{name}"), f"{kp}.{name}",
                                f"{name} is only read with kind: {' or '.join(kinds)} (kind is "
                                f'"{spec.kind}"); remove it, or --set {kp}.{name}= to drop it')
        return spec

    def node(self, v: YamlValue, kp: str, lenient: bool) -> NodeSpec:
        if v.mapping is None:
            return self.catalog_node(v, kp)
        m = self.section(v, NODE_KEYS, kp)
        base = self.catalog_node(m["preset"], kp + ".preset") if "preset" in m else None
        given = self.fields(m, NODE_KEYS, kp)
        if "gpu" in m:
            given["gpu"] = self.gpu(m["gpu"], kp + ".gpu", base.gpu if base else None)
        if base is not None:
            return dataclasses.replace(base, **given)
        needed = ["gpu"] if lenient else ["gpu", "gpus_per_node", "intra_bandwidth"]
        self.require(m, NODE_KEYS, kp, needed)
        if given.get("nics", 0) > 0 and "nic_bandwidth" not in given:
            raise self.fail(self.where(kp + ".nics"), kp + ".nic_bandwidth",
                            f"nics is {given['nics']}, so nic_bandwidth is required (e.g. \"400 Gb/s\")")
        defaults: dict[str, Any] = dict(name="custom", intra="nvswitch", intra_latency=0.0,
                                        intra_efficiency=1.0, nics=0, nic_bandwidth=0.0,
                                        nic_latency=0.0, nic_efficiency=1.0,
                                        gpus_per_node=1, intra_bandwidth=0.0)
        return NodeSpec(**{**defaults, **given})

    def gpu(self, v: YamlValue, kp: str, base: GpuSpec | None = None) -> GpuSpec:
        """A catalog GPU, or an inline one (from its preset, else from the node preset's GPU)."""
        if v.mapping is None:
            return self.catalog_gpu(v, kp)
        m = self.section(v, GPU_KEYS, kp)
        given = self.fields(m, GPU_KEYS, kp)
        if "preset" in m:
            base = self.catalog_gpu(m["preset"], kp + ".preset")
        if base is not None:
            return dataclasses.replace(base, **given)
        self.require(m, GPU_KEYS, kp, ["peak_flops", "hbm_bandwidth", "memory"])
        return GpuSpec(**{"name": "custom", **given})

    def faults(self, v: YamlValue | None) -> tuple[Fault, ...]:
        """``cluster.overrides``: the faults and stragglers."""
        kp = "cluster.overrides"
        if v is None or v.is_null:
            return ()
        if v.items is None:
            raise self.fail(v.where, kp, "expected a list of overrides (- kind: gpu_slowdown, "
                                         f"target: gpu:3, factor: 1.5), got {describe(v)}")
        out = []
        for i, item in enumerate(v.items):
            ikp = f"{kp}[{i}]"
            if item.mapping is None:
                raise self.fail(item.where, ikp, f"expected a mapping (kind, target, factor), got {describe(item)}")
            m = self.section(item, OVERRIDE_KEYS, ikp)
            self.require(m, OVERRIDE_KEYS, ikp)
            out.append(Fault(**self.fields(m, OVERRIDE_KEYS, ikp)))
        return tuple(out)

    def model(self, v: YamlValue, kp: str = "model") -> ModelSpec | None:
        m = self.section(v, MODEL_KEYS, kp)
        if not m:
            return None
        given = self.fields(m, MODEL_KEYS, kp)
        if "preset" in m:
            spec = self.preset(m["preset"], given, kp + ".preset")
        else:
            missing = [k for k in ("layers", "hidden", "heads", "seq_len", "vocab") if k not in given]
            if missing:
                raise self.fail(self.where(kp), kp, f"missing {', '.join(missing)}: give "
                                                    f"them, or a {kp}.preset")
            spec = ModelSpec(**given)
        return spec

    def profiled_model(self, v: YamlValue | None, pr: ProfiledSpec, kp: str = "model") -> ModelSpec:
        """The model a profile is predicted at: what it ran (``workload.profiled``), changed by the
        scenario's own ``model`` keys. Widths not given keep their ratio to the profile's: the MLP
        to the hidden size, the key/value heads to the heads (as the script's config would)."""
        m = self.section(v, MODEL_KEYS, kp)
        if "preset" in m:
            raise self.fail(m["preset"].where, f"{kp}.preset", "a profiled workload keeps the profiled script's "
                                                               "architecture: give its sizes (layers, hidden, "
                                                               "heads, seq_len, vocab), not a preset")
        given = self.fields(m, MODEL_KEYS, kp)
        hidden, heads = given.get("hidden", pr.hidden), given.get("heads", pr.heads)
        ffn = given.get("ffn_hidden") or (pr.ffn_hidden or 4 * pr.hidden) * hidden // pr.hidden
        kv = given.get("kv_heads") or max(1, (pr.kv_heads or pr.heads) * heads // pr.heads)
        sizes = dict(layers=given.get("layers", pr.layers), hidden=hidden, heads=heads, ffn_hidden=ffn,
                     seq_len=given.get("seq_len", pr.seq_len), vocab=given.get("vocab", pr.vocab), kv_heads=kv,
                     causal=given.get("causal", True))
        return ModelSpec(**{**given, **sizes})  # the other keys as given: the rule book applies or refuses them

    def preset(self, v: YamlValue, given: dict[str, Any], kp: str = "model.preset") -> ModelSpec:
        name = self.read(v, MODEL_KEYS["preset"], kp)
        names = catalog.model_names()
        canonical = {n.lower(): n for n in names}.get(name.strip().lower())
        if canonical is None:
            raise self.fail(v.where, kp, f'unknown model "{name}"{did_you_mean(name, names)} '
                                         f"(known: {', '.join(names)})")
        name = canonical
        try:
            base = catalog.model_preset(name)
        except EmulatorError as err:
            raise self.fail(v.where, kp, str(err)) from None
        return dataclasses.replace(base, preset=name, **given)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name
