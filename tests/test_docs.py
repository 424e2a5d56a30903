"""Docs that run: every ``emulator ...`` command that README.md and the guides show, and the generated reference.

- Commands: each fenced ``bash``/``sh``/``console`` block of README.md, getting-started, the FAQ and
  docs/guides/*.md gives its ``emulator ...`` lines (``$ emulator ...`` in console blocks, ``\\``
  continuations joined, comments dropped). A page runs its commands in order in a fresh temporary
  folder that sees the repository's inputs (scenarios/, examples/, traces/, benchmarks/, plots/,
  tests/, README.md) but keeps its outputs; never ``../shared``, so the pages' commands run as on a
  bare clone. Each must exit as the page says: 0, or the error the console block shows (exit 2 and
  that line on stderr). After a page's commands, nothing is left outside the paths they name and
  ``out/``, and no database ``-wal``/``-shm`` file or lock anywhere (``left_behind``). A block after
  ``<!-- slow -->`` (over 30 s) or ``<!-- skip: why -->`` (needs files the reader brings) is not run;
  ``text`` blocks are synopses and never run.
- The scenario-key reference lists every key that ``emulator schema`` has, each under the anchor
  that errors link to; the CLI reference lists every command and flag; the README's summary table
  is the one rendered from benchmarks/results/; ``--help`` ends with an example and a guide link.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))
PAGES = [ROOT / "README.md", ROOT / "docs" / "getting-started.md", ROOT / "docs" / "faq.md"] + sorted((ROOT / "docs" / "guides").glob("*.md"))
INPUTS = ("scenarios", "examples", "traces", "benchmarks", "plots", "tests", "README.md")
FENCE = re.compile(r"^(?P<marks>(?:[ ]*<!-- [^\n]*-->\n)*)[ ]*```(?P<lang>[\w-]*)\n(?P<body>.*?)^[ ]*```", re.M | re.S)
RUN_LANGS = ("bash", "sh", "console", "shell")
TIMEOUT_S = 30
HAS_TORCH = importlib.util.find_spec("torch") is not None  # `emulator live` needs the [live] extra


def commands(text: str) -> list[tuple[str, int, str, str]]:
    """(command, expected exit, expected stderr line or "", skip reason or "") per command, in page order."""
    out = []
    for m in FENCE.finditer(text):
        if m.group("lang") not in RUN_LANGS:
            continue
        marks = m.group("marks")
        skip = ""
        if "<!-- slow -->" in marks:
            skip = "slow (over 30 s)"
        found = re.search(r"<!-- skip: (.+?) -->", marks)
        if found:
            skip = found.group(1)
        lines = re.sub(r"\\\n\s*", "", m.group("body")).splitlines()
        console = m.group("lang") == "console"
        for i, line in enumerate(lines):
            if console:
                if not line.startswith("$ emulator "):
                    continue
                cmd = line[2:]
                shown = lines[i + 1] if i + 1 < len(lines) and not lines[i + 1].startswith("$ ") else ""
                err = shown if shown.startswith("emulator: ") else ""
                out.append((cmd, 2 if err else 0, err, skip))
            elif line.strip().startswith("emulator "):
                out.append((re.sub(r"\s+#\s.*$", "", line.strip()), 0, "", skip))  # the comment cut
    return out


SHOWN = re.compile(r"^```(?:bash|sh)\n(?P<cmds>.*?)^```\n\n<!-- output -->\n```text\n(?P<out>.*?)^```", re.M | re.S)


def shown_outputs(text: str) -> list[tuple[list[str], list[str]]]:
    """(the block's commands, the lines a page shows they print) for each ``<!-- output -->`` block."""
    return [([c[0] for c in commands("```bash\n" + m.group("cmds") + "```\n")], m.group("out").splitlines())
            for m in SHOWN.finditer(text)]


def _workdir(tmp_path: Path) -> Path:
    """A fresh folder that sees the repository's inputs (not ../shared: a clone has none), with ``emulator`` on PATH."""
    work = tmp_path / "work"
    work.mkdir()
    for name in INPUTS:
        (work / name).symlink_to(ROOT / name)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "emulator"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m emulator "$@"\n')
    exe.chmod(0o755)
    return work


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), EMULATOR_PROGRESS="0")
    env["PATH"] = os.pathsep.join([str(tmp_path / "bin"), os.path.dirname(sys.executable), env.get("PATH", "")])
    return env


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_commands_a_page_shows_exit_as_it_says(page, tmp_path):
    cmds = commands(page.read_text(encoding="utf-8"))
    runnable = [c for c in cmds if not c[3] and (HAS_TORCH or not c[0].startswith("emulator live "))]
    if not runnable:
        pytest.skip("no runnable emulator command on this page")
    work, env = _workdir(tmp_path), _env(tmp_path)
    printed: dict[str, str] = {}
    for cmd, code, err, _ in runnable:
        proc = subprocess.run(["bash", "-c", cmd], cwd=work, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT_S)
        assert proc.returncode == code, f"{page.name}: `{cmd}` exited {proc.returncode}:\n{proc.stderr[-2000:]}"
        if err:
            assert err in proc.stderr, f"{page.name}: `{cmd}` printed {proc.stderr!r}, the page shows {err!r}"
        printed[cmd] = proc.stdout + proc.stderr
    assert not left_behind(work, [c[0] for c in runnable]), f"{page.name}: its commands left these behind"
    for cmds, lines in shown_outputs(page.read_text(encoding="utf-8")):  # the output a page quotes is current
        if all(c in printed for c in cmds):
            said = " ".join(" ".join(printed[c] for c in cmds).split())
            for line in lines:
                assert " ".join(line.split()) in said, f"{page.name}: `{cmds}` no longer prints {line!r}"


LEFTOVER = re.compile(r"(-wal|-shm|-journal|\.lock)$")


def _named(cmds: list[str]) -> set[str]:
    """The top-level names the commands name: each word's first path component (``--out out/x`` → ``out``,
    ``--db=study.sqlite``, ``> schema.json``), and each such file's stem (a plot's SVG beside its PNG)."""
    import shlex

    names: set[str] = set()
    for cmd in cmds:
        for word in shlex.split(cmd.replace(">", " ")):
            for part in word.split("=", 1)[-1:] + [word]:
                first = os.path.normpath(part).split(os.sep)[0]
                names.update((first, os.path.splitext(first)[0]))
    return names


def left_behind(work: Path, cmds: list[str]) -> list[str]:
    """What the commands left in ``work`` that they should not have: an entry at the top outside the
    paths they name and ``out/``, and anywhere a database's ``-wal``/``-shm``/journal or a lock file."""
    named = _named(cmds) | {"out"}
    bad = [p.name for p in work.iterdir() if p.name not in INPUTS
           and p.name not in named and os.path.splitext(p.name)[0] not in named]
    for folder, dirs, files in os.walk(work):  # the inputs are symbolic links: not followed
        bad += [os.path.join(folder, f) for f in files if LEFTOVER.search(f)]
    return bad


def test_left_behind_names_strays_and_database_leftovers(tmp_path):
    for name in ("out", "study.sqlite", "batch.png", "batch.svg", "stray.csv", "et"):
        (tmp_path / name).mkdir() if name in ("out", "et") else (tmp_path / name).write_text("")
    (tmp_path / "out" / "s.sqlite-wal").write_text("")
    (tmp_path / "et" / "x.lock").write_text("")
    cmds = ["emulator sweep a.yaml --db study.sqlite", "emulator plot --db study.sqlite --out batch.png",
            "emulator export a.yaml --out et/"]
    assert sorted(left_behind(tmp_path, cmds)) == sorted(
        ["stray.csv", str(tmp_path / "out" / "s.sqlite-wal"), str(tmp_path / "et" / "x.lock")])


def test_the_extractor_reads_console_errors_continuations_and_marks():
    text = ("```console\n$ emulator run a.yaml --out README.md\nemulator: --out README.md: exists\n```\n"
            "<!-- slow -->\n```bash\nemulator run big.yaml \\\n    --set x=1   # a comment\n```\n"
            "```text\nemulator run SCENARIO.yaml [--json]\n```\n"
            "<!-- skip: your files -->\n```sh\nemulator calibrate --nccl-log x.log\n```\n")
    assert commands(text) == [
        ("emulator run a.yaml --out README.md", 2, "emulator: --out README.md: exists", ""),
        ("emulator run big.yaml --set x=1", 0, "", "slow (over 30 s)"),
        ("emulator calibrate --nccl-log x.log", 0, "", "your files"),
    ]


def test_the_readme_quotes_one_line_of_output_for_each_command_of_its_tour():
    shown = shown_outputs((ROOT / "README.md").read_text(encoding="utf-8"))
    tour = [c for cmds, _ in shown for c in cmds]
    for command in ("run", "collective", "sweep", "search", "export", "live"):
        assert any(c.startswith(f"emulator {command} ") for c in tour), command
    assert all(lines for _, lines in shown)


def test_every_page_shows_runnable_commands_and_says_why_it_skips_the_others():
    every = [(p.name, c) for p in PAGES for c in commands(p.read_text(encoding="utf-8"))]
    assert len([c for _, c in every if not c[3]]) >= 20  # the README's tour and the guides' examples
    assert all(c[3].strip() for _, c in every if c[3])


def _schema() -> dict:
    out = subprocess.run([sys.executable, "-m", "emulator", "schema"], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT)
    return json.loads(out.stdout)


def _keys(node: dict, prefix: str = "") -> set[str]:
    """Every key path of a JSON Schema, walked here independently of the page's generator."""
    found = set()
    for name, sub in node.get("properties", {}).items():
        found.add(prefix + name)
        for branch in sub.get("oneOf", [sub]):
            inner = branch.get("items") if branch.get("type") == "array" else branch
            if isinstance(inner, dict) and inner.get("type") == "object":
                found |= _keys(inner, prefix + name + ".")
    return found


def test_the_scenario_reference_lists_every_key_of_the_schema_under_its_anchor():
    import reference_pages

    from emulator.outputs.docs_links import key_anchor
    from emulator.scenario.schema import all_key_paths

    schema = _schema()
    keys = _keys(schema)
    assert keys == set(all_key_paths())  # the schema holds the loader's whole key table
    assert {"parallel.tp", "cluster.fabric.oversubscription", "jobs.placement", "cluster.overrides.at"} <= keys
    page = reference_pages.scenario_page(schema)
    listed = set(re.findall(r"^#{2,3} `([\w.]+)` \{ #([\w-]+) \}$", page, re.M))
    assert {k for k, _ in listed} == keys
    assert all(anchor == key_anchor(k) for k, anchor in listed)
    # a key with a unit, a default and choices shows them (cluster.fabric.latency: "1e-06 s", 1 us)
    entry = page.split("### `cluster.fabric.latency`", 1)[1].split("###", 1)[0]
    assert "**unit** s" in entry and "**default** `1e-06 s`" in entry
    kind = page.split("### `cluster.fabric.kind`", 1)[1].split("###", 1)[0]
    assert "`fat_tree`" in kind and "**example** `kind: " in kind


def test_the_cli_reference_lists_every_command_and_flag():
    import argparse

    import reference_pages

    from emulator.cli import build_parser

    page = reference_pages.cli_page()
    sub = next(a for a in build_parser(None)._actions if isinstance(a, argparse._SubParsersAction))
    for name, sp in sub.choices.items():
        assert f"## `emulator {name}` {{ #{name} }}" in page
        for action in sp._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}`" in page.split(f"## `emulator {name}`", 1)[1], (name, flag)


def test_the_readme_summary_is_rendered_from_the_results_files():
    import results_tables

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = results_tables.README_BLOCK.search(text)
    assert block, "README.md has no <!-- results: summary --> ... <!-- /results --> block"
    assert block.group(2) == results_tables.readme_table(), "run: python docs/results_tables.py --readme"


def test_every_results_table_renders():
    import results_tables

    for name, make in results_tables.TABLES.items():
        table = make()
        assert table.count("\n|") >= 2, name  # a header, its rule and at least one row


def test_help_ends_with_an_example_and_the_guide_page(capsys):
    from emulator.cli import main
    from emulator.outputs.docs_links import docs_url

    for argv, page in ((["--help"], ""), (["run", "--help"], "guides/workloads/"),
                       (["sweep", "--help"], "guides/studies/"), (["live", "--help"], "guides/live/")):
        with pytest.raises(SystemExit):
            main(argv)
        tail = capsys.readouterr().out.rstrip().splitlines()[-5:]
        assert any(line.strip().startswith("emulator ") for line in tail), (argv, tail)
        assert any(docs_url(page) in line for line in tail), (argv, tail)
        if page:  # no public site: the guide is its path in the repository, a file the clone has
            assert (ROOT / docs_url(page)).is_file(), docs_url(page)


def test_every_guide_a_command_links_is_a_page_of_the_repository():
    from emulator.outputs.docs_links import COMMANDS, docs_url

    for page, _ in COMMANDS.values():
        if not page.startswith("reference/"):  # the reference pages are generated at build time
            assert (ROOT / docs_url(page)).is_file(), page


def test_no_placeholder_host_anywhere():
    import emulator.outputs.docs_links as links

    assert not links.SITE_URL or not re.search(r"\.(invalid|example)\b|example\.(com|org)", links.SITE_URL)
    texts = [ROOT / "README.md", ROOT / "mkdocs.yml", *sorted((ROOT / "docs").rglob("*.md")),
             *sorted((ROOT / "emulator").rglob("*.py"))]
    for path in texts:
        assert not re.search(r"https?://[\w.-]*\.invalid\b|https?://example\.(com|org)\b",
                             path.read_text(encoding="utf-8")), path
    assert "$id" not in _schema() or "invalid" not in _schema()["$id"]


def test_an_error_naming_a_key_links_to_its_entry_on_a_terminal(capsys, monkeypatch):
    from emulator.cli import main
    from emulator.outputs.docs_links import key_url

    monkeypatch.chdir(ROOT)
    assert main(["run", "scenarios/quickstart.yaml", "--set", "training.recompute=sometimes"]) == 2
    piped = capsys.readouterr().err
    assert piped.count("\n") == 1 and "training.recompute" in piped  # a program reading stderr gets the one line
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert main(["run", "scenarios/quickstart.yaml", "--set", "training.recompute=sometimes"]) == 2
    first, link = capsys.readouterr().err.splitlines()
    assert first == piped.strip()
    assert link == f"see {key_url('training.recompute')}"
    assert link == "see `training.recompute` in `emulator schema`"  # no site yet: the schema holds the entry
    monkeypatch.setenv("EMULATOR_DOCS_URL", "file:///tmp/site/")  # a built site: the key's anchor on its page
    assert main(["run", "scenarios/quickstart.yaml", "--set", "training.recompute=sometimes"]) == 2
    assert capsys.readouterr().err.splitlines()[1] == "see file:///tmp/site/reference/scenario/#training-recompute"


def test_a_key_link_falls_back_to_the_nearest_known_key(monkeypatch):
    from emulator.outputs.docs_links import docs_url, key_url

    known = {"parallel", "parallel.tp", "jobs", "jobs.placement"}
    assert key_url("parallel.tpp", known) == "`parallel` in `emulator schema`"  # no site: the schema's entry
    monkeypatch.setenv("EMULATOR_DOCS_URL", "https://docs.test/emulator/")
    page = docs_url("reference/scenario/")
    assert key_url("jobs[1].placement", known) == page + "#jobs-placement"  # the list index dropped
    assert key_url("parallel.tpp", known) == page + "#parallel"  # a misspelt key: its parent
    assert key_url("nosuch.key", known) == page


def test_every_package_says_what_it_owns_and_what_it_may_import():
    import ast

    for init in sorted((ROOT / "emulator").glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        assert doc.splitlines() and doc.splitlines()[0].strip(), init  # its first line: what it is
        assert "May import:" in doc, f"{init}: say which layers it may import (DESIGN.md, Layout)"


def test_the_catalog_reference_cites_a_source_for_every_entry():
    import reference_pages

    from emulator.scenario import catalog

    page = reference_pages.catalog_page()
    for name in catalog.gpu_names() + catalog.node_names():
        entry = page.split(f"### `{name}`", 1)[1].split("###", 1)[0]
        assert "Source: " in entry and "| key | value | source |" in entry, name
    assert all(v for v in reference_pages._model_sources().values())
    for name in catalog.model_names():
        assert f"| `{name}` |" in page and "](#model-sources) |" in page.split(f"| `{name}` |", 1)[1].split("\n")[0]


def _nav_pages(node) -> set[str]:
    """Every page path that mkdocs.yml's nav lists, at any depth."""
    if isinstance(node, str):
        return {node}
    if isinstance(node, list):
        return set().union(*(_nav_pages(n) for n in node)) if node else set()
    if isinstance(node, dict):
        return set().union(*(_nav_pages(v) for v in node.values())) if node else set()
    return set()


def test_every_docs_page_is_in_the_nav_and_every_guide_in_the_readme_and_the_index():
    import yaml

    nav = _nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"])
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert pages - nav == set(), "pages missing from mkdocs.yml's nav"
    assert {p for p in nav if not p.startswith("reference/")} - pages == set(), "nav entries with no page"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    for guide in sorted(p for p in pages if p.startswith("guides/")):
        assert f"](docs/{guide})" in readme, f"README.md does not list {guide}"
        assert f"]({guide})" in index, f"docs/index.md does not list {guide}"
    for page in ("faq.md", "architecture.md"):
        assert f"]({page})" in index and f"](docs/{page})" in readme, page
    assert "](CHANGELOG.md)" in readme
