"""The tools layer: commands that measure or size things rather than run a job.

Owns calibration from nccl-tests logs and Kineto profiles (calibrate.py), the
nccl-tests-style table of one collective (collective_bench.py) and the event-count
and wall-time estimate of a run (estimate.py).

May import: emulator.run, emulator.outputs, emulator.result, emulator.workload,
emulator.importers, emulator.devices, emulator.network, emulator.scenario, emulator.program and
emulator.errors. Never studies/, live/ or the CLI.
"""
