"""``python -m emulator`` is the ``emulator`` command."""
from emulator.cli import main

raise SystemExit(main())
