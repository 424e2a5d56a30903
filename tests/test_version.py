"""``emulator --version`` prints the version written once, in setup.cfg."""
from __future__ import annotations

import configparser
import os

import pytest

from emulator.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_version_is_setup_cfg_version(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"emulator {cfg['metadata']['version']}"
