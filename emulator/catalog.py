"""The hardware catalog: GPU and node presets (emulator/data/catalog.yaml).

The YAML file holds the figures with their units and sources (hardware.csv and
nccl.csv rows of the calibration set, or vendor datasheets); this module turns
them into :class:`GpuSpec` and :class:`NodeSpec` with SI values, reading each
key with the same key table as a scenario's inline node (emulator/schema.py).
"""
from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Any, Mapping

import yaml

from .errors import CatalogError, EmulatorError, UnitError, did_you_mean
from .scenario import GpuSpec, NodeSpec
from .schema import GPU_KEYS, NODE_KEYS, UNIT_TYPES, Key
from .units import PARSERS, parse_ratio

_META = ("source",)


def _convert(name: str, key: Key, value: Any) -> Any:
    if key.type in UNIT_TYPES:
        return PARSERS[key.type](value)
    if key.type == "ratio":
        return parse_ratio(value)
    if key.type == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise UnitError(f"expected an integer, got {value!r}")
        return value
    return str(value)


def _fields(entry_name: str, entry: Mapping[str, Any], keys: Mapping[str, Key]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in entry.items():
        if name in _META or name == "gpu":
            continue
        if name not in keys:
            raise EmulatorError(f"catalog.yaml: {entry_name}: unknown key {name!r}")
        try:
            out[keys[name].attr or name] = _convert(name, keys[name], value)
        except UnitError as err:
            raise EmulatorError(f"catalog.yaml: {entry_name}.{name}: {err}") from None
    return out


def _parse(raw: Any, base_gpus: Mapping[str, GpuSpec]) -> tuple[dict[str, GpuSpec], dict[str, NodeSpec]]:
    if not isinstance(raw, dict):
        raise EmulatorError("catalog.yaml: expected a mapping with 'gpus' and/or 'nodes'")
    gpus = {n: GpuSpec(name=n, **_fields(n, e, GPU_KEYS)) for n, e in (raw.get("gpus") or {}).items()}
    known = {**base_gpus, **gpus}
    nodes: dict[str, NodeSpec] = {}
    for n, e in (raw.get("nodes") or {}).items():
        g = e.get("gpu") if isinstance(e, dict) else None
        if g not in known:
            raise EmulatorError(f"catalog.yaml: {n}.gpu: unknown GPU {g!r}")
        try:
            nodes[n] = NodeSpec(name=n, gpu=known[g], **_fields(n, e, NODE_KEYS))
        except TypeError as err:  # a missing field: say which
            missing = str(err).partition("argument")[2].strip(": s")
            raise EmulatorError(f"catalog.yaml: {n}: missing {missing}") from None
    return gpus, nodes


@lru_cache(maxsize=1)
def _data() -> tuple[dict[str, GpuSpec], dict[str, NodeSpec]]:
    text = resources.files("emulator").joinpath("data/catalog.yaml").read_text(encoding="utf-8")
    return _parse(yaml.safe_load(text), {})


def load_user_catalog(path: str) -> tuple[dict[str, GpuSpec], dict[str, NodeSpec]]:
    """A user's catalog file (the shape of catalog.yaml, e.g. from ``emulator calibrate``),
    merged over the built-in one. Errors name the file."""
    try:
        with open(path, encoding="utf-8") as fh:
            raw = yaml.safe_load(fh)
        gpus, nodes = _parse(raw, _data()[0])
    except (OSError, yaml.YAMLError) as err:
        raise EmulatorError(f"{path}: cannot read the catalog: {err}") from None
    except EmulatorError as err:
        raise EmulatorError(str(err).replace("catalog.yaml", path, 1)) from None
    return {**_data()[0], **gpus}, {**_data()[1], **nodes}


def _lookup(table: Mapping[str, Any], name: object, what: str) -> Any:
    text = str(name)
    if text in table:
        return table[text]
    folded = {k.lower(): k for k in table}
    if text.lower() in folded:
        return table[folded[text.lower()]]
    raise CatalogError(unknown_name_message(text, list(table), what))


def unknown_name_message(name: str, known: list[str], what: str) -> str:
    """'unknown GPU "H100"; did you mean "H100-SXM5-80GB"? (known: ...)'"""
    return f'unknown {what} "{name}"{did_you_mean(name, known)} (known: {", ".join(known)})'


def gpu(name: str, user: str | None = None) -> GpuSpec:
    """A catalog GPU by name (case-insensitive); unknown names raise CatalogError."""
    return _lookup(load_user_catalog(user)[0] if user else _data()[0], name, "GPU")


def node(name: str, user: str | None = None) -> NodeSpec:
    """A catalog node by name (case-insensitive), also from a ``user`` catalog file."""
    return _lookup(load_user_catalog(user)[1] if user else _data()[1], name, "node")


def gpu_names() -> list[str]:
    return list(_data()[0])


def node_names() -> list[str]:
    return list(_data()[1])

