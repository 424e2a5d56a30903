"""Links from the terminal into the documentation site: one base URL, each command's guide page and
example, and the reference anchor of a scenario key.

The site (``mkdocs build``, mkdocs.yml) is served from ``DOCS_URL``; the docs hook
(docs/hooks.py) sets mkdocs' ``site_url`` from this constant, so the URL lives in one place.
``EMULATOR_DOCS_URL`` overrides it (a local build: ``file:///.../site/``). Pages are
addressed as mkdocs writes them with directory URLs: ``guides/studies.md`` is
``guides/studies/``. Key anchors are made by :func:`key_anchor`, which the reference page's
generator uses too.

Imports nothing of the emulator (the bottom layer): the CLI and the docs hook read it.
"""
from __future__ import annotations

import os
import re
from typing import Collection

# Where the documentation site is served; change it here only. The project has no public repository yet, so
# this is a placeholder in the reserved .invalid domain (as the JSON Schema's $id, scenario/schema.py): set it to
# the GitHub Pages URL (https://OWNER.github.io/REPO/) when the site is published.
DOCS_URL = "https://example.invalid/emulator/"

# command → (guide page, relative to the site, as mkdocs' directory URLs name it; an example command)
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("guides/workloads/", "emulator run scenarios/quickstart.yaml --out out/quickstart"),
    "collective": ("guides/fabrics/", "emulator collective scenarios/dgx-a100-node.yaml --op all_reduce "
                                      "--sizes 8B:1GiB"),
    "schema": ("reference/scenario/", "emulator schema > scenario.schema.json"),
    "sweep": ("guides/studies/", "emulator sweep scenarios/quickstart.yaml --vary training.global_batch=16,32 "
                                 "--db study.sqlite"),
    "search": ("guides/studies/", "emulator search scenarios/quickstart.yaml --gpus 8 --top 5"),
    "plot": ("guides/studies/", "emulator plot --db study.sqlite --x training.global_batch --y tokens_per_s "
                                "--out batch.png"),
    "calibrate": ("guides/traces/", "emulator calibrate --nccl-log all_reduce.log --base dgx-a100 --name my-dgx "
                                    "--out my-catalog.yaml"),
    "live": ("guides/live/", "emulator live scenarios/live-dgx-a100-8node.yaml --clock virtual -- "
                             "python examples/train_mlp.py"),
    "validate": ("guides/traces/", "emulator validate examples/validate/cases.csv --out validation"),
    "export": ("guides/traces/", "emulator export scenarios/quickstart.yaml --format chakra --out et/"),
    "report": ("guides/report/", "emulator report scenarios/quickstart.yaml --out quickstart.html"),
    "compare": ("guides/compare/", "emulator compare scenarios/quickstart.yaml --set parallel.tp=2 "
                                   "--set parallel.tp=4 parallel.dp=1"),
}


def docs_url(page: str = "") -> str:
    """The URL of a page of the site (``page`` relative to its root, e.g. ``guides/live/``)."""
    base = os.environ.get("EMULATOR_DOCS_URL") or DOCS_URL
    return base.rstrip("/") + "/" + page.lstrip("/")


def key_anchor(key_path: str) -> str:
    """The reference anchor of a scenario key path: list indices dropped, dots as dashes
    (``jobs[1].parallel.tp`` → ``jobs-parallel-tp``)."""
    return re.sub(r"\[\d*\]", "", key_path).strip(".").replace(".", "-")


def key_url(key_path: str, known: Collection[str] | None = None) -> str:
    """The URL of a scenario key's entry in the generated reference. With ``known`` (every key path,
    ``emulator.scenario.schema.all_key_paths()``), a key that is not one (a misspelt key) links to
    its nearest known parent, or to the page."""
    path = re.sub(r"\[\d*\]", "", key_path).strip(".")
    if known is not None:
        while path and path not in known:
            path = path.rpartition(".")[0]
    page = docs_url("reference/scenario/")
    return page + "#" + key_anchor(path) if path else page


def epilog(command: str | None = None) -> str:
    """The end of ``emulator [COMMAND] --help``: an example and the guide page."""
    if command is None:
        return ("example:\n  emulator run scenarios/quickstart.yaml --out out/quickstart\n\n"
                f"documentation: {docs_url()}\n"
                f"every scenario key: {docs_url('reference/scenario/')}")
    page, example = COMMANDS[command]
    return f"example:\n  {example}\n\nguide: {docs_url(page)}"
