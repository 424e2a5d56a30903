"""The run stage: a Program on a Topology becomes Spans and a Result (the emulation itself).

Owns the wiring of one run (simulation.py: the workload, the cluster and the engine of a
scenario), the SimPy engine that runs a Program on the fabric (engine.py), the block ops that
stand for a unit's kernels (block.py), symmetry folding (folding.py: which ranks are simulated
once, and the stamped copies of an unfolded run), faults and stragglers on a built cluster
(faults.py), and several jobs on one fabric (mix.py). What a run produced is a
``emulator.result.Result``, which reports read without importing this package.

May import: emulator.workload, emulator.importers, emulator.network, emulator.devices,
emulator.scenario, emulator.result, emulator.program, emulator.spans and emulator.errors.
Never outputs/, studies/, tools/, live/ or the CLI.
"""
