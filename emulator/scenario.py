"""Scenarios: YAML files loaded into frozen, validated dataclasses.

Nothing downstream of this module reads YAML. All quantities are SI here
(bytes, bytes/s, seconds, FLOP/s); units are parsed once, at load time.

(The loader, validation and schema are added below these definitions.)
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class GpuSpec:
    name: str
    peak_flops: float  # dense bf16/fp16 tensor-core FLOP/s
    hbm_bandwidth: float  # B/s
    memory_bytes: float  # B
    launch_overhead: float = 4e-6  # s per kernel


@dataclass(frozen=True)
class NodeSpec:
    name: str
    gpus_per_node: int
    gpu: GpuSpec
    intra: str  # "nvswitch" | "pcie"
    intra_bandwidth: float  # B/s per GPU port, each direction (line rate)
    intra_latency: float  # s per link
    intra_efficiency: float  # achieved / line rate for collectives (nccl-tests calibrated)
    nics: int  # NICs per node (compute rails)
    nic_bandwidth: float  # B/s per NIC, each direction (line rate)
    nic_latency: float  # s per link
    nic_efficiency: float
    step_latency_intra: float = 0.0  # s, per-step software latency of a collective inside a node
    step_latency_inter: float = 0.0  # s, per-step software latency across nodes
    collective_launch: float = 0.0  # s, fixed cost of one collective call


@dataclass(frozen=True)
class FabricSpec:
    kind: str = "single_switch"  # single_switch | fat_tree | rail | ring | torus | custom
    oversubscription: float = 1.0
    link_bandwidth: float | None = None  # B/s per fabric link; default: the NIC rate
    latency: float = 1e-6  # s per fabric link
    graph: str | None = None  # path, for kind == custom
    leaf_size: int = 16  # nodes per leaf (fat_tree) or per rail switch (rail)
    torus_dims: tuple[int, ...] = ()  # for kind == torus; default: a ring


@dataclass(frozen=True)
class Override:
    """A fault or straggler. kind: gpu_slowdown | link_degrade | link_fail | node_fail."""

    kind: str
    target: str  # "gpu:5", "node:3", or a link "src->dst" in topology node names
    factor: float = 1.0  # slowdown (>1 is slower) or bandwidth factor (<1 is slower)
    extra_latency: float = 0.0  # s


@dataclass(frozen=True)
class ClusterSpec:
    nodes: int
    node: NodeSpec | None
    fabric: FabricSpec = field(default_factory=FabricSpec)
    overrides: tuple[Override, ...] = ()


@dataclass(frozen=True)
class ModelSpec:
    preset: str | None = None
    layers: int = 0
    hidden: int = 0
    heads: int = 0
    ffn_hidden: int = 0
    seq_len: int = 0
    vocab: int = 0
    kv_heads: int = 0  # 0: same as heads
    experts: int = 0  # 0: dense
    top_k: int = 0
    swiglu: bool = False
    tied_embeddings: bool = False


@dataclass(frozen=True)
class TrainingSpec:
    global_batch: int = 1
    micro_batch: int = 1
    precision: str = "bf16"  # bf16 | fp16 | fp32 | fp8
    recompute: str = "none"  # none | selective | full
    attention: str = "unfused"  # unfused (Megatron's softmax kernels, as calibrated) | flash


@dataclass(frozen=True)
class ParallelSpec:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    sequence_parallel: bool = False
    zero: int = 0
    schedule: str = "1f1b"  # gpipe | 1f1b | interleaved-1f1b
    virtual_stages: int = 1
    overlap_grad_reduce: bool = True
    grad_bucket: float = 25e6 * 4  # B


@dataclass(frozen=True)
class CollectivesSpec:
    algorithm: str = "auto"  # auto | ring | hierarchical | direct


@dataclass(frozen=True)
class WorkloadSpec:
    trace: str | None = None  # path, resolved relative to the scenario file
    format: str = "emulator"  # emulator | kineto | chakra
    mirror: int = 0  # replay a one-rank trace as N data-parallel ranks


@dataclass(frozen=True)
class SimulationSpec:
    iterations: int = 1
    fold: str = "auto"  # auto | off
    detail: str = "layer"  # layer | op


@dataclass(frozen=True)
class Scenario:
    name: str
    cluster: ClusterSpec
    model: ModelSpec | None = None
    training: TrainingSpec = field(default_factory=TrainingSpec)
    parallel: ParallelSpec = field(default_factory=ParallelSpec)
    collectives: CollectivesSpec = field(default_factory=CollectivesSpec)
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    simulation: SimulationSpec = field(default_factory=SimulationSpec)
    path: str = ""  # the file it was loaded from, for messages and relative paths

    @property
    def gpus(self) -> int:
        node = self.cluster.node
        return self.cluster.nodes * node.gpus_per_node if node else 0


# ============================================================================ loader
#
# YAML text -> a tree of YamlValue (every value knows its file and line) -> --set
# overrides applied to the tree -> each section read against the key table of
# emulator/schema.py -> the frozen dataclasses above -> cross-checks.
# Every problem is a ScenarioError: "FILE:LINE: key.path: expected ..., got ...".

import codecs  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
from typing import Any, Mapping, Sequence  # noqa: E402

import yaml  # noqa: E402

from . import units  # noqa: E402
from .errors import CatalogError, EmulatorError, ScenarioError, UnitError, did_you_mean  # noqa: E402
from .schema import (  # noqa: E402
    CLUSTER_KEYS, FABRIC_KEYS, GPU_KEYS, KEYS, MAX_COUNT, MODEL_KEYS, NODE_KEYS, OVERRIDE_KEYS,
    SECTION_TYPES, UNIT_TYPES, Key, all_key_paths,
)

MAX_FILE_BYTES = 1 << 20  # a scenario is a few kilobytes
MAX_VALUES = 20_000  # YAML values after expanding aliases (stops "billion laughs")
MAX_DEPTH = 24  # nesting levels; the deepest real key is 4 levels down
_TAG = "tag:yaml.org,2002:"
_YAML_NUMBER = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?$")
_TARGET = re.compile(r"^(gpu|node):(\d+)$")
EXTENSION_PREFIX = "x-"  # top-level keys the loader ignores: a place for &anchors
_SUB_SECTIONS = ("training", "parallel", "collectives", "workload", "simulation")


@dataclass
class YamlValue:
    """One value of a scenario file (a mapping, a list or a scalar) and where it came from.

    ``where`` is "FILE:LINE" (or "--set key=value"); ``key_where`` is where its key is.
    """

    where: str
    mapping: dict[str, "YamlValue"] | None = None
    items: list["YamlValue"] | None = None
    text: str = ""
    tag: str = _TAG + "str"
    plain: bool = True  # an unquoted scalar
    key_where: str = ""

    @property
    def is_null(self) -> bool:
        return self.mapping is None and self.items is None and self.tag == _TAG + "null"


# ----------------------------------------------------------------- YAML -> tree


def _decode(raw: bytes, source: str) -> str:
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        try:
            return raw.decode("utf-16")
        except UnicodeDecodeError:
            raise ScenarioError("the file starts like UTF-16 text but is not; save it as UTF-8",
                                source) from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise ScenarioError(f"the file is not UTF-8 text: byte 0x{raw[err.start]:02x} at offset "
                            f"{err.start} is not valid UTF-8 (is it binary, or in another encoding?)",
                            f"{source}:{line}") from None


def _at(source: str, line: int | None) -> str:
    if source.startswith("--set") or line is None:
        return source
    return f"{source}:{line}"


def _yaml_error(err: yaml.YAMLError, source: str, text: str) -> ScenarioError:
    if isinstance(err, yaml.reader.ReaderError):
        line = text[: err.position].count("\n") + 1
        char = err.character if isinstance(err.character, str) else chr(err.character)
        return ScenarioError(f"this is not a text file: unacceptable character #x{ord(char):04x} "
                             "(binary data?)", _at(source, line))
    if isinstance(err, yaml.MarkedYAMLError):
        mark = err.problem_mark or err.context_mark
        problem = err.problem or "not valid YAML"
        context = f" ({err.context})" if err.context else ""
        hint = ""
        if "\\t" in problem or "\t" in problem:
            hint = "; YAML does not allow tabs for indentation, use spaces"
        elif "found duplicate anchor" in problem or "undefined alias" in problem:
            hint = "; check the &anchors and *aliases"
        return ScenarioError(f"this is not valid YAML: {problem}{context}{hint}",
                             _at(source, mark.line + 1 if mark else None))
    return ScenarioError(f"this is not valid YAML: {err}", source)


def _compose(text: str, source: str) -> yaml.Node | None:
    """The YAML node tree (with line marks), never constructed into Python objects."""
    loader = None
    try:
        loader = yaml.SafeLoader(text)  # checks the characters already
        return loader.get_single_node()
    except yaml.YAMLError as err:
        raise _yaml_error(err, source, text) from None
    except RecursionError:
        raise ScenarioError(f"the YAML is nested too deeply (more than {MAX_DEPTH} levels)",
                            source) from None
    finally:
        if loader is not None:
            loader.dispose()


class _Expander:
    """Turns the composed node tree into YamlValues, expanding aliases within a budget."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.count = 0

    def where(self, node: yaml.Node) -> str:
        return _at(self.source, node.start_mark.line + 1)

    def value(self, node: yaml.Node, depth: int = 0, ancestors: frozenset[int] = frozenset()) -> YamlValue:
        where = self.where(node)
        self.count += 1
        if self.count > MAX_VALUES:
            raise ScenarioError(f"more than {MAX_VALUES} values after expanding anchors and aliases; "
                                "a scenario is far smaller (an alias bomb?)", where)
        if depth > MAX_DEPTH:
            raise ScenarioError(f"nested more than {MAX_DEPTH} levels deep", where)
        if id(node) in ancestors:
            raise ScenarioError("an alias refers to a mapping or list that contains it "
                                "(a recursive anchor)", where)
        if isinstance(node, yaml.ScalarNode):
            return YamlValue(where, text=node.value, tag=node.tag, plain=node.style is None)
        inner = ancestors | {id(node)}
        if isinstance(node, yaml.SequenceNode):
            return YamlValue(where, items=[self.value(n, depth + 1, inner) for n in node.value])
        return YamlValue(where, mapping=self.mapping(node, depth, inner))

    def mapping(self, node: yaml.MappingNode, depth: int, inner: frozenset[int]) -> dict[str, YamlValue]:
        out: dict[str, YamlValue] = {}
        merged: dict[str, YamlValue] = {}
        for key, value in node.value:
            if key.tag == _TAG + "merge":
                self._merge(value, depth, inner, merged)
                continue
            if not isinstance(key, yaml.ScalarNode):
                raise ScenarioError("a key must be a plain name, not a list or a mapping", self.where(key))
            name = key.value
            if name in out:
                first = out[name].key_where.rsplit(":", 1)[-1]
                raise ScenarioError(f'duplicate key "{name}" (first given at line {first})',
                                    self.where(key))
            item = self.value(value, depth + 1, inner)
            item.key_where = self.where(key)
            out[name] = item
        for name, item in merged.items():
            out.setdefault(name, item)
        return out

    def _merge(self, value: yaml.Node, depth: int, inner: frozenset[int],
               merged: dict[str, YamlValue]) -> None:
        sources = value.value if isinstance(value, yaml.SequenceNode) else [value]
        for src in sources:
            if not isinstance(src, yaml.MappingNode):
                raise ScenarioError("a merge key (<<) needs a mapping or a list of mappings",
                                    self.where(src))
            if id(src) in inner:
                raise ScenarioError("a merge key (<<) refers to a mapping that contains it",
                                    self.where(src))
            for name, item in self.mapping(src, depth + 1, inner | {id(src)}).items():
                merged.setdefault(name, item)


def _tree(text: str, source: str) -> YamlValue | None:
    if len(text) > MAX_FILE_BYTES:
        raise ScenarioError(f"more than {MAX_FILE_BYTES} characters; a scenario is a few kilobytes",
                            source)
    node = _compose(text.lstrip("\ufeff"), source)
    if node is None:
        return None
    tree = _Expander(source).value(node)
    return None if tree.is_null else tree


# ------------------------------------------------------------------ --set overrides


def _override_keys(text: str) -> tuple[list[str], str]:
    """'parallel.tp=4' -> (['parallel', 'tp'], '4'), checked against the key table."""
    where = f"--set {text}"
    if "=" not in text:
        raise ScenarioError('expected key.path=value, e.g. "parallel.tp=4"', where)
    path, value = text.split("=", 1)
    parts = [p.strip() for p in path.strip().split(".")]
    keys: Mapping[str, Key] = KEYS
    for i, part in enumerate(parts):
        if part not in keys:
            others = [p for p in all_key_paths() if p.endswith("." + part)]
            hint = did_you_mean(part, list(keys)) or (f'; did you mean "{others[0]}"?' if others else "")
            raise ScenarioError(f'unknown key "{part}"{hint}', where, ".".join(parts[: i + 1]))
        key = keys[part]
        if i < len(parts) - 1:
            if key.type == "sections":
                whole = ".".join(parts[: i + 1])
                raise ScenarioError(f"this is a list: set it whole, e.g. --set '{whole}=[{{kind: "
                                    "gpu_slowdown, target: \"gpu:0\", factor: 2}]'", where, whole)
            if key.type != "section" or key.keys is None:
                raise ScenarioError(f"{'.'.join(parts[: i + 1])} is a value, not a section", where,
                                    ".".join(parts[: i + 2]))
            keys = key.keys
    return parts, value


def _key_at(parts: Sequence[str]) -> Key:
    keys: Mapping[str, Key] = KEYS
    key = KEYS[parts[0]]
    for part in parts:  # the path was checked by _override_keys
        key = keys[part]
        keys = key.keys or {}
    return key


def apply_overrides(tree: YamlValue | None, overrides: Sequence[str]) -> YamlValue | None:
    """Applies ``--set key.path=value`` strings to a scenario tree (in place; returns it).

    The value is read as YAML ("4", "200 Gb/s", "[4, 4]"); an empty value removes the
    key. Missing sections are created; a catalog name standing for a node or GPU
    becomes ``{preset: name}`` so that one of its figures can be changed.
    """
    for text in overrides:
        parts, value_text = _override_keys(str(text))
        where = f"--set {text}"
        if tree is None:
            tree = YamlValue(where, mapping={})
        if tree.mapping is None:
            return tree  # the top level is not a mapping: reported when it is read
        value = _tree(value_text, where) or YamlValue(where, tag=_TAG + "null")
        value.key_where = where
        node = tree
        for i, part in enumerate(parts[:-1]):
            assert node.mapping is not None
            child = node.mapping.get(part)
            if child is None or child.is_null or (child.mapping is None and not _key_at(parts[: i + 1]).names):
                child = YamlValue(where, mapping={}, key_where=where)
            elif child.mapping is None:  # a catalog name: {preset: name}
                child = YamlValue(child.where, mapping={"preset": child}, key_where=child.key_where)
            node.mapping[part] = child
            node = child
        assert node.mapping is not None
        node.mapping[parts[-1]] = value
    return tree


# ------------------------------------------------------------------ scalars


def _python(v: YamlValue) -> Any:
    """A scalar as YAML reads it (int, float, bool, None), else its text.

    YAML 1.1 quirks are undone: "2:1" stays text (not the base-60 number 121), and
    plain "1e3" is a number (PyYAML would read it as text).
    """
    tag, text = v.tag, v.text
    if tag == _TAG + "null":
        return None
    if tag == _TAG + "bool":
        return text.lower() in ("yes", "true", "on", "y")
    if tag in (_TAG + "int", _TAG + "float") and ":" not in text:
        try:
            node = yaml.ScalarNode(tag, text)
            c = yaml.constructor.SafeConstructor()
            return c.construct_yaml_int(node) if tag.endswith("int") else c.construct_yaml_float(node)
        except (ValueError, OverflowError):
            return text
    if tag == _TAG + "str" and v.plain and _YAML_NUMBER.match(text):
        return float(text)
    return text


def _show(x: Any) -> str:
    if x is None:
        return "nothing"
    if isinstance(x, bool):
        return f"the boolean {str(x).lower()}"
    if isinstance(x, int):
        return str(x) if abs(x) < 10**15 else f"a {len(str(abs(x)))}-digit number"
    if isinstance(x, float):
        return repr(x)
    if isinstance(x, str):
        if x.isdigit() and len(x) > 15:
            return f"a {len(x)}-digit number"
        text = x if len(x) <= 40 else x[:37] + "..."
        return '"' + text.encode("unicode_escape").decode("ascii").replace('"', '\\"') + '"'
    return str(x)


def _describe(v: YamlValue) -> str:
    if v.mapping is not None:
        return "a mapping"
    if v.items is not None:
        return "a list"
    return _show(_python(v))


_EXPECTED = {"int": "an integer", "number": "a number", "bool": "true or false", "str": "a string",
             "path": "a file path", "ratio": 'a number or a ratio such as 0.8, "230/300" or "2:1"',
             "int_list": "a list of integers such as [4, 4, 2]"}


def _maximum(key: Key) -> float | None:
    """Unit quantities are bounded by emulator/units.py; counts by MAX_COUNT."""
    if key.maximum is not None:
        return key.maximum
    return MAX_COUNT if key.type in ("int", "number") else None


def _range_text(key: Key, noun: str) -> str:
    hi = _maximum(key)
    fmt = (lambda x: f"{x:g}") if key.type != "int" else (lambda x: str(int(x)))
    if key.minimum is not None:
        return f"{noun} from {fmt(key.minimum)} to {fmt(hi)}" if hi is not None else f"{noun} of at least {fmt(key.minimum)}"
    if key.positive:
        return f"{noun} more than 0" + (f" and at most {fmt(hi)}" if hi is not None else "")
    return f"{noun} from 0 to {fmt(hi)}" if hi is not None else noun


def _in_range(key: Key, x: float) -> bool:
    if key.positive and not x > 0:
        return False
    if key.minimum is not None and x < key.minimum:
        return False
    hi = _maximum(key)
    return hi is None or x <= hi


# ------------------------------------------------------------------ reader


class _Reader:
    """Reads a scenario tree against the key table; remembers where each key was."""

    def __init__(self, source: str) -> None:
        self.source = source
        real = source not in ("", "<string>") and not source.startswith("<")
        self.base_dir = os.path.dirname(os.path.abspath(source)) if real else os.getcwd()
        self.seen: dict[str, str] = {}
        self.empty: set[str] = set()  # keys given without a value ("key:" alone)

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
            raise self.fail(v.where, kp, f"expected a mapping of keys ({sample}, ...), got {_describe(v)}")
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
            others = [p for p in all_key_paths() if p.endswith("." + name) or p == name]
            if others:
                hint = "; did you mean " + " or ".join(f'"{o}"' for o in others[:3]) + "?"
            else:
                hint = f"; expected one of: {', '.join(keys)}"
        return self.fail(item.key_where or item.where, _join(kp, name), f"unknown key {_show(name)}{hint}")

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
        if v.mapping is not None or v.items is not None:
            raise self.fail(v.where, kp, f"expected {self.expected(key)}, got {_describe(v)}")
        if t in ("str", "path", "enum"):
            return getattr(self, "read_" + t)(v, key, kp)
        x = _python(v)
        if t in UNIT_TYPES or t == "ratio":
            try:
                value = units.parse_ratio(x) if t == "ratio" else units.PARSERS[t](x)
            except UnitError as err:
                raise self.fail(v.where, kp, str(err)) from None
            if not _in_range(key, value):
                noun = "a number" if t == "ratio" else units.KINDS[t].name
                raise self.fail(v.where, kp, f"expected {_range_text(key, noun)}, got {_show(x)}")
            return value
        if t == "bool":
            if not isinstance(x, bool):
                raise self.fail(v.where, kp, f"expected true or false, got {_show(x)}")
            return x
        if isinstance(x, bool) or not isinstance(x, (int, float)) or (t == "int" and not isinstance(x, int)):
            raise self.fail(v.where, kp, f"expected {self.expected(key)}, got {_show(x)}")
        if isinstance(x, float) and not math.isfinite(x):
            raise self.fail(v.where, kp, f"expected a finite number, got {v.text}")
        if not _in_range(key, x):
            raise self.fail(v.where, kp, f"expected {_range_text(key, self.expected(key))}, got {_show(x)}")
        return x if t == "int" else float(x)

    @staticmethod
    def expected(key: Key) -> str:
        if key.type in UNIT_TYPES:
            kind = units.KINDS[key.type]
            return f"{kind.name} with a unit such as {kind.examples}"
        if key.type == "enum":
            return "one of " + ", ".join(key.enum)
        return _EXPECTED.get(key.type, key.type)

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
        raise self.fail(v.where, kp, f"expected one of {choices}, got {_show(_python(v))}{return_hint}")

    def read_path(self, v: YamlValue, key: Key, kp: str) -> str:
        text = self.read_str(v, key, kp)
        path = os.path.normpath(os.path.join(self.base_dir, os.path.expanduser(text)))
        # a trace may be a folder of per-rank files (Kineto, Chakra); the importer checks its contents
        if not (os.path.isfile(path) or (kp == "workload.trace" and os.path.isdir(path))):
            raise self.fail(v.where, kp, f'file not found: "{path}" ("{text}" is read relative to '
                                         f"the scenario's folder)")
        return path

    def int_list(self, v: YamlValue, kp: str) -> tuple[int, ...]:
        dim = Key("int", "", minimum=1, maximum=10**6)
        if v.items is not None:
            items = v.items
        elif v.mapping is None and isinstance(_python(v), str) and "x" in v.text:
            items = [YamlValue(v.where, text=t.strip(), tag=_TAG + "int") for t in v.text.split("x")]
        elif v.mapping is None:
            items = [v]
        else:
            raise self.fail(v.where, kp, f"expected {_EXPECTED['int_list']}, got a mapping")
        if not 1 <= len(items) <= 6:
            raise self.fail(v.where, kp, f"expected 1 to 6 dimensions, got {len(items)}")
        return tuple(self.read(item, dim, f"{kp}[{i}]") for i, item in enumerate(items))

    def catalog(self, v: YamlValue, kind: str, kp: str) -> Any:
        from . import catalog

        name = self.read(v, Key("str", ""), kp)
        user = getattr(self, "user_catalog", None)
        try:
            return catalog.gpu(name, user) if kind == "gpu" else catalog.node(name, user)
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
                                            f"cluster: ...), got {_describe(tree)}")
        self.seen[""] = tree.where
        top = self.section(tree, KEYS, "")
        self.require(top, KEYS, "")
        name = self.read(top["name"], KEYS["name"], "name")
        cluster = self.cluster(top["cluster"])
        model = self.model(top["model"]) if "model" in top else None
        subs = {n: self.flat(top.get(n), n) for n in _SUB_SECTIONS}
        s = Scenario(name=name, cluster=cluster, model=model, path=self.source, **subs)
        return _Checks(self, s).run()

    def flat(self, v: YamlValue | None, name: str) -> Any:
        key = KEYS[name]
        assert key.keys is not None and key.cls is not None
        m = self.section(v, key.keys, name)
        return globals()[key.cls](**self.fields(m, key.keys, name))

    def cluster(self, v: YamlValue) -> ClusterSpec:
        kp = "cluster"
        m = self.section(v, CLUSTER_KEYS, kp)
        if v.is_null or not m:
            raise self.fail(v.where, kp, "expected a mapping with nodes and node (e.g. nodes: 4, "
                                         f"node: dgx-a100), got {_describe(v)}")
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
            count = _graph_gpus(fabric.graph) if custom else None
            nodes = max(1, count // node.gpus_per_node) if (count and node) else 1
        overrides = self.overrides(m.get("overrides"))
        if node is not None and nodes > 1 and node.nics == 0 and not custom:
            raise self.fail(self.where("cluster.node"), "cluster.node.nics",
                            f"a cluster of {nodes} nodes needs at least one NIC per node, got 0")
        return ClusterSpec(nodes=nodes, node=node, fabric=fabric, overrides=overrides)

    def fabric(self, v: YamlValue | None) -> FabricSpec:
        kp = "cluster.fabric"
        m = self.section(v, FABRIC_KEYS, kp)
        spec = FabricSpec(**self.fields(m, FABRIC_KEYS, kp))
        if spec.kind == "custom" and spec.graph is None:
            raise self.fail(self.where(kp), kp + ".graph", 'kind "custom" needs a graph file '
                                                           "(graph: path/to/graph.json)")
        if spec.kind != "custom" and spec.graph is not None:
            raise self.fail(self.where(kp + ".graph"), kp + ".graph",
                            f'a graph is only read with kind: custom (kind is "{spec.kind}")')
        if spec.kind != "torus" and spec.torus_dims:
            raise self.fail(self.where(kp + ".torus_dims"), kp + ".torus_dims",
                            f'torus_dims is only read with kind: torus (kind is "{spec.kind}")')
        return spec

    def node(self, v: YamlValue, kp: str, lenient: bool) -> NodeSpec:
        if v.mapping is None:
            return self.catalog(v, "node", kp)
        m = self.section(v, NODE_KEYS, kp)
        base: NodeSpec | None = self.catalog(m["preset"], "node", kp + ".preset") if "preset" in m else None
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
            return self.catalog(v, "gpu", kp)
        m = self.section(v, GPU_KEYS, kp)
        given = self.fields(m, GPU_KEYS, kp)
        if "preset" in m:
            base = self.catalog(m["preset"], "gpu", kp + ".preset")
        if base is not None:
            return dataclasses.replace(base, **given)
        self.require(m, GPU_KEYS, kp, ["peak_flops", "hbm_bandwidth", "memory"])
        return GpuSpec(**{"name": "custom", **given})

    def overrides(self, v: YamlValue | None) -> tuple[Override, ...]:
        kp = "cluster.overrides"
        if v is None or v.is_null:
            return ()
        if v.items is None:
            raise self.fail(v.where, kp, "expected a list of overrides (- kind: gpu_slowdown, "
                                         f"target: gpu:3, factor: 1.5), got {_describe(v)}")
        out = []
        for i, item in enumerate(v.items):
            ikp = f"{kp}[{i}]"
            if item.mapping is None:
                raise self.fail(item.where, ikp, f"expected a mapping (kind, target, factor), got {_describe(item)}")
            m = self.section(item, OVERRIDE_KEYS, ikp)
            self.require(m, OVERRIDE_KEYS, ikp)
            out.append(Override(**self.fields(m, OVERRIDE_KEYS, ikp)))
        return tuple(out)

    def model(self, v: YamlValue) -> ModelSpec | None:
        m = self.section(v, MODEL_KEYS, "model")
        if not m:
            return None
        given = self.fields(m, MODEL_KEYS, "model")
        if "preset" in m:
            spec = self.preset(m["preset"], given)
        else:
            missing = [k for k in ("layers", "hidden", "heads", "seq_len", "vocab") if k not in given]
            if missing:
                raise self.fail(self.where("model"), "model", f"missing {', '.join(missing)}: give "
                                                              "them, or a model.preset")
            spec = ModelSpec(**given)
        return spec

    def preset(self, v: YamlValue, given: dict[str, Any]) -> ModelSpec:
        kp = "model.preset"
        name = self.read(v, MODEL_KEYS["preset"], kp)
        try:
            from .workload.models import model_names, model_preset  # type: ignore[import-not-found]
        except ImportError:
            raise self.fail(v.where, kp, "model presets are not available (emulator.workload.models "
                                         "is missing); give the model's sizes instead") from None
        names = list(model_names())
        canonical = {n.lower(): n for n in names}.get(name.strip().lower())
        if canonical is None:
            raise self.fail(v.where, kp, f'unknown model "{name}"{did_you_mean(name, names)} '
                                         f"(known: {', '.join(names)})")
        name = canonical
        try:
            base = model_preset(name)
        except EmulatorError as err:
            raise self.fail(v.where, kp, str(err)) from None
        return dataclasses.replace(base, preset=name, **given)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


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
        chunks = p.pp * p.virtual_stages
        if m.layers % chunks:
            raise self.fail("parallel.pp", f"model.layers ({m.layers}) must be divisible by "
                                           f"pp*virtual_stages = {p.pp}*{p.virtual_stages} = {chunks}")
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


# ------------------------------------------------------------------ public API


def load_scenario_text(text: str | bytes, path: str = "<string>", overrides: Sequence[str] = ()) -> Scenario:
    """A Scenario from YAML text; ``path`` names it in messages and anchors relative paths."""
    source = str(path)
    if isinstance(text, (bytes, bytearray)):
        text = _decode(bytes(text), source)
    tree = apply_overrides(_tree(text, source), overrides)
    return _Reader(source).scenario(tree)


def load_scenario(path: str | os.PathLike[str], overrides: Sequence[str] = ()) -> Scenario:
    """A Scenario from a YAML file, with ``--set key.path=value`` overrides applied.

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
    return load_scenario_text(_decode(raw, source), source, overrides)


def require_workload(s: Scenario) -> None:
    """For ``emulator run``: a scenario needs a model or a workload.trace."""
    if s.model is None and s.workload.trace is None:
        raise ScenarioError("a run needs a workload: give a model (model.preset, or layers, hidden, "
                            "heads, seq_len, vocab) or a workload.trace", s.path or "<string>", "model")
