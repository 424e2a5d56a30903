"""``--set key.path=value`` assignments, applied to a scenario's YAML tree before it is read.

``emulator run --set parallel.tp=4`` (and each point of ``--vary``) changes a scenario
without editing its file. An assignment names a key path that the key table (schema.py)
knows, and an item of a list of sections by index, by one of its keys or all at once
(``jobs[1].start=2 s``, ``jobs[name=b].placement=spread``, ``jobs[*].nodes=2``). The value
is YAML; an empty one removes the key. The reader (reader.py) then reads the changed tree
as it reads a file, so an assigned value is checked exactly as a written one.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from emulator.errors import ScenarioError, did_you_mean
from emulator.scenario.schema import KEYS, SECTION_TYPES, Key, all_key_paths, key_hints
from emulator.scenario.yamltree import TAG, YamlValue, parse_tree

# One step of a --set path: a key and, for a list of sections (jobs, cluster.overrides), which item:
# None (the whole list), an index (``jobs[1]`` or ``jobs.1``), (key, value) (``jobs[name=b]``) or
# "*" (every item: ``jobs[*].placement``).
Selector = int | tuple[str, str] | str | None
Step = tuple[str, Selector]


def split_assignment(text: str) -> tuple[str, str] | None:
    """'jobs[name=b].start=2 s' -> ('jobs[name=b].start', '2 s'): at the first '=' outside brackets;
    None where there is none."""
    depth = 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(0, depth - 1)
        elif ch == "=" and depth == 0:
            return text[:i], text[i + 1:]
    return None


def _path_steps(path: str, where: str) -> list[Step]:
    """'jobs[1].start' -> [('jobs', 1), ('start', None)]; 'jobs.1.start' reads the same."""
    steps: list[Step] = []
    rest = path.strip()
    while True:
        name, sel, rest = _one_step(rest, path, where)
        if sel is None and name.isdigit() and steps and steps[-1][1] is None:
            steps[-1] = (steps[-1][0], int(name))  # jobs.1 = jobs[1]
        else:
            steps.append((name, sel))
        if not rest:
            return steps
        rest = rest[1:]  # the '.'


def _one_step(text: str, path: str, where: str) -> tuple[str, Selector, str]:
    """The first step of ``text`` and what follows it (empty, or starting with '.')."""
    i = 0
    while i < len(text) and text[i] not in ".[":
        i += 1
    name = text[:i].strip()
    if not name:
        raise ScenarioError(f'expected key.path=value, e.g. "parallel.tp=4" or "jobs[1].start=2 s", '
                            f"got an empty key in {path!r}", where)
    if i == len(text) or text[i] == ".":
        return name, None, text[i:]
    end = text.find("]", i)
    if end < 0:
        raise ScenarioError(f"{path}: a '[' without its ']'", where)
    inside, rest = text[i + 1:end].strip(), text[end + 1:]
    if rest and rest[0] != ".":
        raise ScenarioError(f"{path}: expected '.' or '=' after '{text[:end + 1]}'", where)
    if inside.isdigit():
        return name, int(inside), rest
    if inside == "*":
        return name, "*", rest
    if "=" in inside:
        field_name, value = inside.split("=", 1)
        if field_name.strip() and value.strip():
            return name, (field_name.strip(), value.strip()), rest
    raise ScenarioError(f"{name}[{inside}]: expected an index such as {name}[0], an item by key such as "
                        f"{name}[name=a], or {name}[*] (every item)", where)


def _shown(steps: Sequence[Step]) -> str:
    """The key path of ``steps`` as the reader names it: jobs[1].start, jobs[name=b].placement."""
    out = []
    for name, sel in steps:
        if sel is None:
            out.append(name)
        elif isinstance(sel, (int, str)):
            out.append(f"{name}[{sel}]")
        else:
            out.append(f"{name}[{sel[0]}={sel[1]}]")
    return ".".join(out)


def _checked_steps(text: str) -> tuple[list[Step], str]:
    """'parallel.tp=4' -> ([('parallel', None), ('tp', None)], '4'), checked against the key table;
    an item of a list of sections is named by index or by one of its keys ('jobs[1].start=2 s',
    'jobs[name=b].placement=spread', 'cluster.overrides[0].at=1 s')."""
    where = f"--set {text}"
    split = split_assignment(text)
    if split is None:
        raise ScenarioError('expected key.path=value, e.g. "parallel.tp=4"', where)
    path, value = split
    steps = _path_steps(path, where)
    keys: Mapping[str, Key] = KEYS
    for i, (part, sel) in enumerate(steps):
        shown = _shown(steps[: i + 1])
        if part not in keys:
            others = key_hints([p for p in all_key_paths() if p.endswith("." + part)])
            hint = did_you_mean(part, list(keys)) or (f'; did you mean "{others[0]}"?' if others else "")
            raise ScenarioError(f'unknown key "{part}"{hint}', where, shown)
        key = keys[part]
        if sel is not None and key.type != "sections":
            raise ScenarioError(f"{_shown([*steps[:i], (part, None)])} is not a list: give it without [...]",
                                where, shown)
        if isinstance(sel, tuple) and (key.keys is None or sel[0] not in key.keys):
            hint = did_you_mean(sel[0], list(key.keys or ())) or f"; pick one by index, {part}[0]"
            raise ScenarioError(f'an item of {part} has no key "{sel[0]}"{hint}', where, shown)
        if i < len(steps) - 1:
            if key.type == "sections" and sel is None:
                raise ScenarioError(f"{shown} is a list: name one item, e.g. --set '{shown}[0]."
                                    f"{steps[i + 1][0]}=...', or set it whole, --set '{shown}=[...]'",
                                    where, shown)
            if key.type not in SECTION_TYPES or key.keys is None:
                raise ScenarioError(f"{shown} is a value, not a section", where, _shown(steps[: i + 2]))
            keys = key.keys
    return steps, value


def _key_at(steps: Sequence[Step]) -> Key:
    keys: Mapping[str, Key] = KEYS
    key = KEYS[steps[0][0]]
    for part, _sel in steps:  # the path was checked by _checked_steps
        key = keys[part]
        keys = key.keys or {}
    return key


def _item(node: YamlValue, steps: Sequence[Step], i: int, where: str) -> int:
    """The index in ``node`` (a list of sections) of the item that ``steps[i]`` selects."""
    part, sel = steps[i]
    shown = _shown(steps[: i + 1])
    items = node.items
    if items is None:
        raise ScenarioError(f"{_shown([*steps[:i], (part, None)])} is not a list in the scenario, so it has no "
                            "item to change: set it whole", where, shown)
    if isinstance(sel, int):
        if sel >= len(items):
            raise ScenarioError(f"{part} has {len(items)} item{'s' if len(items) != 1 else ''} "
                                f"(0 to {len(items) - 1}), no item {sel}", where, shown)
        return sel
    assert isinstance(sel, tuple)  # "*" was expanded by apply_assignments
    name, value = sel
    found = [k for k, item in enumerate(items) if item.mapping is not None and name in item.mapping
             and item.mapping[name].mapping is None and item.mapping[name].items is None
             and item.mapping[name].text.strip() == value]
    if len(found) != 1:
        given = [item.mapping[name].text for item in items if item.mapping is not None and name in item.mapping]
        have = ", ".join(map(repr, given)) or "none has it"
        what = "no item" if not found else f"{len(found)} items"
        raise ScenarioError(f"{what} of {part} has {name} {value!r} (theirs: {have})", where, shown)
    return found[0]


def apply_assignments(tree: YamlValue | None, assignments: Sequence[str]) -> YamlValue | None:
    """Applies ``--set key.path=value`` strings to a scenario tree (in place; returns it).

    The value is read as YAML ("4", "200 Gb/s", "[4, 4]"); an empty value removes the
    key (or the list item). Missing sections are created; a catalog name standing for a node
    or GPU becomes ``{preset: name}`` so that one of its figures can be changed. An item of a
    list must exist: ``jobs[2]`` of a two-job list is an error, not a new job.
    """
    for text in assignments:
        steps, value_text = _checked_steps(str(text))
        where = f"--set {text}"
        if tree is None:
            tree = YamlValue(where, mapping={})
        if tree.mapping is None:
            return tree  # the top level is not a mapping: reported when it is read
        star = next((i for i, (_p, sel) in enumerate(steps) if sel == "*"), -1)
        if star >= 0:  # every item: one assignment per index
            items = _list_at(tree, steps[: star + 1])
            if items is None or not items.items:
                raise ScenarioError(f"{steps[star][0]} has no items in the scenario to set", where,
                                    _shown(steps[: star + 1]))
            for k in range(len(items.items)):
                path = _shown([*steps[:star], (steps[star][0], k), *steps[star + 1:]])
                apply_assignments(tree, [f"{path}={value_text}"])
            continue
        value = parse_tree(value_text, where) or YamlValue(where, tag=TAG + "null")
        value.key_where = where
        node = tree
        for i, (part, sel) in enumerate(steps):
            last = i == len(steps) - 1
            if sel is not None:
                assert node.mapping is not None
                child = node.mapping.get(part) or YamlValue(where, tag=TAG + "null")
                k = _item(child, steps, i, where)
                assert child.items is not None
                if last:
                    if value.is_null:
                        del child.items[k]
                    else:
                        child.items[k] = value
                    break
                node = _section(child.items[k], steps, i, where)
                child.items[k] = node
                continue
            mapping = node.mapping
            assert mapping is not None  # a section made or kept by _section
            if last:
                mapping[part] = value
                break
            mapping[part] = node = _section(mapping.get(part), steps, i, where)
    return tree


def _list_at(tree: YamlValue, steps: Sequence[Step]) -> YamlValue | None:
    """The list that the last of ``steps`` names (its earlier steps plain keys or indexed items), or None."""
    node: YamlValue | None = tree
    for i, (part, sel) in enumerate(steps):
        if node is None or node.mapping is None:
            return None
        node = node.mapping.get(part)
        if i < len(steps) - 1 and node is not None and sel is not None:
            if not isinstance(sel, int) or node.items is None or sel >= len(node.items):
                return None
            node = node.items[sel]
    return node


def _section(child: YamlValue | None, steps: Sequence[Step], i: int, where: str) -> YamlValue:
    """``child`` as a mapping to descend into: made where missing; a catalog name as {preset: name}."""
    if child is None or child.is_null or (child.mapping is None and not _key_at(steps[: i + 1]).names):
        return YamlValue(where, mapping={}, key_where=where)
    if child.mapping is None:  # a catalog name: {preset: name}
        return YamlValue(child.where, mapping={"preset": child}, key_where=child.key_where)
    return child
