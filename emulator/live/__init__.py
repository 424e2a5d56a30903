"""Live emulation: run an unmodified PyTorch training script as a few real ranks of a large emulated cluster.

- ``backend``: the ``emulator`` torch.distributed ProcessGroup (mirror data, emulated timing);
- ``session``: the record of the run (collectives on emulated streams, waits, iterations);
- ``cost``: costs each intercepted collective on the scenario's cluster (Engine + flow model);
- ``clock``: the local rank's wall or virtual clock;
- ``run``: the child process entry (``python -m emulator.live.run SCRIPT``);
- ``launcher``: the ``emulator live`` subcommand; ``report``: summary and Perfetto trace.

Only ``backend`` and ``run`` import torch, and only when used: this package and
``launcher`` import without it.

May import: emulator.run, emulator.outputs, emulator.workload, emulator.devices,
emulator.network, emulator.scenario, emulator.program and emulator.errors; never studies/,
tools/ or the CLI.
"""
