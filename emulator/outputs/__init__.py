"""The outputs layer: what a finished run shows, from its Result and Spans only.

Owns the summary (summary.py), spans.csv, trace.json for Perfetto, gantt.png, the
link-utilisation plot (linkplot.py), saving figures (figures.py) and atomic writes
(atomic.py), and the checks of a destination before any work (destination.py).
``write_outputs`` (run_files.py) writes the files of DESIGN.md's "Output files" as one set
(fileset.py): when summary.json exists, every file beside it is from the same run.

This face imports nothing, so that the CLI can read the small modules here (the progress bar,
printable text, the links into the docs) without loading numpy or matplotlib.

May import: emulator.result (the Result record), emulator.spans, emulator.program,
emulator.meta, emulator.scenario, emulator.network (topology names), emulator.importers (the
replay report), emulator.workload (memory per GPU) and emulator.errors. Never the run stage
(emulator.run), studies/, tools/, live/ or the CLI.
"""
