"""emulator: a SimPy discrete-event emulator of distributed DNN training.

The folders follow the pipeline, bottom to top (docs/architecture.md); each package's
docstring says what it may import, and tests/test_layers.py holds the code to it:

    errors.py, fingerprint.py, meta.py   error types; the code fingerprint; a Program's report facts
    program.py, spans.py                 the IR (per-rank op DAG); the output records
    scenario/     YAML → a validated, frozen Scenario; the rule book; the catalogs
    network/, devices/                   topologies, routes, collectives, the fabric; GPU compute costs
    importers/    traces and profiles → Program
    workload/, result.py                 scenario → Program, memory per GPU; the Result record
    run/          Program + Topology → Spans and a Result: engine, folding, faults, job mixes, wiring
    outputs/      summary.json, spans.csv, trace.json, gantt.png, link plots, metrics, the progress bar
    studies/, tools/, live/   sweeps, search and the estimate; calibration, export; live emulation
    cli.py        argument parsing only

May import: nothing (the package's face; ``emulator.cli`` is the entry point).
"""
