"""Bad scenario input: every malformed text gives a one-line ScenarioError (or loads), nothing else.

A deterministic fuzz (fixed seed) mutates a valid scenario; explicit cases pin the
message shape: FILE:LINE: key.path: expected ..., got ... (and "did you mean").
"""
import random
import textwrap

import pytest

from emulator.errors import EmulatorError, ScenarioError
from emulator.scenario import Scenario, load_scenario, load_scenario_text

VALID = """\
name: fuzz base
cluster:
  nodes: 2
  node: dgx-a100
  fabric:
    kind: fat_tree
    oversubscription: 2
    link_bandwidth: 200 Gb/s
    latency: 1 us
  overrides:
    - {kind: gpu_slowdown, target: "gpu:1", factor: 1.5}
model:
  layers: 24
  hidden: 2048
  heads: 16
  seq_len: 2048
  vocab: 50257
training:
  global_batch: 64
  micro_batch: 2
  precision: bf16
parallel:
  tp: 4
  pp: 2
  zero: 1
  schedule: 1f1b
  grad_bucket: 25 MB
collectives:
  algorithm: auto
simulation:
  iterations: 1
  fold: auto
"""

JUNK_VALUES = [
    "true", "no", "[]", "{}", "[1, 2]", "{a: 1}", "1e400", "1.0e400", "1" + "0" * 100, "9" * 5000,
    "-1", "-1e9", ".nan", ".inf", "-.inf", "~", "''", '""', "0x10", "0o7", "2:1", "1:2:3",
    "!!binary aGVsbG8=", "!!python/object:os.system x", "!custom x", "caf\u00e9", "\u00b5s", "200",
    "200 Gb", "200 GB", "3 parsecs", "*nope", "&a 1", "&a [*a]", "|\n  block", ">\n  folded",
    "2024-01-01", "null", "0", "0.0", "1_000", "+5", "'200 Gb/s'", "- 1\n- 2", "@", "`", "%",
]
JUNK_BYTES = [b"\x00", b"\xff", b"\xfe\xff", b"\t", b":", b"{", b"[", b"&", b"*", b"!", b"%", b"@",
              b"`", b"|", b">", b"'", b'"', b"\r", b"\xc3", b"\xe2\x80", b"-", b"?", b"#", b"\n  "]
UNKNOWN_KEYS = ["fabirc", "tpp", "nodez", "Name", "clustr", "xyzzy", "layer", "global-batch", "tp"]
LAUGHS = ("lol: &l0 [a, a, a, a, a, a, a, a, a, a]\n"
          + "".join(f"lol{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]\n" for i in range(1, 9)))


def _key_lines(lines: list[str]) -> list[int]:
    return [i for i, line in enumerate(lines) if ":" in line and not line.lstrip().startswith("-")]


def mutate(rng: random.Random, text: str) -> str | bytes:
    lines = text.splitlines()
    if not _key_lines(lines) or not lines or not any(line and not line.startswith(" ") for line in lines):
        return text + rng.choice(JUNK_VALUES) + "\n"
    op = rng.randrange(11)
    if op == 0:  # delete a line
        del lines[rng.randrange(len(lines))]
    elif op == 1:  # duplicate a line (duplicate key)
        i = rng.randrange(len(lines))
        lines.insert(i, lines[i])
    elif op == 2:  # replace a value
        i = rng.choice(_key_lines(lines))
        head = lines[i].split(":", 1)[0]
        lines[i] = f"{head}: {rng.choice(JUNK_VALUES)}"
    elif op == 3:  # junk bytes somewhere
        raw = text.encode("utf-8")
        at = rng.randrange(len(raw))
        return raw[:at] + rng.choice(JUNK_BYTES) * rng.randint(1, 3) + raw[at:]
    elif op == 4:  # misspell a key
        i = rng.choice(_key_lines(lines))
        head, tail = lines[i].split(":", 1)
        name = head.strip()
        if name:
            j = rng.randrange(len(name))
            name = name[:j] + rng.choice("abcxyz_-") + name[j + 1:]
        lines[i] = " " * (len(head) - len(head.lstrip())) + name + ":" + tail
    elif op == 5:  # an unknown key at some indentation
        i = rng.randrange(len(lines))
        indent = rng.choice(["", "  ", "    "])
        lines.insert(i, f"{indent}{rng.choice(UNKNOWN_KEYS)}: 1")
    elif op == 6:  # break the indentation
        i = rng.randrange(len(lines))
        lines[i] = rng.choice([" ", "   ", "\t", ""]) + lines[i].lstrip()
    elif op == 7:  # anchors and aliases, sometimes a bomb
        choice = rng.randrange(3)
        if choice == 0:
            lines = LAUGHS.splitlines() + lines
        elif choice == 1:
            lines.append("x: &r [*r]")
        else:
            i = rng.choice(_key_lines(lines))
            lines[i] = lines[i] + " &a"
            lines.append("extra: *a")
    elif op == 8:  # truncate
        return text[: rng.randrange(len(text))]
    elif op == 9:  # a huge number in place of a number
        numeric = [i for i, line in enumerate(lines) if line.rstrip()[-1:].isdigit()] or [0]
        i = rng.choice(numeric)
        head = lines[i].rsplit(":", 1)[0]
        lines[i] = f"{head}: {rng.choice(['10' + '0' * 100, '1e400', '4294967297', '-0', '1e-400'])}"
    else:  # wrap a section in a list or make it a scalar
        i = rng.choice([i for i, line in enumerate(lines) if line and not line.startswith(" ")])
        head = lines[i].split(":", 1)[0]
        lines[i] = f"{head}: {rng.choice(['[', '- a', 'scalar', '{', '|'])}"
    return "\n".join(lines) + "\n"


def _cases(n: int = 400, seed: int = 20240601) -> list[str | bytes]:
    rng = random.Random(seed)
    cases: list[str | bytes] = []
    for _ in range(n):
        text: str | bytes = VALID
        for _ in range(rng.randint(1, 3)):
            if isinstance(text, bytes):
                break
            text = mutate(rng, text)
        cases.append(text)
    return cases


def test_fuzz_gives_scenario_error_or_loads():
    outcomes = {"loaded": 0, "error": 0}
    for i, text in enumerate(_cases()):
        try:
            s = load_scenario_text(text, "fuzz.yaml")
        except ScenarioError as err:
            msg = str(err)
            assert msg.startswith("fuzz.yaml"), (i, msg)
            assert "\n" not in msg and len(msg) < 2000, (i, msg)
            outcomes["error"] += 1
        else:
            assert isinstance(s, Scenario)
            outcomes["loaded"] += 1
    # the mutations are mostly harmful, yet some (e.g. a deleted optional key) still load
    assert outcomes["error"] > 200 and outcomes["loaded"] > 10, outcomes


def test_the_base_is_valid():
    s = load_scenario_text(VALID, "fuzz.yaml")
    assert s.parallel.dp == 2  # 16 GPUs / (tp 4 * pp 2)


def _error(text: str, path: str = "x.yaml", overrides=()) -> str:
    with pytest.raises(ScenarioError) as info:
        load_scenario_text(textwrap.dedent(text), path, overrides)
    assert isinstance(info.value, EmulatorError)
    return str(info.value)


HEAD = "name: x\ncluster:\n  nodes: 2\n  node: dgx-a100\n"


@pytest.mark.parametrize("text, message", [
    (HEAD + "  fabric:\n    link_bandwidth: 200\n",
     'x.yaml:6: cluster.fabric.link_bandwidth: expected a bandwidth with a unit such as "200 Gb/s" '
     'or "25 GB/s", got the bare number 200'),
    (HEAD + "  fabirc:\n    kind: ring\n",
     'x.yaml:5: cluster.fabirc: unknown key "fabirc"; did you mean "fabric"?'),
    (HEAD + "tp: 4\n", 'x.yaml:5: tp: unknown key "tp"; did you mean "parallel.tp"?'),
    (HEAD + "parallel:\n  tp: yes\n", "x.yaml:6: parallel.tp: expected an integer, got the boolean true"),
    (HEAD + "parallel:\n  tp: 4.0\n", "x.yaml:6: parallel.tp: expected an integer, got 4.0"),
    (HEAD + "parallel:\n  sequence_parallel: 1\n",
     "x.yaml:6: parallel.sequence_parallel: expected true or false, got 1"),
    (HEAD + "parallel:\n  schedule: 1f1bb\n",
     'x.yaml:6: parallel.schedule: expected one of gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-v, dualpipev, dualpipe, got "1f1bb"; '
     'did you mean "1f1b"?'),
    (HEAD + "parallel:\n  grad_bucket: 25\n",
     'x.yaml:6: parallel.grad_bucket: expected a size with a unit such as "80 GiB" or "25 MB", '
     "got the bare number 25"),
    ("cluster:\n  nodes: 2\n  node: dgx-a100\n",
     "x.yaml:1: name: this key is required and missing (Name of the scenario)"),
    ("name: x\ncluster:\n  nodes: 2\n", "x.yaml:2: cluster.node: this key is required and missing "
                                        "(A catalog node (dgx-a100, dgx-h100, ...) or an inline node)"),
    ("name: x\ncluster:\n  nodes: 2\n  node: dgx-a10\n",
     'x.yaml:4: cluster.node: unknown node "dgx-a10"; did you mean "dgx-a100"? (known: dgx-a100, '
     "dgx-h100, dgx-h200, h800-node, dgx-b200, gb200-nvl72, gb300-nvl72, dgx-b300, pcie-l40s, dgx-v100)"),
    ("name: x\ncluster:\n  nodes: 1e400\n  node: dgx-a100\n",
     "x.yaml:3: cluster.nodes: expected an integer, got inf"),
    ("name: x\ncluster:\n  nodes: " + "1" + "0" * 100 + "\n  node: dgx-a100\n",
     "x.yaml:3: cluster.nodes: expected an integer from 1 to 1000000, got a 101-digit number"),
    ("name: x\nname: y\n", 'x.yaml:2: duplicate key "name" (first given at line 1)'),
    ("", "x.yaml: the file is empty; a scenario needs at least `name` and `cluster`"),
    ("- a\n- b\n", "x.yaml:1: expected a mapping at the top level (name: ..., cluster: ...), got a list"),
    ("name: x\ncluster:\n\tnodes: 2\n",
     "x.yaml:3: this is not valid YAML: found character '\\t' that cannot start any token (while "
     "scanning for the next token); YAML does not allow tabs for indentation, use spaces"),
    ("a: &a [*a]\n", "x.yaml:1: an alias refers to a mapping or list that contains it (a recursive anchor)"),
    (LAUGHS, "x.yaml:1: more than 20000 values after expanding anchors and aliases; a scenario is far "
             "smaller (an alias bomb?)"),
    (HEAD + "  overrides:\n    - {kind: node_fail, target: 'gpu:1'}\n",
     'x.yaml:6: cluster.overrides[0].target: expected "node:N" for node_fail, got "gpu:1"'),
    (HEAD + "  overrides:\n    - {kind: gpu_slowdown, target: 'gpu:16'}\n",
     "x.yaml:6: cluster.overrides[0].target: there is no gpu 16: the cluster has GPUs 0 to 15"),
    (HEAD + "  node: dgx-h100\n", 'x.yaml:5: duplicate key "node" (first given at line 4)'),
    (HEAD + "model:\n  preset: nemotron4-15b\n  norm: rms\n",
     'x.yaml:7: model.norm: expected one of layernorm, rmsnorm, got "rms"; did you mean "rmsnorm"?'),
    (HEAD + "model:\n  preset: gpt3-125m\ntraining:\n  global_batch: 16\n  fp8_params: true\n",
     "x.yaml:9: training.fp8_params: fp8 weights need training.precision: fp8 (it is bf16); remove "
     "fp8_params or set the precision"),
    # HybridEP's NVLink domains must hold equal shares of an EP group (DeepEP hybrid-ep HybridEPBuffer): 32 trays
    # = 128 GPUs, racks of 72: ranks 64-95 are 8 in the first rack (64-71) and 24 in the second (72-95)
    ("name: x\ncluster:\n  nodes: 32\n  node: gb200-nvl72\nmodel:\n  preset: qwen3-30b-a3b\ntraining:\n"
     "  global_batch: 128\nparallel:\n  ep: 32\n  moe_token_dispatcher_type: flex\n"
     "  moe_flex_dispatcher_backend: hybridep\n",
     "x.yaml:12: parallel.moe_flex_dispatcher_backend: hybridep needs each EP group to hold the same number of "
     "ranks in each NVLink domain it spans; ranks 64-95 (ep 32) split 8 + 24 over domains of 72 GPUs (DeepEP "
     "hybrid-ep HybridEPBuffer); choose ep dividing the domain or a multiple of it, or use deepep"),
])
def test_message_shape(text, message):
    assert _error(text) == message


def test_binary_and_encodings(tmp_path):
    p = tmp_path / "bin.yaml"
    p.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    with pytest.raises(ScenarioError, match=r"bin\.yaml:1: the file is not UTF-8 text: byte 0x89"):
        load_scenario(p)
    p.write_bytes("name: caf\u00e9\n".encode("latin-1"))
    with pytest.raises(ScenarioError, match=r"bin\.yaml:1: the file is not UTF-8 text: byte 0xe9 at offset 9"):
        load_scenario(p)
    p.write_bytes(b"name: x\x00\n")
    with pytest.raises(ScenarioError, match=r"bin\.yaml:1: this is not a text file: unacceptable character #x0000"):
        load_scenario(p)
    p.write_bytes(("\ufeff" + HEAD).encode("utf-16"))  # UTF-16 with a BOM is fine
    assert load_scenario(p).cluster.nodes == 2
    assert load_scenario_text(("\ufeff" + HEAD).encode("utf-8"), "b.yaml").name == "x"


def test_deep_nesting_does_not_crash():
    msg = _error("a: " + "[" * 20000 + "]" * 20000 + "\n")
    assert msg.startswith("x.yaml") and "nested too deeply" in msg
    msg = _error("name: x\ncluster: " + "{a: " * 50 + "1" + "}" * 50 + "\n")
    assert msg == "x.yaml:2: nested more than 24 levels deep"


def test_directory_and_missing_file(tmp_path):
    with pytest.raises(ScenarioError, match="cannot read the scenario"):
        load_scenario(tmp_path)
    with pytest.raises(ScenarioError, match="cannot read the scenario: No such file"):
        load_scenario(tmp_path / "nope.yaml")
