"""The tools layer: commands that measure or size things rather than run a job.

Owns calibration from nccl-tests logs and Kineto profiles (calibrate.py), the
nccl-tests-style table of one collective (collective_bench.py) and the event-count
and wall-time estimate of a run (estimate.py); ``emulator report`` (report.py: a scenario run,
or a saved run folder read back by run_folder.py, made into one HTML page) and ``emulator
compare`` (compare.py: runs side by side).

May import: emulator.simulation, emulator.outputs and everything below them; never
studies/, live/ or the CLI.
"""
