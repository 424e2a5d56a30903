"""Scenario keys: what a field of the spec says about the key a scenario file gives it.

A field of a spec dataclass (spec.py) is a scenario key when it is declared with
:func:`key`, which puts a :class:`Key` (help text, unit kind, allowed values, bounds,
whether it is required, a catalog name that may stand in) into the field's metadata.
A field that is the loader's own bookkeeping, never written in a file, is declared with
:func:`internal`. A key that the file gives and the spec does not keep (``cluster.catalog``,
a ``preset`` to start from, a job's ``count``) is declared on its class with
:func:`file_key`, in the class variable ``FILE_KEYS``.

:func:`key_table` walks a dataclass with :func:`typing.get_type_hints` and returns its
keys, in field order, with the types filled in from the annotations:

- ``int``, ``float``, ``bool``, ``str`` → ``int``, ``number``, ``bool``, ``str`` (``enum``
  with ``choices``); ``X | None`` reads as ``X``;
- ``float`` with ``unit=`` → the unit kind of units.py (``bytes``, ``time``, ``bandwidth``,
  ``flops_rate``), read with its unit ("200 Gb/s") and kept in SI;
- ``tuple[int, ...]`` → ``int_list``; ``tuple[float, ...]`` → ``number_list``; ``tuple[str, ...]``
  with ``choices`` → ``name_list`` (names from the choices, none twice);
- a spec dataclass → ``section`` (a mapping of its own keys); ``tuple[Spec, ...]`` → ``sections``;
- ``kind=`` names the kinds an annotation cannot tell: ``ratio`` (0.8, "230/300", "2:1"),
  ``path`` (a file, relative to the scenario), ``axis_order``, ``placement`` and ``expert_load`` (numbers
  per expert: one list, a list per layer, or a file of them).

Every table the reader, the catalog, the JSON Schema (schema.py) and the reference page
use is this walk's result; nothing else describes a key.
"""
from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import MISSING, dataclass
from typing import Any, Callable, Mapping, NamedTuple

from emulator.scenario.units import KINDS as UNIT_KINDS

UNIT_TYPES = tuple(UNIT_KINDS)  # bytes, time, bandwidth, flops_rate, flops
SECTION_TYPES = ("section", "sections")
MAX_COUNT = 10**9  # default upper bound of an integer or number key

# Physical bounds of link and device figures (the rule book refuses values outside them):
# - no link is slower than 1 Mb/s (125 kB/s): 1/10 of the first Ethernet (IEEE 802.3, 1983: 10 Mb/s);
#   a smaller figure is a typo in the unit (1e-300 Gb/s, "200 b/s" for "200 Gb/s");
# - no latency or fixed cost is longer than 1 s: light in fibre (2e8 m/s) goes once round the
#   Earth (40,075 km) in 0.2 s, and a kernel launch or collective step costs microseconds.
MIN_BANDWIDTH = 125e3  # B/s (1 Mb/s)
MAX_LATENCY = 1.0  # s

KEY = "scenario_key"  # the field-metadata entry that holds a field's Key
INTERNAL = "internal"  # the field-metadata entry of a field that is not a key: why it is kept
# kind= → the annotation it needs
_KINDS = {"ratio": float, "path": str, "axis_order": tuple, "placement": str, "expert_load": tuple,
          "layer_list": tuple}


@dataclass(frozen=True)
class Key:
    """One key of a scenario file."""

    type: str
    doc: str
    required: bool = False
    enum: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    positive: bool = False  # strictly more than 0 (unit types, numbers)
    attr: str | None = None  # dataclass field name, when it differs from the key
    keys: Mapping[str, "Key"] | None = None  # for section / sections
    names: str | None = None  # "gpu" | "node" | "model": a catalog name may stand in
    cls: str | None = None  # dataclass of emulator.scenario this section becomes
    required_unless: tuple[str, str] | None = None  # (sibling key path, value) that waives it


class FileKey(NamedTuple):
    """A key the file gives and the spec does not keep: its name, the key it follows ("": first), the Key."""

    name: str
    after: str
    key: Key


def key(doc: str, *, default: Any = MISSING, factory: Callable[[], Any] | None = None, unit: str | None = None,
        kind: str | None = None, choices: tuple[str, ...] = (), minimum: float | None = None,
        maximum: float | None = None, positive: bool = False, required: bool = False,
        required_unless: tuple[str, str] | None = None, catalog: str | None = None, name: str | None = None) -> Any:
    """A spec field that is a scenario key (a ``dataclasses.field`` with the key in its metadata).

    ``doc``: the help text (the JSON Schema's description and the reference page's entry).
    ``default`` / ``factory``: the field's default (none: the dataclass needs it). ``unit``: a unit
    kind of units.py. ``kind``: ratio, path, axis_order, placement, expert_load or layer_list (one integer a layer,
    in the key's bounds). ``choices``: the allowed
    values of a string. ``minimum`` / ``maximum`` / ``positive``: bounds (inclusive; positive: > 0).
    ``required``: the file must give it (``required_unless``: (sibling key path, value) that
    waives it). ``catalog``: gpu, node or model, whose names may stand in for it. ``name``: the
    key's name in the file, where it differs from the field's.
    """
    meta = _key(doc, unit, kind, choices, minimum, maximum, positive, required, required_unless, catalog, name)
    metadata = {KEY: meta}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def file_key(name: str, doc: str, *, after: str = "", unit: str | None = None, kind: str | None = None,
             choices: tuple[str, ...] = (), minimum: float | None = None, maximum: float | None = None,
             positive: bool = False, catalog: str | None = None, type: str = "") -> FileKey:
    """A key of the file that the spec does not keep (the reader consumes it), listed after the key
    ``after`` ("": first). ``type``: int, number, str, bool or a unit kind; the rest as :func:`key`."""
    meta = _key(doc, unit, kind, choices, minimum, maximum, positive, False, None, catalog, None)
    typed = meta.type or type or ("enum" if choices else "")
    if typed not in (*UNIT_TYPES, *_KINDS, "int", "number", "bool", "str", "enum"):
        raise TypeError(f"file_key {name}: give type= (int, number, str, bool) or unit=, got {typed!r}")
    return FileKey(name, after, dataclasses.replace(meta, type=typed))


def internal(doc: str, *, default: Any = MISSING, factory: Callable[[], Any] | None = None) -> Any:
    """A spec field that is no scenario key (the loader fills it in); ``doc`` says what it holds."""
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata={INTERNAL: doc})
    return dataclasses.field(default=default, metadata={INTERNAL: doc})


def _key(doc: str, unit: str | None, kind: str | None, choices: tuple[str, ...], minimum: float | None,
         maximum: float | None, positive: bool, required: bool, required_unless: tuple[str, str] | None,
         catalog: str | None, name: str | None) -> Key:
    if unit is not None and unit not in UNIT_TYPES:
        raise TypeError(f"unit {unit!r}: expected one of {', '.join(UNIT_TYPES)}")
    if kind is not None and kind not in _KINDS:
        raise TypeError(f"kind {kind!r}: expected one of {', '.join(_KINDS)}")
    if not doc.strip():
        raise TypeError("a scenario key needs its help text (doc)")
    typed = unit or kind or ("enum" if choices else "")
    return Key(typed, doc, required=required, enum=tuple(choices), minimum=minimum, maximum=maximum,
               positive=positive, attr=name, names=catalog, required_unless=required_unless)


# ------------------------------------------------------------------ the walk


@functools.cache
def key_table(cls: type) -> dict[str, Key]:
    """The keys of the spec dataclass ``cls``, by their name in the file, in field order (with the
    class's ``FILE_KEYS`` placed after the key each names); sections hold their own tables."""
    hints = typing.get_type_hints(cls)
    table: dict[str, Key] = {}
    for f in dataclasses.fields(cls):
        meta = f.metadata.get(KEY)
        if meta is None:
            if INTERNAL not in f.metadata:
                raise TypeError(f"{cls.__name__}.{f.name}: declare a spec field with key(...) (a scenario key) "
                                "or internal(...) (not one); see emulator/scenario/spec.py")
            continue
        name = meta.attr or f.name
        attr = f.name if name != f.name else None
        table[name] = dataclasses.replace(_typed(cls, f.name, hints[f.name], meta), attr=attr)
    for extra in getattr(cls, "FILE_KEYS", ()):
        table = _insert(table, extra)
    return table


def _insert(table: dict[str, Key], extra: FileKey) -> dict[str, Key]:
    if extra.after and extra.after not in table:
        raise TypeError(f"file key {extra.name}: after={extra.after!r} is no key of its section")
    items = list(table.items())
    at = 0 if not extra.after else [n for n, _ in items].index(extra.after) + 1
    items.insert(at, (extra.name, extra.key))
    return dict(items)


def _typed(cls: type, field: str, hint: Any, meta: Key) -> Key:
    """``meta`` with its type (and, for a section, its keys and class) read from the annotation."""
    where = f"{cls.__name__}.{field}"
    base = _without_none(hint)
    item = _items_of(base)
    if _is_spec(base):
        return dataclasses.replace(meta, type="section", keys=key_table(base), cls=base.__name__)
    if item is not None and _is_spec(item):
        return dataclasses.replace(meta, type="sections", keys=key_table(item), cls=item.__name__)
    if item is str and meta.type == "enum":
        return dataclasses.replace(meta, type="name_list")
    if meta.type:
        _check_kind(where, base, meta.type)
        return meta
    plain = {bool: "bool", int: "int", float: "number", str: "str"}
    if base in plain:
        return dataclasses.replace(meta, type=plain[base])
    lists = {int: "int_list", float: "number_list"}
    if item in lists:
        return dataclasses.replace(meta, type=lists[item])
    raise TypeError(f"{where}: no key type for the annotation {hint!r}; give kind= or unit=")


def _check_kind(where: str, base: Any, typed: str) -> None:
    needed: Any = float if typed in UNIT_TYPES else str if typed == "enum" else _KINDS[typed]
    actual = typing.get_origin(base) or base
    if actual is not needed:
        raise TypeError(f"{where}: a key of kind {typed} is annotated {needed.__name__}, not {base!r}")


def _without_none(hint: Any) -> Any:
    """``X | None`` → ``X``."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def _items_of(hint: Any) -> Any:
    """``tuple[X, ...]`` → ``X``; anything else → None."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is tuple and len(args) == 2 and args[1] is Ellipsis:
        return args[0]
    return None


def _is_spec(hint: Any) -> bool:
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def all_key_paths(keys: Mapping[str, Key], prefix: str = "") -> list[str]:
    """Every dotted key path of a table (sections included), e.g. ``parallel.tp``."""
    out: list[str] = []
    for name, k in keys.items():
        path = f"{prefix}{name}"
        out.append(path)
        if k.keys is not None:
            out.extend(all_key_paths(k.keys, path + "."))
    return out
