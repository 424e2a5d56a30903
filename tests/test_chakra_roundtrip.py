"""A generated workload exported to Chakra and imported back emulates to the same iteration time."""
import pytest

pytest.importorskip("chakra.schema.protobuf.et_def_pb2", reason="the chakra extra (mlc-chakra) is not installed")

from emulator.importers.chakra import export_chakra, load_chakra  # noqa: E402
from emulator.run.simulation import run_program  # noqa: E402
from emulator.scenario import load_scenario_text  # noqa: E402
from emulator.workload.builder import build_program  # noqa: E402

TEXT = """
name: rt
cluster: {nodes: 2, node: dgx-a100, fabric: {kind: fat_tree}}
model: {preset: gpt3-125m, layers: 4}
training: {global_batch: 16, micro_batch: 1}
parallel: {tp: 2, pp: 2, dp: 4, schedule: 1f1b}
"""


def test_chakra_round_trip_same_iteration_time(tmp_path):
    sc = load_scenario_text(TEXT, "rt.yaml")
    program = build_program(sc, None)
    files = export_chakra(program, str(tmp_path))
    assert len(files) == 17  # one file per rank, then the communicator-group file
    back = load_chakra(str(tmp_path))
    a = run_program(program, sc, record_links=False).iteration_time_s
    b = run_program(back, sc, record_links=False).iteration_time_s
    assert b == pytest.approx(a, rel=1e-9)
