"""The workload layer: a model scenario becomes a Program (one training iteration per rank).

Owns the model sizes (models.py), FLOP counts (flops.py), the per-layer kernels and
communication (layer.py), rank placement (placement.py), pipeline schedules
(schedules.py), the rank-independent build plan (plan.py) and the per-rank builder
(builder.py). Layout rules come from the rule book, emulator/scenario/rules.py.

May import: emulator.errors, emulator.program, emulator.meta, emulator.scenario,
emulator.devices (compute costs), emulator.importers (a profiled step) and its own modules.
Never network/, the run stage or anything above.
"""
