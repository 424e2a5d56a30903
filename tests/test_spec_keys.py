"""The spec's fields are the one description of the scenario keys: the key table, the JSON Schema and
the reference page are derived from them (emulator/scenario/keys.py, schema.py, docs/reference_pages.py)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from emulator.scenario import spec
from emulator.scenario.keys import INTERNAL, KEY, Key, file_key, internal, key, key_table
from emulator.scenario.schema import KEYS, all_key_paths, scenario_schema


def _spec_classes(cls: type = spec.Scenario, seen: dict[str, type] | None = None) -> dict[str, type]:
    """Every spec dataclass reachable from Scenario, by name."""
    seen = {} if seen is None else seen
    seen[cls.__name__] = cls
    for k in key_table(cls).values():
        if k.cls is not None and k.cls not in seen:
            _spec_classes(getattr(spec, k.cls), seen)
    return seen


def _schema_paths(node: dict, prefix: str = "") -> set[str]:
    """Every dotted key path of the JSON Schema (list items and oneOf branches add no path element)."""
    out = set()
    for name, sub in node.get("properties", {}).items():
        out.add(prefix + name)
        for branch in sub.get("oneOf", [sub]):
            inner = branch.get("items") if branch.get("type") == "array" else branch
            if isinstance(inner, dict) and inner.get("type") == "object":
                out |= _schema_paths(inner, prefix + name + ".")
    return out


def test_every_spec_field_is_a_key_with_a_description_or_internal_with_a_reason():
    classes = _spec_classes()
    # the sections of a scenario file: Scenario and the 14 dataclasses below it
    assert len(classes) == 15, sorted(classes)
    for name, cls in classes.items():
        for f in dataclasses.fields(cls):
            meta = f.metadata.get(KEY)
            if meta is None:
                assert f.metadata.get(INTERNAL, "").strip(), f"{name}.{f.name}: neither key(...) nor internal(...)"
            else:
                assert meta.doc.strip().endswith((".", ")")), f"{name}.{f.name}: no description"


def test_the_schema_covers_every_spec_field():
    paths = _schema_paths(scenario_schema())
    assert paths == set(all_key_paths())

    def visit(cls: type, prefix: str) -> None:
        table = key_table(cls)
        by_field = {(k.attr or n): n for n, k in table.items()}
        for f in dataclasses.fields(cls):
            if KEY not in f.metadata:
                continue
            path = prefix + by_field[f.name]
            assert path in paths, f"{cls.__name__}.{f.name} is missing from the schema"
            k = table[by_field[f.name]]
            if k.cls is not None:
                visit(getattr(spec, k.cls), path + ".")

    visit(spec.Scenario, "")
    # a field whose key has another name in the file: GpuSpec.memory_bytes is `memory`
    assert "cluster.node.gpu.memory" in paths and "cluster.node.gpu.memory_bytes" not in paths


def test_schema_descriptions_and_defaults_come_from_the_fields():
    props = scenario_schema()["properties"]
    tp = next(f for f in dataclasses.fields(spec.ParallelSpec) if f.name == "tp")
    assert props["parallel"]["properties"]["tp"]["description"] == tp.metadata[KEY].doc
    assert props["parallel"]["properties"]["tp"]["default"] == 1  # ParallelSpec.tp's default
    # a unit kind prints its default in SI with the unit: FabricSpec.latency = 1e-6 s
    assert props["cluster"]["properties"]["fabric"]["properties"]["latency"]["default"] == "1e-06 s"


def test_file_keys_sit_where_the_class_places_them():
    # GpuSpec/NodeSpec: preset first; ClusterSpec: catalog after overrides; JobSpec: count, stagger after start
    assert list(KEYS["cluster"].keys or {})[-1] == "catalog"
    node = KEYS["cluster"].keys["node"].keys  # type: ignore[index]
    assert list(node)[:2] == ["preset", "name"] and list(node["gpu"].keys)[:2] == ["preset", "name"]
    jobs = list(KEYS["jobs"].keys or {})
    assert jobs[jobs.index("start") + 1: jobs.index("start") + 3] == ["count", "stagger"]


@dataclass(frozen=True)
class _Inner:
    size: float = key('A size, e.g. "2 GiB".', default=0.0, unit="bytes", positive=True)


@dataclass(frozen=True)
class _Outer:
    count: int = key("A count.", default=1, minimum=1)
    mode: str = key("A mode.", default="a", choices=("a", "b"))
    ratio: float = key("A ratio.", default=0.5, kind="ratio")
    dims: tuple[int, ...] = key("Dimensions.", default=())
    inner: _Inner | None = key("A section.", default=None)
    items: tuple[_Inner, ...] = key("A list of sections.", default=())
    flag: bool | None = key("A flag.", default=None)
    note: str = internal("Bookkeeping.", default="")


def test_the_walk_reads_each_type_from_the_annotation():
    table = key_table(_Outer)
    assert [(n, k.type) for n, k in table.items()] == [
        ("count", "int"), ("mode", "enum"), ("ratio", "ratio"), ("dims", "int_list"), ("inner", "section"),
        ("items", "sections"), ("flag", "bool")]
    assert table["inner"].keys == {"size": Key("bytes", 'A size, e.g. "2 GiB".', positive=True)}
    assert table["items"].cls == "_Inner" and table["mode"].enum == ("a", "b")


def test_a_field_without_key_or_internal_is_refused():
    @dataclass(frozen=True)
    class Bare:
        undocumented: int = 0

    with pytest.raises(TypeError, match=r"Bare.undocumented: declare a spec field with key"):
        key_table(Bare)


def test_a_unit_on_a_field_that_is_no_float_is_refused():
    @dataclass(frozen=True)
    class Wrong:
        size: int = key("A size.", default=0, unit="bytes")

    with pytest.raises(TypeError, match=r"Wrong.size: a key of kind bytes is annotated float"):
        key_table(Wrong)


def test_a_key_needs_its_text_and_a_file_key_its_type():
    with pytest.raises(TypeError, match="help text"):
        key(" ")
    with pytest.raises(TypeError, match="give type="):
        file_key("x", "An untyped key.")


def test_every_default_the_schema_prints_is_a_value_the_key_accepts():
    # a field's "not given" sentinel (model.layers 0 with minimum 1, model.norm "" outside its choices,
    # nvls_busbw "0 B/s" below 1 Mb/s) is no default a file could write, so the schema prints none
    found = []

    def visit(node: dict, path: str) -> None:
        for name, sub in node.get("properties", {}).items():
            if "default" in sub:
                d = sub["default"]
                found.append(path + name)
                assert "enum" not in sub or d in sub["enum"], path + name
                if isinstance(d, (int, float)) and not isinstance(d, bool):
                    assert sub.get("minimum", d) <= d <= sub.get("maximum", d), path + name
                    assert d > sub.get("exclusiveMinimum", d - 1), path + name
            for branch in sub.get("oneOf", [sub]):
                inner = branch.get("items") if branch.get("type") == "array" else branch
                if isinstance(inner, dict) and inner.get("type") == "object":
                    visit(inner, path + name + ".")

    visit(scenario_schema(), "")
    props = scenario_schema()["properties"]
    assert "default" not in props["model"]["properties"]["layers"]
    assert "default" not in props["model"]["properties"]["norm"]
    assert props["model"]["properties"]["kv_heads"]["default"] == 0  # 0 is a value it takes: "as heads"
    node = props["cluster"]["properties"]["node"]["oneOf"][1]["properties"]
    assert "default" not in node["nvls_busbw"] and node["step_latency_intra"]["default"] == "0 s"
    assert "parallel.tp" in found and "simulation.fold" in found
