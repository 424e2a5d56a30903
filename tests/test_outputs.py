"""Output files: names, columns, atomic writes, Perfetto naming, and determinism."""
import csv
import json
import os

from emulator.cli import main
from emulator.spans import CSV_COLUMNS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICK = os.path.join(ROOT, "scenarios", "quickstart.yaml")


def _run(out, capsys):
    assert main(["run", QUICK, "--out", str(out)]) == 0
    capsys.readouterr()
    return {n: (out / n).read_bytes() for n in ("summary.json", "spans.csv", "trace.json", "gantt.png")}


def test_outputs_exist_with_the_contract_shapes(tmp_path, capsys):
    files = _run(tmp_path / "a", capsys)
    rows = list(csv.reader(files["spans.csv"].decode().splitlines()))
    assert tuple(rows[0]) == CSV_COLUMNS
    summary = json.loads(files["summary.json"])
    assert summary["scenario"] == "quickstart" and summary["gpus"] == 8
    trace = json.loads(files["trace.json"])
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    # rank 4 is stage 1's representative: node 0, GPU 4
    assert "rank 4 · node 0 · gpu 4" in names and "fabric links (GB/s)" in names
    assert any(e["ph"] == "C" for e in trace["traceEvents"])  # link utilisation counters
    assert files["gantt.png"][:8] == b"\x89PNG\r\n\x1a\n"
    assert not [n for n in os.listdir(tmp_path / "a") if n.startswith(".tmp-")]  # no leftovers


def test_same_input_gives_byte_identical_outputs(tmp_path, capsys):
    a = _run(tmp_path / "a", capsys)
    b = _run(tmp_path / "b", capsys)
    for name in ("spans.csv", "trace.json", "gantt.png"):
        assert a[name] == b[name], name
    sa, sb = json.loads(a["summary.json"]), json.loads(b["summary.json"])
    sa["sim"].pop("wall_s"), sb["sim"].pop("wall_s")  # the host's wall-clock time, the one varying field
    assert sa == sb


def test_streamed_trace_is_what_json_dump_writes(tmp_path, capsys):
    """write_trace streams the events in chunks through the C encoder; the file must be the bytes
    json.dump writes of the whole document, whatever the chunking (0 events, a partial chunk,
    exact chunks, a chunk and one)."""
    import io

    from emulator.outputs.perfetto import trace_events, write_trace
    from emulator.run.simulation import simulate
    from emulator.scenario.reader import load_scenario

    events = trace_events(simulate(load_scenario(QUICK)))
    head = {"displayTimeUnit": "ms", "otherData": {"scenario": "quickstart · ü"}}
    for n in (0, 1, 3, 6, 7, len(events)):
        want = io.StringIO()
        json.dump({**head, "traceEvents": events[:n]}, want, separators=(",", ":"))
        got = io.StringIO()
        write_trace(got, head, iter(events[:n]), chunk=3)
        assert got.getvalue() == want.getvalue(), n
    assert len(events) > 7  # the last case spans several chunks
