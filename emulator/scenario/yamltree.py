"""Scenario files as a tree of values that know their file and line (YamlValue).

YAML text is composed with PyYAML's safe loader and walked by hand, so that every
value keeps its "FILE:LINE", aliases are expanded within a budget ("billion laughs"),
nesting is bounded, and duplicate keys, tabs and bad encodings become one clear
ScenarioError. The scalar helpers turn a value back into Python for messages.
"""
from __future__ import annotations

import codecs
import re
from dataclasses import dataclass
from typing import Any

import yaml

from emulator.errors import ScenarioError
from emulator.scenario.keys import MAX_COUNT, Key
from emulator.scenario.units import KINDS as UNIT_KINDS

MAX_FILE_BYTES = 1 << 20  # a scenario is a few kilobytes
MAX_VALUES = 20_000  # YAML values after expanding aliases (stops "billion laughs")
MAX_DEPTH = 24  # nesting levels; the deepest real key is 4 levels down
TAG = "tag:yaml.org,2002:"
_YAML_NUMBER = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?$")
EXTENSION_PREFIX = "x-"  # top-level keys the loader ignores: a place for &anchors
SUB_SECTIONS = ("training", "parallel", "collectives", "workload", "simulation", "live")


@dataclass
class YamlValue:
    """One value of a scenario file (a mapping, a list or a scalar) and where it came from.

    ``where`` is "FILE:LINE" (or "--set key=value"); ``key_where`` is where its key is.
    """

    where: str
    mapping: dict[str, "YamlValue"] | None = None
    items: list["YamlValue"] | None = None
    text: str = ""
    tag: str = TAG + "str"
    plain: bool = True  # an unquoted scalar
    key_where: str = ""

    @property
    def is_null(self) -> bool:
        return self.mapping is None and self.items is None and self.tag == TAG + "null"


# ----------------------------------------------------------------- YAML -> tree


def decode(raw: bytes, source: str) -> str:
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
        assert isinstance(node, yaml.MappingNode)  # a composed node is a scalar, a sequence or a mapping
        return YamlValue(where, mapping=self.mapping(node, depth, inner))

    def mapping(self, node: yaml.MappingNode, depth: int, inner: frozenset[int]) -> dict[str, YamlValue]:
        out: dict[str, YamlValue] = {}
        merged: dict[str, YamlValue] = {}
        for key, value in node.value:
            if key.tag == TAG + "merge":
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


def parse_tree(text: str, source: str) -> YamlValue | None:
    if len(text) > MAX_FILE_BYTES:
        raise ScenarioError(f"more than {MAX_FILE_BYTES} characters; a scenario is a few kilobytes",
                            source)
    node = _compose(text.lstrip("\ufeff"), source)
    if node is None:
        return None
    tree = _Expander(source).value(node)
    return None if tree.is_null else tree

# ------------------------------------------------------------------ scalars


def python_value(v: YamlValue) -> Any:
    """A scalar as YAML reads it (int, float, bool, None), else its text.

    YAML 1.1 quirks are undone: "2:1" stays text (not the base-60 number 121), and
    plain "1e3" is a number (PyYAML would read it as text).
    """
    tag, text = v.tag, v.text
    if tag == TAG + "null":
        return None
    if tag == TAG + "bool":
        return text.lower() in ("yes", "true", "on", "y")
    if tag in (TAG + "int", TAG + "float") and ":" not in text:
        try:
            node = yaml.ScalarNode(tag, text)
            c = yaml.constructor.SafeConstructor()
            return c.construct_yaml_int(node) if tag.endswith("int") else c.construct_yaml_float(node)
        except (ValueError, OverflowError):
            return text
    if tag == TAG + "str" and v.plain and _YAML_NUMBER.match(text):
        return float(text)
    return text


def show(x: Any) -> str:
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


def describe(v: YamlValue) -> str:
    if v.mapping is not None:
        return "a mapping"
    if v.items is not None:
        return "a list"
    return show(python_value(v))


EXPECTED = {"int": "an integer", "number": "a number", "bool": "true or false", "str": "a string",
             "path": "a file path", "ratio": 'a number or a ratio such as 0.8, "230/300" or "2:1"',
             "int_list": "a list of integers such as [4, 4, 2]",
             "layer_list": "a list of integers, one a layer, such as [0, 0, 4, 128]",
             "number_list": "a list of numbers of at least 0, such as [1.3, 0.9, 1.0, 0.8]",
             "name_list": "a list of names, such as [mla_up_proj, layernorm]",
             "axis_order": "the four axes pp, dp, cp, tp in some order, such as [pp, dp, cp, tp]",
             "placement": "contiguous, spread, random, or a list of node indices such as [0, 2, 4]",
             "expert_load": "a list of numbers of at least 0 (one per expert), a list of such lists (one per MoE "
                            "layer), or a file of them, such as [1.3, 0.9, 1.0, 0.8]"}


def _maximum(key: Key) -> float | None:
    """Unit quantities are bounded by emulator/scenario/units.py; counts by MAX_COUNT."""
    if key.maximum is not None:
        return key.maximum
    return MAX_COUNT if key.type in ("int", "number") else None


def range_text(key: Key, noun: str) -> str:
    hi = _maximum(key)
    unit = f" {UNIT_KINDS[key.type].si_unit}" if key.type in UNIT_KINDS else ""

    def fmt(x: float) -> str:
        return str(int(x)) if key.type == "int" else f"{x:g}{unit}"

    if key.minimum is not None:
        if hi is None:
            return f"{noun} of at least {fmt(key.minimum)}"
        return f"{noun} from {fmt(key.minimum)} to {fmt(hi)}"
    if key.positive:
        return f"{noun} more than 0" + (f" and at most {fmt(hi)}" if hi is not None else "")
    return f"{noun} from 0 to {fmt(hi)}" if hi is not None else noun


def in_range(key: Key, x: float) -> bool:
    if key.positive and not x > 0:
        return False
    if key.minimum is not None and x < key.minimum:
        return False
    hi = _maximum(key)
    return hi is None or x <= hi


