"""The studies layer: many runs of one scenario, stored, resumed and compared.

Owns sweeps over scenario fields (sweep.py), the layout search (search.py, which prunes
with the scenario rule book and the memory model), the SQLite results store keyed by
scenario and emulator version (store.py), local and Dask executors (executor.py) and
study plots (plot.py).

May import: emulator.simulation, emulator.outputs and everything below them; never
tools/, live/ or the CLI.
"""
