"""The reference pages, generated from the code at build time (docs/hooks.py adds them to the site).

- ``reference/scenario.md``: every key of the JSON Schema that ``emulator schema`` prints (the key
  table that the reader checks files against, both derived from the fields of
  emulator/scenario/spec.py), with its type, unit, default, allowed values and an example (from a
  scenario in scenarios/ where one uses the key), each under the anchor that errors naming the key
  link to (emulator/outputs/docs_links.py);
- ``reference/cli.md``: every command and flag of the argparse parser (emulator/cli.py);
- ``reference/catalog.md``: the GPUs and nodes of emulator/data/catalog.yaml with each figure's cited
  source, and the model presets of emulator/scenario/catalog.py with theirs.

Nothing here is typed from the code: change a key, a flag or a catalog entry and the page follows.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
from typing import Any, Iterator

import yaml

from emulator.outputs.docs_links import key_anchor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ------------------------------------------------------------------ scenario keys

def schema() -> dict[str, Any]:
    """The JSON Schema exactly as ``emulator schema`` prints it."""
    import contextlib
    import io

    from emulator.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["schema"]) == 0
    return json.loads(out.getvalue())


def _branches(node: dict[str, Any]) -> list[dict[str, Any]]:
    return node.get("oneOf", [node])


def _object_of(node: dict[str, Any]) -> dict[str, Any] | None:
    """The object schema a key holds (itself, a list's items, or a oneOf branch), if any."""
    for b in _branches(node):
        if b.get("type") == "object":
            return b
        if b.get("type") == "array" and isinstance(b.get("items"), dict) and b["items"].get("type") == "object":
            return b["items"]
    return None


def schema_keys(node: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """(dotted key path, schema) for every key, depth first in the schema's order; list items and
    oneOf branches add no path element (``cluster.overrides.kind``, ``cluster.node.gpus_per_node``)."""
    for name, sub in node.get("properties", {}).items():
        path = prefix + name
        yield path, sub
        inner = _object_of(sub)
        if inner is not None:
            yield from schema_keys(inner, path + ".")


def _unit(pattern: str) -> tuple[str, str] | None:
    """(SI unit, example) of a quantity key, from its pattern."""
    from emulator.scenario.units import KINDS, UNIT_PATTERNS

    for kind, pat in UNIT_PATTERNS.items():
        if pat == pattern:
            return KINDS[kind].si_unit, KINDS[kind].examples
    return None


def _type_text(node: dict[str, Any]) -> tuple[str, str]:
    """(type, unit) in words."""
    types, unit = [], ""
    for b in _branches(node):
        t = b.get("type", "any")
        if t == "string" and "pattern" in b:
            u = _unit(b["pattern"])
            if u:
                t, unit = "quantity (a string with its unit)", u[0]
            else:
                t = "string (a number, `a/b` or `a:b`)"
        elif t == "array":
            items = b.get("items", {})
            t = f"list of {'sections' if items.get('type') == 'object' else items.get('type', 'values')}"
        elif t == "object":
            t = "section"
        types.append(t)
    return " or ".join(dict.fromkeys(types)), unit


def _num(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


def _allowed(node: dict[str, Any]) -> str:
    parts = []
    for b in _branches(node):
        items = b.get("items") if b.get("type") == "array" else None
        src = items if isinstance(items, dict) else b
        if "enum" in src:
            parts.append(", ".join(f"`{v}`" for v in src["enum"]))
        lo = src.get("minimum", src.get("exclusiveMinimum"))
        hi = src.get("maximum")
        if lo is not None or hi is not None:
            low = "" if lo is None else (f"> {_num(lo)}" if "exclusiveMinimum" in src else f"≥ {_num(lo)}")
            parts.append(", ".join(p for p in (low, "" if hi is None else f"≤ {_num(hi)}") if p))
        if "maxItems" in b:
            parts.append(f"{b.get('minItems', 0)} to {b['maxItems']} items")
    return "; ".join(p for p in parts if p)


def scenario_examples() -> dict[str, tuple[Any, str]]:
    """key path → (a value, the file it is from), the first scenario in scenarios/ that sets the key."""
    found: dict[str, tuple[Any, str]] = {}

    def visit(value: Any, path: str, where: str) -> None:
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for v in value:
                visit(v, path, where)
            return
        if path and path not in found:
            found[path] = (value, where)
        if isinstance(value, dict):
            for k, v in value.items():
                visit(v, f"{path}.{k}" if path else str(k), where)

    for f in sorted(glob.glob(os.path.join(ROOT, "scenarios", "*.yaml"))):
        with open(f, encoding="utf-8") as fh:
            visit(yaml.safe_load(fh), "", os.path.relpath(f, ROOT))
    return found


def _example(path: str, node: dict[str, Any], examples: dict[str, tuple[Any, str]]) -> str:
    name = path.rsplit(".", 1)[-1]
    if path in examples:
        value, where = examples[path]
        if not isinstance(value, (dict, list)) or len(json.dumps(value)) < 60:
            text = yaml.safe_dump({name: value}, default_flow_style=True, width=1000).strip()[1:-1]
            return f"`{text}` ({where})"
        return f"see `{where}`"
    m = re.search(r'e\.g\. ("[^"]+"|`[^`]+`|\S+)', node.get("description", ""))
    if m:
        return f"`{name}: {m.group(1).strip('`')}`"
    b = _branches(node)[0]
    if "enum" in b:
        return f"`{name}: {b['enum'][-1]}`"
    if "pattern" in b and _unit(b["pattern"]):
        return f"`{name}: {_unit(b['pattern'])[1].split(' or ')[0]}`"  # type: ignore[index]
    return ""


def _default(node: dict[str, Any]) -> str:
    if "default" not in node:
        return ""
    d = node["default"]
    if d == "" or d == []:
        return "absent"
    return "`" + (json.dumps(d) if isinstance(d, (bool, list)) else str(d)) + "`"


def scenario_page(doc: dict[str, Any] | None = None) -> str:
    """The scenario-key reference, one entry per key of the schema, each under its anchor."""
    doc = doc or schema()
    examples = scenario_examples()
    lines = ["# Scenario keys", "",
             "<!-- generated at build time by docs/reference_pages.py from `emulator schema`: do not edit -->", "",
             doc.get("description", ""), "",
             "Every key a scenario file may hold, generated from the JSON Schema that `emulator schema` prints "
             "(save it as `scenario.schema.json` for an editor's completion and checks). Quantities are strings "
             "with their unit; inside, everything is SI. An error that names a key links here, to the key's "
             "entry. Examples come from the scenarios in `scenarios/` where one sets the key.", ""]
    for path, node in schema_keys(doc):
        depth = path.count(".")
        if depth == 0:
            lines += [f"## `{path}` {{ #{key_anchor(path)} }}", ""]
        else:
            lines += [f"### `{path}` {{ #{key_anchor(path)} }}", ""]
        lines += [node.get("description", "").replace("\n", " "), ""]
        typ, unit = _type_text(node)
        facts = [f"**type** {typ}"]
        if unit:
            facts.append(f"**unit** {unit}")
        for label, value in (("default", _default(node)), ("allowed", _allowed(node)),
                             ("example", _example(path, node, examples))):
            if value:
                facts.append(f"**{label}** {value}")
        lines += [" · ".join(facts), ""]
    return "\n".join(lines)


# ------------------------------------------------------------------ command line

def _flag_row(a: argparse.Action) -> str:
    names = ", ".join(f"`{o}`" for o in a.option_strings) or f"`{a.metavar or a.dest}`"
    arg = ""
    if a.option_strings and a.nargs != 0:
        arg = f"`{a.metavar or a.dest.upper()}`"
    default = "" if a.default in (None, False, argparse.SUPPRESS) or a.nargs == 0 else f"`{a.default}`"
    choices = ", ".join(f"`{c}`" for c in a.choices) if a.choices else ""
    text = (a.help or "").replace("|", "\\|").replace("\n", " ") % {"default": a.default, "prog": "emulator"} \
        if a.help and "%(" in a.help else (a.help or "").replace("|", "\\|").replace("\n", " ")
    return f"| {names} | {arg} | {default} | {choices} | {text} |"


def cli_page() -> str:
    """Every command and flag of ``emulator``, from the parser itself."""
    from emulator.cli import build_parser

    parser = build_parser(None)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help for c in sub._choices_actions}
    lines = ["# Commands and flags", "",
             "<!-- generated at build time by docs/reference_pages.py from emulator/cli.py's parser: do not edit -->",
             "", parser.description or "", "", "```text", parser.format_usage().strip(), "```", "",
             "| command | what it does |", "|---|---|"]
    lines += [f"| [`{n}`](#{n}) | {helps.get(n, '')} |" for n in sub.choices]
    lines += ["", "Exit codes: 0 done, 2 bad input (one line naming the file, line and key), 1 a bug, "
              "130 interrupted; see [Errors and guarantees](../guides/errors.md).", ""]
    for name, sp in sub.choices.items():
        lines += [f"## `emulator {name}` {{ #{name} }}", "", helps.get(name, "") or "", "",
                  "```text", sp.format_usage().replace("usage: ", "").strip(), "```", ""]
        if sp.description:
            lines += [sp.description, ""]
        actions = [a for a in sp._actions if not isinstance(a, argparse._HelpAction)]
        if actions:
            lines += ["| flag or argument | value | default | choices | help |", "|---|---|---|---|---|"]
            lines += [_flag_row(a) for a in actions]
            lines.append("")
        if sp.epilog:
            lines += ["```text", sp.epilog, "```", ""]
    return "\n".join(lines)


# ------------------------------------------------------------------ catalog

def _catalog_entries() -> dict[str, dict[str, list[tuple[str, str, str]]]]:
    """section (gpus, nodes) → entry → [(key, value, the source comment beside it or above it)]."""
    path = os.path.join(ROOT, "emulator", "data", "catalog.yaml")
    out: dict[str, dict[str, list[tuple[str, str, str]]]] = {}
    section = entry = ""
    above: list[str] = []
    with open(path, encoding="utf-8") as fh:
        for raw in fh:
            line = raw.rstrip("\n")
            m = re.match(r"^(\w+):\s*$", line)
            if m:
                section, entry = m.group(1), ""
                out[section] = {}
                continue
            m = re.match(r"^  ([\w.+-]+):\s*$", line)
            if m and section:
                entry, above = m.group(1), []
                out[section][entry] = []
                continue
            m = re.match(r"^    #\s?(.*)$", line)
            if m and entry:
                above.append(m.group(1))
                continue
            m = re.match(r"^    (\w+):\s*(.*?)\s*(?:#\s?(.*))?$", line)
            if m and entry:
                note = " ".join(above + ([m.group(3)] if m.group(3) else []))
                out[section][entry].append((m.group(1), m.group(2), note))
                above = []
    return out


def _model_sources() -> dict[str, str]:
    """family prefix → the source the catalog module cites for it (its docstring, or a comment above)."""
    import emulator.scenario.catalog as cat

    doc = cat.__doc__ or ""
    bullets = re.findall(r"^- (.+?)(?=^- |^\S|\Z)", doc.split("Model sources:", 1)[-1], re.S | re.M)
    src = open(cat.__file__, encoding="utf-8").read()
    families = {"gpt3": "GPT-3", "megatron": "Megatron", "llama2": "Llama 2", "llama3": "Llama 3",
                "mixtral": "Mixtral", "deepseek": "DeepSeek", "qwen2": "Qwen2", "bert": "BERT",
                "nemotron4": "Nemotron"}
    out = {}
    for prefix, word in families.items():
        hit = next((" ".join(b.split()) for b in bullets if b.startswith(word)), "")
        if not hit:  # a comment block above the family's first entry
            m = re.search(r"((?:^    #.*\n)+)\s*\"" + re.escape(prefix), src, re.M)
            hit = " ".join(c.strip().lstrip("#").strip() for c in m.group(1).splitlines()) if m else ""
        out[prefix] = hit
    return out


def catalog_page() -> str:
    """The built-in GPUs, nodes and model presets, each figure with its cited source."""
    from emulator.scenario.catalog import MODELS, model_preset

    lines = ["# Catalog: GPUs, nodes and models", "",
             "<!-- generated at build time by docs/reference_pages.py from emulator/data/catalog.yaml and "
             "emulator/scenario/catalog.py: do not edit -->", "",
             "A scenario names these (`cluster.node: dgx-h100`, `model: {preset: llama3-70b}`); any field can be "
             "changed inline, and `cluster.catalog: FILE` adds your own (as `emulator calibrate` writes them; see "
             "[Traces and calibration](../guides/traces.md)). `hardware.csv` and `nccl.csv` are the shared "
             "calibration set, `../shared/calibration/`; a figure marked ASSUMPTION has no measurement behind it.",
             ""]
    entries = _catalog_entries()
    for section, title in (("gpus", "GPUs"), ("nodes", "Nodes")):
        lines += [f"## {title}", ""]
        for name, rows in entries.get(section, {}).items():
            source = next((v for k, v, _ in rows if k == "source"), "")
            lines += [f"### `{name}`", "", f"Source: {source}" if source else "", "",
                      "| key | value | source |", "|---|---|---|"]
            lines += [f"| `{k}` | {v} | {n.replace('|', '/')} |" for k, v, n in rows if k != "source"]
            lines.append("")
    sources = _model_sources()
    lines += ["## Models", "", "| preset | layers | hidden | heads | KV heads | FFN | vocabulary | sequence | "
              "experts (top-k) | source |", "|---|---|---|---|---|---|---|---|---|---|"]
    used = []
    for name in MODELS:
        m = model_preset(name)
        family = next((p for p in sources if name.startswith(p)), "")
        if family not in used:
            used.append(family)
        experts = f"{m.experts} ({m.top_k})" if m.experts else ""
        ref = f"[{used.index(family) + 1}](#model-sources)"
        lines.append(f"| `{name}` | {m.layers} | {m.hidden} | {m.heads} | {m.kv_heads or m.heads} | "
                     f"{m.ffn_hidden} | {m.vocab} | {m.seq_len} | {experts} | {ref} |")
    lines += ["", "### Sources of the models { #model-sources }", ""]
    lines += [f"{i}. {sources.get(f, '')}" for i, f in enumerate(used, start=1)]
    lines.append("")
    return "\n".join(lines)


PAGES = {"reference/scenario.md": scenario_page, "reference/cli.md": cli_page, "reference/catalog.md": catalog_page}
