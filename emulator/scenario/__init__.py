"""The scenario layer: a YAML file becomes a validated, frozen Scenario (SI units inside).

Owns the spec (spec.py: the dataclasses, whose fields describe every scenario key; how
to add a key is in its docstring), the key metadata and the walk that derives the key
table (keys.py), the key table and the JSON Schema derived from the spec (schema.py),
YAML with file and line (yamltree.py), units (units.py), ``--set`` assignments
(assignments.py), the reader (reader.py), the one rule book (rules.py), the loader's
cross-key checks of a read scenario (checks.py), the layer split over pipeline chunks
(stages.py) and the catalogs of GPUs, nodes and models (catalog.py).

May import: emulator.errors and its own modules; never workload/, network/, devices/,
the run stage or anything above. Nothing downstream reads YAML.

The names below are the public face that scripts use (``from emulator.scenario import
load_scenario``); modules inside the package import each other directly.
"""
from emulator.scenario.checks import require_workload
from emulator.scenario.reader import load_scenario, load_scenario_text
from emulator.scenario.rules import Violation, layout_violations
from emulator.scenario.spec import (
    ClusterSpec,
    CollectivesSpec,
    FabricSpec,
    Fault,
    GpuSpec,
    ModelSpec,
    NodeSpec,
    ParallelSpec,
    Scenario,
    SimulationSpec,
    TrainingSpec,
    WorkloadSpec,
)

__all__ = [
    "ClusterSpec", "CollectivesSpec", "FabricSpec", "Fault", "GpuSpec", "ModelSpec", "NodeSpec", "ParallelSpec",
    "Scenario", "SimulationSpec", "TrainingSpec", "Violation", "WorkloadSpec", "layout_violations", "load_scenario",
    "load_scenario_text", "require_workload",
]
