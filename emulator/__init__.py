"""emulator: a SimPy discrete-event emulator of distributed DNN training.

The folders follow the pipeline, bottom to top; a module imports only from its own
layer or the layers below it (DESIGN.md, "Layout"):

    program.py, meta.py, spans.py, errors.py, fingerprint.py, printable.py   the IR and its report
                  facts, the output records, the error types, user text made safe to print
    scenario/     YAML → a validated, frozen Scenario; the rule book; the catalogs
    network/, devices/, importers/   the fabric and collectives; GPU and NIC costs; traces → Program
    workload/, engine.py, folding.py, faults.py      scenario → Program; Program + network → Spans
    mix.py        several jobs on one fabric, each also alone (run by simulation.py's runner)
    simulation.py, memory.py, metrics.py             the one place that wires a run together
    outputs/, progress.py   summary.json, spans.csv, trace.json, gantt.png, link plots; the progress bar
    studies/, tools/, live/   sweeps and layout search; calibration and benchmarks; live emulation
    cli.py        argument parsing only
"""
