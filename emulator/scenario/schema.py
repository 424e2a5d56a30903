"""The scenario key table and the JSON Schema, both derived from the spec's fields.

``KEYS`` is the table of every key a scenario file may hold: the walk
(keys.key_table) of the spec dataclasses of spec.py, whose fields carry each key's type,
bounds, choices and help text. The reader (reader.py) validates a file against it, the
catalog reads its node and GPU entries with it, and :func:`scenario_schema` turns it into
a JSON Schema (draft 2020-12) for editors, for ``emulator schema`` and for the reference
page. A key is added in spec.py; everything here follows.

Types: ``str``, ``enum``, ``int``, ``number``, ``ratio`` (0.8, "230/300", "2:1"),
``bool``, the unit kinds of emulator/scenario/units.py (``bytes``, ``time``,
``bandwidth``, ``flops_rate``), ``path`` (a file, relative to the scenario),
``int_list``, ``number_list``, ``axis_order``, ``placement``, ``section`` (a mapping of
keys) and ``sections`` (a list of them).
"""
from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any, Mapping, Sequence

from emulator.scenario import keys as _keys
from emulator.scenario import spec
from emulator.scenario.keys import (
    MAX_COUNT,
    MAX_LATENCY,
    MIN_BANDWIDTH,
    SECTION_TYPES,
    UNIT_TYPES,
    Key,
    key_table,
)
from emulator.scenario.spec import (
    AXES,
    FABRIC_KINDS,
    MAX_MIRROR,
    PLACEMENTS,
    ROUTINGS,
    SCHEDULES,
)
from emulator.scenario.spec import FAULT_KINDS as OVERRIDE_KINDS
from emulator.scenario.units import KINDS as UNIT_KINDS
from emulator.scenario.units import RATIO_PATTERN, UNIT_PATTERNS
from emulator.scenario.yamltree import in_range

__all__ = [  # the key table and schema, and the names of keys.py and spec.py that callers import from here
    "AXES", "CLUSTER_KEYS", "COLLECTIVES_KEYS", "FABRIC_KEYS", "FABRIC_KINDS", "GPU_KEYS", "JOB_KEYS", "KEYS",
    "LIVE_KEYS", "MAX_COUNT", "MAX_LATENCY", "MAX_MIRROR", "MIN_BANDWIDTH", "MODEL_KEYS", "NODE_KEYS", "OVERRIDE_KEYS",
    "OVERRIDE_KINDS", "PARALLEL_KEYS", "PLACEMENTS", "PROFILED_KEYS", "ROUTINGS", "SCHEDULES", "SECTION_TYPES",
    "SIMULATION_KEYS", "TRAINING_KEYS", "UNIT_TYPES", "WORKLOAD_KEYS", "Key", "Names", "all_key_paths", "key_hints",
    "scenario_schema", "section_keys",
]

Names = Mapping[str, Sequence[str]]  # catalog kind ("gpu", "node", "model") → the names it knows

KEYS: Mapping[str, Key] = key_table(spec.Scenario)


def section_keys(*path: str) -> Mapping[str, Key]:
    """The key table of the section at ``path`` (``section_keys("cluster", "node")``)."""
    keys = KEYS
    for name in path:
        inner = keys[name].keys
        assert inner is not None, f"{'.'.join(path)} is no section"
        keys = inner
    return keys


CLUSTER_KEYS = section_keys("cluster")
NODE_KEYS = section_keys("cluster", "node")
GPU_KEYS = section_keys("cluster", "node", "gpu")
FABRIC_KEYS = section_keys("cluster", "fabric")
OVERRIDE_KEYS = section_keys("cluster", "overrides")
MODEL_KEYS = section_keys("model")
TRAINING_KEYS = section_keys("training")
PARALLEL_KEYS = section_keys("parallel")
COLLECTIVES_KEYS = section_keys("collectives")
WORKLOAD_KEYS = section_keys("workload")
PROFILED_KEYS = section_keys("workload", "profiled")
SIMULATION_KEYS = section_keys("simulation")
LIVE_KEYS = section_keys("live")
JOB_KEYS = section_keys("jobs")


def all_key_paths(keys: Mapping[str, Key] = KEYS, prefix: str = "") -> list[str]:
    """Every dotted key path of the table (sections included), e.g. ``parallel.tp``."""
    return _keys.all_key_paths(keys, prefix)


def key_hints(paths: list[str]) -> list[str]:
    """Key paths to suggest: a job's copy of a key (jobs.model.layers) only when nothing else fits."""
    return [p for p in paths if not p.startswith("jobs.")] or paths


# ---------------------------------------------------------------- JSON Schema


def _default(key: Key, name: str, cls: type | None) -> Any:
    """The dataclass default of a key, in the file's spelling (unit kinds: an SI string). A default
    that the key does not accept (0 for "not given" where the key's minimum is 1, "" outside its
    choices) is no default a file could write: the key's text says what its absence means."""
    if cls is None:
        return MISSING
    for f in fields(cls):
        if f.name == (key.attr or name) and f.default is not MISSING:
            value = f.default
            if value is None or not _accepts(key, value):
                return MISSING
            if key.type in UNIT_TYPES:
                return f"{value:g} {UNIT_KINDS[key.type].si_unit}"
            if key.type in ("int_list", "layer_list", "axis_order", "number_list", "name_list", "expert_load"):
                return list(value)
            return value
    return MISSING


def _accepts(key: Key, value: Any) -> bool:
    """Whether a file may give ``value`` (an SI value) for ``key``: among its choices, within its bounds."""
    if key.enum:
        return value in key.enum
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return in_range(key, value)
    return True


def _scalar_schema(key: Key, names: Names) -> dict[str, Any]:
    t = key.type
    if t in UNIT_TYPES:
        return {"type": "string", "pattern": UNIT_PATTERNS[t]}
    if t == "enum":
        return {"type": "string", "enum": list(key.enum)}
    if t == "str":
        choices = list(names.get(key.names, ())) if key.names else []
        return {"type": "string", "enum": choices} if choices else {"type": "string", "minLength": 1}
    if t == "path":
        return {"type": "string", "minLength": 1}
    if t == "bool":
        return {"type": "boolean"}
    if t == "int_list":
        return {"type": "array", "items": {"type": "integer", "minimum": 1}, "maxItems": 6}
    if t == "number_list":
        return {"type": "array", "items": {"type": "number", "minimum": 0}, "minItems": 1}
    if t == "layer_list":
        return {"type": "array", "items": {"type": "integer", "minimum": key.minimum, "maximum": key.maximum},
                "minItems": 1}
    if t == "expert_load":
        row = {"type": "array", "items": {"type": "number", "minimum": 0}, "minItems": 1}
        return {"oneOf": [row, {"type": "array", "items": row, "minItems": 1}, {"type": "string", "minLength": 1}]}
    if t == "name_list":
        return {"type": "array", "items": {"type": "string", "enum": list(key.enum)}, "uniqueItems": True}
    if t == "placement":
        return {"oneOf": [{"type": "string", "enum": list(PLACEMENTS)},
                          {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1,
                           "uniqueItems": True}]}
    if t == "axis_order":
        return {"type": "array", "items": {"type": "string", "enum": list(AXES)}, "minItems": 4, "maxItems": 4,
                "uniqueItems": True}
    out: dict[str, Any] = {"type": "integer" if t == "int" else "number"}
    if t == "ratio":
        out = {"oneOf": [{"type": "number"}, {"type": "string", "pattern": RATIO_PATTERN}]}
        number = out["oneOf"][0]
    else:
        number = out
    if key.positive:
        number["exclusiveMinimum"] = 0
    if key.minimum is not None:
        number["minimum"] = key.minimum
    number["maximum"] = key.maximum if key.maximum is not None else MAX_COUNT
    return out


def _object_schema(keys: Mapping[str, Key], cls: type | None, names: Names) -> dict[str, Any]:
    props = {name: _key_schema(name, key, cls, names) for name, key in keys.items()}
    required = [n for n, k in keys.items() if k.required and k.required_unless is None]
    out: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        out["required"] = required
    conditional = [n for n, k in keys.items() if k.required and k.required_unless is not None]
    for name in conditional:
        path, value = keys[name].required_unless  # type: ignore[misc]
        head, *rest = path.split(".")
        inner: dict[str, Any] = {"const": value}
        for part in reversed(rest):
            inner = {"properties": {part: inner}, "required": [part]}
        cond = {"properties": {head: inner}, "required": [head]}
        out.setdefault("allOf", []).append({"if": cond, "else": {"required": [name]}})
    return out


def _key_schema(name: str, key: Key, parent: type | None, names: Names) -> dict[str, Any]:
    if key.type in SECTION_TYPES:
        cls = getattr(spec, key.cls) if key.cls else None
        obj = _object_schema(key.keys or {}, cls, names)
        out = {"type": "array", "items": obj} if key.type == "sections" else obj
        if key.names:
            choices = list(names.get(key.names, ()))
            text = {"type": "string", "enum": choices} if choices else {"type": "string"}
            out = {"oneOf": [text, out]}
    else:
        out = _scalar_schema(key, names)
        default = _default(key, name, parent)
        if default is not MISSING:
            out["default"] = default
    out["description"] = key.doc
    return out


def scenario_schema(names: Names | None = None) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a scenario file, derived from ``KEYS``. ``names`` holds the
    catalog names a key may take ({"gpu": [...], "node": [...], "model": [...]}), given at run time by
    the caller (the CLI reads them from the catalogs); without them those keys are any string."""
    body = _object_schema(KEYS, spec.Scenario, names or {})
    body["patternProperties"] = {"^x-": {"description": "Ignored: a place for YAML &anchors."}}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Emulator scenario",
        "description": "A training job on a cluster. Quantities carry units as strings "
                       '("200 Gb/s", "2 us", "80 GiB"); a bare number where a unit is needed is an error.',
        **body,
    }
