"""MkDocs hooks (mkdocs.yml ``hooks:``): the pages generated from the code and the results files.

- ``on_config``: the site's URL is emulator/outputs/docs_links.py's ``SITE_URL`` when there is one
  (one place for the CLI's links and the site);
- ``on_files``: the reference pages (docs/reference_pages.py) are added as generated files, built
  from this checkout's ``emulator`` package, never written into docs/; the figures of plots/ are
  added as ``plots/NAME``;
- ``on_page_markdown``: each ``<!-- results: NAME -->`` line becomes the table rendered from
  benchmarks/results/*.json (docs/results_tables.py).
"""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for path in (HERE, ROOT):  # this checkout's emulator package and the generators beside this file
    if path not in sys.path:
        sys.path.insert(0, path)

import reference_pages  # noqa: E402
import results_tables  # noqa: E402
from mkdocs.structure.files import File  # noqa: E402

from emulator.outputs.docs_links import site_url  # noqa: E402


def on_config(config):
    if site_url():  # none while the project has no public site
        config["site_url"] = site_url()
    return config


def on_files(files, config):
    for path, make in reference_pages.PAGES.items():
        files.append(File.generated(config, path, content=make()))
    for name in sorted(os.listdir(os.path.join(ROOT, "plots"))):  # the figures the guides show, as plots/NAME
        if name.endswith((".png", ".svg")):
            files.append(File(f"plots/{name}", src_dir=ROOT, dest_dir=config["site_dir"],
                              use_directory_urls=config["use_directory_urls"]))
    return files


def on_page_markdown(markdown, page, config, files):
    return results_tables.render(markdown)
