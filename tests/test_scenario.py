"""Scenario loading: valid files map onto the dataclasses; --set; cross-checks; the JSON Schema."""
import os
import re
import textwrap

import pytest
import yaml

from emulator.errors import ScenarioError
from emulator.scenario import (
    ClusterSpec,
    ModelSpec,
    Scenario,
    catalog,
    load_scenario,
    load_scenario_text,
    require_workload,
)
from emulator.scenario.schema import KEYS, all_key_paths, scenario_schema

DATA = os.path.join(os.path.dirname(__file__), "data", "scenario")


def load(text: str, path: str = "x.yaml", overrides=()) -> Scenario:
    return load_scenario_text(textwrap.dedent(text), path, overrides)


# ---- valid examples: the shape of a scenario file

COLLECTIVE_ONLY = """\
name: two-dgx
cluster:
  nodes: 2
  node: dgx-a100
"""

DENSE = """\
name: gpt-1.3b on 4 DGX H100
cluster:
  nodes: 4
  node: dgx-h100
  fabric:
    kind: fat_tree
    oversubscription: "2:1"
    link_bandwidth: 400 Gb/s
    latency: 1 us
model:
  layers: 24
  hidden: 2048
  heads: 16
  seq_len: 2048
  vocab: 50257
training:
  global_batch: 256
  micro_batch: 4
  recompute: selective
parallel:
  tp: 8
  pp: 2
  sequence_parallel: true
  zero: 1
  grad_bucket: 25 MB
collectives:
  algorithm: ring
simulation:
  iterations: 2
  fold: off
"""

INLINE_NODE = """\
name: home-made
cluster:
  nodes: 2
  node:
    gpus_per_node: 4
    gpu: {peak_flops: 100 TFLOP/s, hbm_bandwidth: 1 TB/s, memory: 24 GiB}
    intra: pcie
    intra_bandwidth: 32 GB/s
    nics: 1
    nic_bandwidth: 100 Gb/s
"""


def test_collective_only_scenario():
    s = load(COLLECTIVE_ONLY)
    assert s.name == "two-dgx" and s.path == "x.yaml"
    assert s.cluster == ClusterSpec(nodes=2, node=catalog.node("dgx-a100"))
    assert s.model is None and s.gpus == 16  # 2 nodes x 8
    assert s.parallel.dp == 16  # derived: 16 / (1*1*1)
    with pytest.raises(ScenarioError, match="model"):
        require_workload(s)


def test_dense_scenario_maps_onto_the_dataclasses():
    s = load(DENSE)
    f = s.cluster.fabric
    assert (f.kind, f.oversubscription, f.link_bandwidth, f.latency) == ("fat_tree", 2.0, 50e9, 1e-6)
    assert s.model == ModelSpec(layers=24, hidden=2048, heads=16, seq_len=2048, vocab=50257)
    assert (s.training.global_batch, s.training.micro_batch, s.training.recompute) == (256, 4, "selective")
    p = s.parallel
    # 32 GPUs / (tp 8 * pp 2 * cp 1) = dp 2
    assert (p.tp, p.pp, p.dp, p.zero, p.sequence_parallel) == (8, 2, 2, 1, True)
    assert p.grad_bucket == 25e6
    assert s.collectives.algorithm == "ring"
    assert (s.simulation.iterations, s.simulation.fold) == (2, "off")  # YAML 1.1 'off' is not false here
    require_workload(s)


def test_unquoted_ratio_is_not_base_60():
    # PyYAML reads a plain 2:1 as the sexagesimal integer 121; the loader reads it as 2:1
    s = load(DENSE.replace('"2:1"', "2:1"))
    assert s.cluster.fabric.oversubscription == 2.0


def test_inline_node():
    s = load(INLINE_NODE)
    n = s.cluster.node
    assert (n.name, n.gpus_per_node, n.intra, n.intra_bandwidth) == ("custom", 4, "pcie", 32e9)
    assert (n.gpu.peak_flops, n.gpu.hbm_bandwidth, n.gpu.memory_bytes) == (100e12, 1e12, 24 * 2**30)
    assert (n.nics, n.nic_bandwidth, n.intra_efficiency, n.nic_efficiency) == (1, 12.5e9, 1.0, 1.0)
    assert s.gpus == 8


def test_node_preset_with_changes():
    s = load("""\
        name: a100 with 4 rails and the 40GB part
        cluster:
          nodes: 2
          node: {preset: dgx-a100, nics: 4, gpu: A100-SXM4-40GB}
    """)
    base = catalog.node("dgx-a100")
    assert s.cluster.node.nics == 4
    assert s.cluster.node.gpu == catalog.gpu("A100-SXM4-40GB")
    assert s.cluster.node.intra_efficiency == base.intra_efficiency


def test_gpu_preset_with_changes():
    s = load("""\
        name: h100 with more memory
        cluster:
          nodes: 1
          node:
            preset: dgx-h100
            gpu: {preset: H100-SXM5-80GB, memory: 94 GB}
    """)
    assert s.cluster.node.gpu.memory_bytes == 94e9
    assert s.cluster.node.gpu.peak_flops == 989.4e12


def test_model_preset_then_fields():
    s = load("""\
        name: llama
        cluster: {nodes: 8, node: dgx-h100}
        model: {preset: LLaMA2-70B, seq_len: 2048}
        training: {global_batch: 64, micro_batch: 1}
        parallel: {tp: 8, pp: 4}
    """)
    expected = catalog.model_preset("llama2-70b")
    assert s.model.preset == "llama2-70b"
    assert (s.model.layers, s.model.hidden, s.model.seq_len) == (expected.layers, expected.hidden, 2048)
    assert s.parallel.dp == 2  # 64 / (8*4)


def test_unknown_model_preset():
    with pytest.raises(ScenarioError) as info:
        load("name: x\ncluster: {nodes: 1, node: dgx-a100}\nmodel: {preset: llama2-7}\n")
    assert str(info.value).startswith('x.yaml:3: model.preset: unknown model "llama2-7"; did you mean "llama2-7b" or "llama2-70b"?')


def test_custom_graph_and_trace_resolve_relative_to_the_scenario(tmp_path):
    path = os.path.join(DATA, "custom.yaml")
    s = load_scenario_text(textwrap.dedent("""\
        name: custom
        cluster:
          node: {gpu: H100-SXM5-80GB}
          fabric: {kind: custom, graph: graph.json}
        workload: {trace: trace.json}
    """), path)
    assert s.cluster.fabric.graph == os.path.join(DATA, "graph.json")
    assert s.workload.trace == os.path.join(DATA, "trace.json")
    # graph.json has 4 gpu nodes: 4 nodes of 1 GPU
    assert (s.cluster.nodes, s.cluster.node.gpus_per_node, s.gpus) == (4, 1, 4)
    require_workload(s)
    bare = load_scenario_text("name: c\ncluster: {fabric: {kind: custom, graph: graph.json}}\n", path)
    assert bare.cluster.node is None


def test_missing_trace_names_key_and_path():
    with pytest.raises(ScenarioError) as info:
        load_scenario_text("name: x\ncluster: {nodes: 1, node: dgx-a100}\nworkload:\n  trace: nope.json\n",
                           os.path.join(DATA, "s.yaml"))
    msg = str(info.value)
    assert msg.startswith(os.path.join(DATA, "s.yaml") + ":4: workload.trace: file not found: ")
    assert os.path.join(DATA, "nope.json") in msg


def test_load_scenario_from_a_file(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(DENSE, encoding="utf-8")
    s = load_scenario(p, overrides=["parallel.pp=4"])
    assert (s.parallel.pp, s.parallel.dp, s.path) == (4, 1, str(p))  # 32 / (8*4) = 1
    with pytest.raises(ScenarioError, match="cannot read the scenario"):
        load_scenario(tmp_path / "missing.yaml")


# ---- --set overrides

def test_set_overrides():
    s = load(DENSE, overrides=["parallel.tp=4", "cluster.fabric.oversubscription=3",
                               "cluster.node.nics=4", "simulation.detail=op", "model.vocab=32000"])
    # 32 GPUs / (4*2) = dp 4; global_batch 256 % (4*4) == 0
    assert (s.parallel.tp, s.parallel.dp) == (4, 4)
    assert s.cluster.fabric.oversubscription == 3.0
    assert s.cluster.node.nics == 4 and s.cluster.node.name == "dgx-h100"
    assert s.simulation.detail == "op" and s.model.vocab == 32000


def test_set_creates_missing_sections():
    s = load(COLLECTIVE_ONLY, overrides=["cluster.fabric.link_bandwidth=400 Gb/s", "parallel.tp=4",
                                         "cluster.fabric.torus_dims=[2, 8]", "cluster.fabric.kind=torus"])
    assert s.cluster.fabric.link_bandwidth == 50e9 and s.parallel.tp == 4  # 400 Gb/s / 8 bits = 50 GB/s
    assert s.cluster.fabric.torus_dims == (2, 8)


def test_set_an_empty_value_restores_the_default():
    s = load(DENSE, overrides=["cluster.fabric.link_bandwidth="])
    assert s.cluster.fabric.link_bandwidth is None


@pytest.mark.parametrize("override, message", [
    ("parallel.tpp=3", '--set parallel.tpp=3: parallel.tpp: unknown key "tpp"; did you mean "tp" or "pp"?'),
    ("tp=4", '--set tp=4: tp: unknown key "tp"; did you mean "parallel.tp"?'),
    ("parallel.tp", '--set parallel.tp: expected key.path=value, e.g. "parallel.tp=4"'),
    ("parallel.tp=four", '--set parallel.tp=four: parallel.tp: expected an integer, got "four"'),
    ("cluster.fabric.link_bandwidth=200",
     '--set cluster.fabric.link_bandwidth=200: cluster.fabric.link_bandwidth: expected a bandwidth '
     'with a unit such as "200 Gb/s" or "25 GB/s", got the bare number 200'),
])
def test_bad_set(override, message):
    with pytest.raises(ScenarioError) as info:
        load(DENSE, overrides=[override])
    assert str(info.value) == message


# ---- cross-checks (Megatron's rules)

@pytest.mark.parametrize("override, key, needle", [
    ("parallel.dp=3", "parallel.dp", "tp*pp*dp*cp = 8*2*3*1 = 48, but the cluster has 32 GPUs (4 nodes x 8)"),
    ("parallel.tp=3", "parallel", "tp*pp*cp = 3*2*1 = 6 does not divide the 32 GPUs"),
    ("parallel.ep=4", "parallel.ep", "ep (4) must divide dp*cp = 2*1 = 2"),
    ("parallel.ep=2", "parallel.ep", "ep = 2 needs an MoE model"),
    ("training.global_batch=255", "training.global_batch", "must be divisible by micro_batch*dp = 4*2 = 8"),
    ("model.layers=25", "parallel.pp", "model.layers (25) must be divisible by pp*virtual_stages = 2*1 = 2"),
    ("model.heads=12", "model.heads", "hidden (2048) must be divisible by heads (12)"),
    ("model.heads=4", "parallel.tp", "model.heads (4) must be divisible by tp (8)"),
    ("parallel.virtual_stages=2", "parallel.virtual_stages", "needs schedule: interleaved-1f1b"),
    ("parallel.zero=4", "parallel.zero", "expected an integer from 0 to 3, got 4"),
    ("parallel.schedule=zb", "parallel.schedule", "expected one of gpipe, 1f1b, interleaved-1f1b"),
    ("cluster.fabric.oversubscription=0.5", "cluster.fabric.oversubscription", "from 1 to"),
    ("cluster.fabric.kind=clos", "cluster.fabric.kind", "expected one of single_switch, fat_tree"),
    ("cluster.fabric.kind=custom", "cluster.fabric.graph", 'kind "custom" needs a graph file'),
    ("cluster.nodes=0", "cluster.nodes", "expected an integer from 1 to 1000000, got 0"),
    ("model.seq_len=2047", "parallel.cp", "must be divisible by cp*tp = 1*8 = 8"),
    ("model.vocab=50000", "model.vocab", None),  # nothing constrains the vocabulary: no error
])
def test_cross_checks(override, key, needle):
    if needle is None:
        load(DENSE, overrides=[override])
        return
    with pytest.raises(ScenarioError) as info:
        load(DENSE, overrides=[override])
    assert info.value.key == key
    assert needle in str(info.value)
    assert re.match(r"^(x\.yaml:\d+|--set [^:]+): ", str(info.value))


def test_interleaved_needs_microbatches_multiple_of_pp():
    # 256 / (micro 4 * dp 2) = 32 micro-batches, pp 2: fine; layers 24 % (2*3) == 0
    load(DENSE, overrides=["parallel.schedule=interleaved-1f1b", "parallel.virtual_stages=3"])
    with pytest.raises(ScenarioError, match=r"= 3\) to be a multiple of pp \(2\)"):
        # 24 / (4 * 2) = 3 micro-batches
        load(DENSE, overrides=["parallel.schedule=interleaved-1f1b", "training.global_batch=24"])


def test_model_without_global_batch_is_refused():
    with pytest.raises(ScenarioError, match="training.global_batch: this key is required with a model"):
        load(DENSE.replace("  global_batch: 256\n", ""))


def test_anchors_and_merge_keys_work():
    s = load("""\
        x-node: &node {preset: dgx-a100, nics: 2}
        name: anchors
        cluster:
          nodes: 2
          node: {<<: *node, nics: 4}
    """)
    assert s.cluster.node.nics == 4


def test_overrides_list():
    s = load(COLLECTIVE_ONLY + """\
  overrides:
    - {kind: gpu_slowdown, target: "gpu:3", factor: 1.5}
    - {kind: link_degrade, target: "nic3.0", factor: 0.5, extra_latency: 2 us}
""")
    o = s.cluster.overrides
    assert (o[0].kind, o[0].target, o[0].factor) == ("gpu_slowdown", "gpu:3", 1.5)
    assert (o[1].target, o[1].extra_latency) == ("nic3.0", 2e-6)


# ---- the JSON Schema, derived from the same key table

def _validate(instance, schema, path="$"):
    """A small draft 2020-12 validator for the keywords scenario_schema() uses; returns errors."""
    errs = []
    if "oneOf" in schema:
        ok = [s for s in schema["oneOf"] if not _validate(instance, s, path)]
        if len(ok) != 1:
            errs.append(f"{path}: matches {len(ok)} of oneOf")
        return errs
    for sub in schema.get("allOf", []):
        if "if" in sub:
            branch = sub.get("then") if not _validate(instance, sub["if"], path) else sub.get("else")
            errs += _validate(instance, branch or {}, path)
    t = schema.get("type")
    types = {"object": dict, "array": list, "string": str, "boolean": bool}
    if t in types and not isinstance(instance, types[t]):
        return errs + [f"{path}: not {t}"]
    if t in ("integer", "number"):
        if isinstance(instance, bool) or not isinstance(instance, int if t == "integer" else (int, float)):
            return errs + [f"{path}: not {t}"]
        if "minimum" in schema and instance < schema["minimum"]:
            errs.append(f"{path}: below minimum")
        if "maximum" in schema and instance > schema["maximum"]:
            errs.append(f"{path}: above maximum")
        if "exclusiveMinimum" in schema and instance <= schema["exclusiveMinimum"]:
            errs.append(f"{path}: not above exclusiveMinimum")
    if "const" in schema and instance != schema["const"]:
        errs.append(f"{path}: not const")
    if "enum" in schema and instance not in schema["enum"]:
        errs.append(f"{path}: not in enum")
    if "pattern" in schema and isinstance(instance, str) and not re.search(schema["pattern"], instance):
        errs.append(f"{path}: does not match pattern")
    if isinstance(instance, dict):
        for k in schema.get("required", []):
            if k not in instance:
                errs.append(f"{path}: missing {k}")
        for k, v in instance.items():
            if k in schema.get("properties", {}):
                errs += _validate(v, schema["properties"][k], f"{path}.{k}")
            elif not any(re.search(p, k) for p in schema.get("patternProperties", {})):
                if schema.get("additionalProperties") is False:
                    errs.append(f"{path}: unknown {k}")
    if isinstance(instance, list):
        for i, item in enumerate(instance):
            errs += _validate(item, schema.get("items", {}), f"{path}[{i}]")
    return errs


def _schema_of(path: str, schema: dict) -> dict:
    for part in path.split("."):
        if "oneOf" in schema:  # a catalog name, or a mapping
            schema = schema["oneOf"][1]
        if schema.get("type") == "array":
            schema = schema["items"]
        schema = schema["properties"][part]
    return schema


NAMES = {"gpu": catalog.gpu_names(), "node": catalog.node_names(), "model": catalog.model_names()}


def test_schema_shape():
    schema = scenario_schema(NAMES)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["required"] == ["name", "cluster"]
    assert schema["additionalProperties"] is False
    for path in all_key_paths():  # every key of the table is in the schema, with a description
        assert _schema_of(path, schema)["description"]
    assert _schema_of("parallel.schedule", schema)["enum"] == ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "dualpipev", "dualpipe"]
    assert _schema_of("parallel.zero", schema)["maximum"] == 3
    assert _schema_of("simulation.iterations", schema)["default"] == 1
    assert _schema_of("parallel.grad_bucket", schema)["default"] == "1e+08 B"  # ParallelSpec default
    node = _schema_of("cluster.node", schema)
    assert "dgx-a100" in node["oneOf"][0]["enum"]  # catalog names, given at run time
    assert "enum" not in _schema_of("cluster.node", scenario_schema())["oneOf"][0]  # none given: any name
    bw = _schema_of("cluster.fabric.link_bandwidth", schema)["pattern"]
    assert re.search(bw, "200 Gb/s") and not re.search(bw, "200")
    assert set(schema["properties"]) == set(KEYS)


@pytest.mark.parametrize("text", [COLLECTIVE_ONLY, DENSE, INLINE_NODE])
def test_valid_examples_validate_against_the_schema(text):
    instance = yaml.safe_load(text)
    if "simulation" in instance:
        instance["simulation"]["fold"] = "off"  # YAML 1.2 (editors) reads off as a string
    assert _validate(instance, scenario_schema(NAMES)) == []


@pytest.mark.parametrize("bad", [
    {"name": "x"},  # no cluster
    {"name": "x", "cluster": {"nodes": 1, "node": "dgx-a100"}, "parallel": {"tpp": 2}},
    {"name": "x", "cluster": {"nodes": 1, "node": "dgx-a100", "fabric": {"link_bandwidth": "200"}}},
    {"name": "x", "cluster": {"nodes": 1, "node": "dgx-a1000"}},
    {"name": "x", "cluster": {"nodes": 1}},  # node needed unless the fabric is custom
])
def test_invalid_examples_fail_both_schema_and_loader(bad):
    assert _validate(bad, scenario_schema(NAMES))
    with pytest.raises(ScenarioError):
        load_scenario_text(yaml.safe_dump(bad), "bad.yaml")


def test_custom_fabric_waives_nodes_in_the_schema():
    ok = {"name": "x", "cluster": {"fabric": {"kind": "custom", "graph": "g.json"}}}
    assert _validate(ok, scenario_schema()) == []


def test_sequence_parallel_splits_the_sequence_over_cp_and_tp():
    # DENSE has sequence_parallel, tp 8, cp 1: seq_len 2044 % 8 = 4
    with pytest.raises(ScenarioError, match=r"seq_len \(2044\) must be divisible by cp\*tp = 1\*8 = 8"):
        load(DENSE, overrides=["model.seq_len=2044"])
    # kv_heads 4 with tp 8: 8 % 4 == 0, the kv heads are replicated: allowed; kv_heads 3 is not
    load(DENSE, overrides=["model.kv_heads=4"])
    with pytest.raises(ScenarioError, match=r"kv_heads \(3\)"):
        load(DENSE, overrides=["model.kv_heads=3", "model.heads=48", "model.hidden=3072"])
