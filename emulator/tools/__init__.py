"""The tools layer: commands that measure or size things rather than run a job.

Owns calibration from nccl-tests logs and Kineto profiles (calibrate.py), the names of a cluster's
GPUs, switches and links (topology_listing.py: ``emulator topology``), the nccl-tests-style
table of one collective (collective_bench.py), ``emulator report`` (report.py: a scenario run, or
a saved run folder read back by run_folder.py, made into one HTML page) and ``emulator compare``
(compare.py: runs side by side).

May import: emulator.run, emulator.outputs, emulator.result, emulator.workload,
emulator.importers, emulator.devices, emulator.network, emulator.scenario, emulator.program,
emulator.spans, emulator.fingerprint and emulator.errors. Never studies/, live/ or the CLI.
"""
