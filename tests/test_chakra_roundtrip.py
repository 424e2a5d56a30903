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


MOE = """
name: rt-moe
cluster: {nodes: 2, node: dgx-h100, fabric: {kind: fat_tree}}
model: {layers: 2, hidden: 1024, heads: 8, seq_len: 1024, vocab: 32000, experts: 16, top_k: 2, moe_permute_fusion: true}
training: {global_batch: 16, micro_batch: 1, attention: flash}
parallel: {tp: 1, pp: 1, dp: 16, ep: 16, etp: 1, moe_token_dispatcher_type: flex, moe_flex_dispatcher_backend: %s}
"""


@pytest.mark.parametrize("backend", ["deepep", "hybridep"])
def test_a_moe_token_exchange_exports_as_an_all_to_all_and_reads_back_as_itself(backend, tmp_path):
    """Chakra has no comm_type for a routing-dependent exchange (DeepEP's or HybridEP's dispatch and combine): the
    file says ALL_TO_ALL (6) for other tools, and the emulator's own import reads its plan back."""
    from emulator.importers.chakra import _attrs, _pb, _read_file  # noqa: PLC0415

    sc = load_scenario_text(MOE % backend, "rt.yaml")
    program = build_program(sc, None)
    export_chakra(program, str(tmp_path))
    exchanges = {op.collective for op in program.ops if op.collective.startswith(backend)}
    assert exchanges  # the dispatch and the combine, each a plan of its own
    nodes = [_attrs(n) for n in _read_file(_pb(), 0, 0, str(tmp_path / "chakra.0.et")).nodes]
    written = [a for a in nodes if a.get("emu_collective", "").startswith(backend)]
    assert written and all(int(a["comm_type"]) == 6 for a in written)
    back = load_chakra(str(tmp_path))
    assert {op.collective for op in back.ops if op.collective.startswith(backend)} == exchanges
    a = run_program(program, sc, record_links=False).iteration_time_s
    b = run_program(back, sc, record_links=False).iteration_time_s
    assert b == pytest.approx(a, rel=1e-9)
