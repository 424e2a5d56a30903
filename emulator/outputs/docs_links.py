"""Links from the terminal into the documentation: one site URL, each command's guide page and
example, and the reference anchor of a scenario key.

``SITE_URL`` is the one place the documentation site's URL is kept; the docs hook (docs/hooks.py)
sets mkdocs' ``site_url`` from it. ``EMULATOR_DOCS_URL`` overrides it (a local build:
``file:///.../site/``). With a site, pages are addressed as mkdocs writes them with directory
URLs: ``guides/studies/`` is ``guides/studies.md``'s page. While there is no site (``SITE_URL``
is empty: the project has no public site yet), a page is its path in the repository
(``docs/guides/studies.md``), which a clone has, and a key's entry in the generated reference is
named in ``emulator schema``'s output, which holds the same description. Key anchors are made by
:func:`key_anchor`, which the reference page's generator uses too.

Imports nothing of the emulator (the bottom layer): the CLI and the docs hook read it.
"""
from __future__ import annotations

import os
import re
from typing import Collection

# Where the documentation site is served; change it here only. Empty: there is no public site yet, and
# links name the pages' paths in the repository. Set it to the site's URL (https://OWNER.github.io/REPO/)
# when the site is published.
SITE_URL = ""

# command → (guide page, relative to the site, as mkdocs' directory URLs name it; an example command)
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("guides/workloads/", "emulator run scenarios/quickstart.yaml --out out/quickstart"),
    "collective": ("guides/fabrics/", "emulator collective scenarios/dgx-a100-node.yaml --op all_reduce "
                                      "--sizes 8B:1GiB"),
    "topology": ("guides/failures/", "emulator topology scenarios/spine-link-failure.yaml"),
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


def site_url() -> str:
    """The documentation site's URL, or "" while there is none."""
    return os.environ.get("EMULATOR_DOCS_URL") or SITE_URL


def docs_url(page: str = "") -> str:
    """Where to read a page (``page`` relative to the site's root, e.g. ``guides/live/``): its URL on the
    site, or without one its path in the repository (``docs/guides/live.md``; the root: ``README.md``)."""
    base = site_url()
    if base:
        return base.rstrip("/") + "/" + page.lstrip("/")
    page = page.strip("/")
    return f"docs/{page}.md" if page else "README.md"


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
    if not site_url():  # the reference page is generated at build time: name the schema that holds the entry
        return f"`{path}` in `emulator schema`" if path else "`emulator schema`"
    page = docs_url("reference/scenario/")
    return page + "#" + key_anchor(path) if path else page


def epilog(command: str | None = None) -> str:
    """The end of ``emulator [COMMAND] --help``: an example and the guide page."""
    if command is None:
        return ("example:\n  emulator run scenarios/quickstart.yaml --out out/quickstart\n\n"
                f"documentation: {docs_url()}\n"
                f"every scenario key: {key_url('')}")
    page, example = COMMANDS[command]
    return f"example:\n  {example}\n\nguide: {docs_url(page)}"
