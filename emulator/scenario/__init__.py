"""The scenario layer: a YAML file becomes a validated, frozen Scenario (SI units inside).

Owns the spec (spec.py), the key table and JSON Schema (schema.py), YAML with file and
line (yamltree.py), units (units.py), the reader (reader.py), the one rule book
(checks.py), the layer split over pipeline chunks (stages.py) and the catalogs of GPUs,
nodes and models (catalog.py).

May import: emulator.errors and its own modules; never workload/, network/, devices/,
the run stage or anything above. Nothing downstream reads YAML.

The names below are the public face that scripts use (``from emulator.scenario import
load_scenario``); modules inside the package import each other directly.
"""
from emulator.scenario.checks import Violation, layout_violations, require_workload
from emulator.scenario.reader import load_scenario, load_scenario_text
from emulator.scenario.spec import (
    ClusterSpec,
    CollectivesSpec,
    FabricSpec,
    GpuSpec,
    ModelSpec,
    NodeSpec,
    Override,
    ParallelSpec,
    Scenario,
    SimulationSpec,
    TrainingSpec,
    WorkloadSpec,
)

__all__ = [
    "ClusterSpec", "CollectivesSpec", "FabricSpec", "GpuSpec", "ModelSpec", "NodeSpec", "Override", "ParallelSpec",
    "Scenario", "SimulationSpec", "TrainingSpec", "Violation", "WorkloadSpec", "layout_violations", "load_scenario",
    "load_scenario_text", "require_workload",
]
