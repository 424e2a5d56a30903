"""The studies layer: many runs of one scenario, stored, resumed and compared.

Owns sweeps over scenario fields (sweep.py), the layout search (search.py, which prunes
with the scenario rule book and the memory model), the SQLite results store keyed by
scenario and emulator version (store.py), local and Dask executors (executor.py) and
study plots (plot.py).

May import: emulator.run, emulator.outputs, emulator.result, emulator.workload,
emulator.devices, emulator.network, emulator.scenario, emulator.program, emulator.fingerprint and
emulator.errors. Never tools/, live/ or the CLI.
"""
