"""``python -m emulator`` is the ``emulator`` command.

May import: emulator.cli.
"""
from emulator.cli import main

raise SystemExit(main())
