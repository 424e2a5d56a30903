"""The ``emulator export`` command: a scenario's workload written as another tool's trace.

``emulator export SCENARIO --format chakra --out DIR`` writes one MLCommons Chakra ET per
rank (``DIR/chakra.<rank>.et``) and the communicator-group file ASTRA-sim reads
(``DIR/comm_group.json``), the format of ``emulator.importers.chakra``. Every rank is
written (no symmetry folding: ASTRA-sim runs one workload file per NPU); a model
workload is built as ``emulator run`` builds it, a trace workload is converted as read.
"""
from __future__ import annotations

import argparse
import os
import re

from emulator.errors import EmulatorError
from emulator.importers import load_workload
from emulator.importers.chakra import export_chakra
from emulator.importers.chakra_groups import GROUP_FILE
from emulator.outputs.printable import printable
from emulator.program import Program
from emulator.scenario.checks import require_workload
from emulator.scenario.reader import load_scenario
from emulator.scenario.spec import Scenario
from emulator.workload.builder import build_program
from emulator.workload.jobs import job_scenario

FORMATS = ("chakra",)
JOB_FOLDER = re.compile(r"[\w.-]+")  # a job name that is a plain folder name (and not "." or "..", below)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", help="scenario YAML file")
    parser.add_argument("--format", default="chakra", choices=FORMATS, help="trace format (default chakra)")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder to write the trace files into")
    parser.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help="override a scenario field")


def workload_program(scenario: Scenario) -> Program:
    """One iteration of the scenario's workload, every rank."""
    if scenario.workload.trace:
        return load_workload(scenario)
    return build_program(scenario, None)


def export_command(args: argparse.Namespace) -> str:
    """Write the trace; return the lines that say what was written and how to run it in ASTRA-sim.
    A scenario with ``jobs:`` writes each job's workload, on a cluster of its own size, into
    ``DIR/<job name>/`` (ASTRA-sim runs one workload at a time: the jobs' sharing of the fabric
    is ``emulator run``'s)."""
    sc = load_scenario(args.scenario, args.set or [])
    if not sc.jobs:
        require_workload(sc)
        return _export(sc, args.out)
    for i, job in enumerate(sc.jobs):
        if not JOB_FOLDER.fullmatch(job.name) or job.name in (".", ".."):
            raise EmulatorError(f"{sc.path or sc.name}: jobs[{i}].name: export writes each job into a folder named "
                                f"after it, and {printable(repr(job.name))} is not a plain folder name (letters, "
                                "digits, '.', '_', '-')")
    return "\n".join(f"job {job.name}: " + _export(job_scenario(sc, job), os.path.join(args.out, job.name))
                     for job in sc.jobs)


def _export(sc: Scenario, folder: str) -> str:
    program = workload_program(sc)
    try:
        paths = export_chakra(program, folder)
    except OSError as e:
        raise EmulatorError(f"--out {folder}: cannot write the trace there ({e.strerror or e})") from None
    ets = len(paths) - 1
    out = folder.rstrip("/") or "/"
    return (f"wrote {ets} Chakra ET{'s' if ets != 1 else ''} ({os.path.join(out, 'chakra')}.<rank>.et) and "
            f"{os.path.join(out, GROUP_FILE)}\n"
            f"ASTRA-sim: --workload-configuration={os.path.join(out, 'chakra')} "
            f"--comm-group-configuration={os.path.join(out, GROUP_FILE)}")
