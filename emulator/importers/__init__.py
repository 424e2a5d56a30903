"""The importers layer: every trace format becomes the same Program IR.

Owns the project's own trace format (native.py), PyTorch Kineto profiles
(kineto_reader.py reads, kineto.py builds), MLCommons Chakra execution traces
(chakra.py, import and export) and the measured-vs-emulated replay report
(replay_report.py).

May import: emulator.errors, emulator.program, emulator.meta, emulator.scenario,
emulator.devices (the kernel classes and element sizes a profile is read with) and its own
modules; never workload/, the run stage or anything above.

``FORMATS`` maps a ``workload.format`` name to its loader (small named plug-ins);
the Kineto and Chakra loaders are imported on demand, so neither their code nor
their optional dependencies load unless a scenario asks for them.
"""
from __future__ import annotations

from typing import Callable

from emulator.errors import EmulatorError
from emulator.program import Program
from emulator.scenario.spec import Scenario, WorkloadSpec


def _emulator(w: WorkloadSpec) -> Program:
    from emulator.importers.native import load_trace

    if w.mirror:
        raise EmulatorError("workload.mirror applies to kineto traces only")
    return load_trace(w.trace or "")


def _kineto(w: WorkloadSpec) -> Program:
    from emulator.importers.kineto import load_kineto

    return load_kineto(w.trace or "", mirror=w.mirror)


def _chakra(w: WorkloadSpec) -> Program:
    from emulator.importers.chakra import load_chakra

    if w.mirror:
        raise EmulatorError("workload.mirror applies to kineto traces only")
    return load_chakra(w.trace or "", groups=w.comm_groups)


FORMATS: dict[str, Callable[[WorkloadSpec], Program]] = {
    "emulator": _emulator,
    "kineto": _kineto,
    "chakra": _chakra,
}


def load_workload(scenario: Scenario) -> Program:
    """The Program of a scenario whose workload is a trace file."""
    w = scenario.workload
    loader = FORMATS.get(w.format)
    if loader is None:
        raise EmulatorError(f"workload.format: expected one of {', '.join(FORMATS)}, got {w.format!r}")
    gpus = scenario.gpus
    if w.mirror and gpus and w.mirror > gpus:  # before building: each mirrored rank costs its own ops
        raise EmulatorError(f"{scenario.path or scenario.name}: workload.mirror: {w.mirror} ranks but the "
                            f"cluster has {gpus} GPUs; expected at most {gpus}")
    return loader(w)
