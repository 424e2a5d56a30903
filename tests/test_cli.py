"""The command line: exit codes and one-line messages, never a traceback."""
import json
import os
import subprocess
import sys

import pytest

from emulator.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "emulator", *args], capture_output=True, text=True, cwd=ROOT)


def test_deadlocked_trace_is_reported_not_hung(tmp_path):
    trace = {"format": "emulator-trace", "version": 1, "ranks": 2, "ops": [
        {"id": 0, "rank": 0, "kind": "recv", "deps": [], "peer": 1, "bytes": 1024, "tag": 9},
        {"id": 1, "rank": 1, "kind": "compute", "deps": [], "duration": 0.001}]}
    (tmp_path / "t.json").write_text(json.dumps(trace))
    (tmp_path / "s.yaml").write_text("name: d\ncluster: {nodes: 1, node: dgx-a100}\nworkload: {trace: t.json}\n")
    out = subprocess.run([sys.executable, "-m", "emulator", "run", str(tmp_path / "s.yaml")], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 2
    assert "deadlock" in out.stderr and "recv from rank 1 tag 9" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("args,needle", [
    (["run", "no/such/file.yaml"], "no/such/file.yaml"),
    (["run", "scenarios/quickstart.yaml", "--set", "parallel.tpp=2"], "did you mean"),
    (["run", "scenarios/quickstart.yaml", "--set", "cluster.fabric.link_bandwidth=200"], "unit"),
    (["collective", "scenarios/dgx-a100-node.yaml", "--op", "all_reduse"], "all_reduce"),
    (["collective", "scenarios/dgx-a100-node.yaml", "--sizes", "8B:1"], "--sizes"),
])
def test_bad_input_exits_2_with_one_message(args, needle):
    out = _cli(*args)
    assert out.returncode == 2, out.stderr
    assert needle in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_collective_json_rows(capsys):
    # one DGX A100 (busbw 230 GB/s, launch 6.05 us, 1.975 us per step): 8 B all-reduce over 8 GPUs
    # = 6.05 + 14 × 1.975 = 33.7 us, plus 8·14/8 B / 230 GB/s (negligible: 4.9e-11 s)
    assert main(["collective", os.path.join(ROOT, "scenarios", "dgx-a100-node.yaml"), "--sizes", "8B", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert set(row) == {"bytes", "time_s", "algbw_GB_per_s", "busbw_GB_per_s", "algorithm", "protocol"}
    assert (row["algorithm"], row["protocol"]) == ("ring", "LL")  # the default; NCCL's best protocol for it
    assert row["time_s"] == pytest.approx(33.7e-6 + 14 / 8 * 8 / 230e9, rel=1e-9)


def test_schema_is_json(capsys):
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert "cluster" in schema["properties"] and "parallel" in schema["properties"]


def test_a_closed_pipe_is_not_an_internal_error():
    # `emulator run ... | head -1`: the reader leaves before the summary is written
    r, w = os.pipe()
    os.close(r)  # nobody reads: the first write gets EPIPE
    proc = subprocess.run([sys.executable, "-m", "emulator", "run", os.path.join(ROOT, "scenarios", "quickstart.yaml")],
                          cwd=ROOT, stdout=w, stderr=subprocess.PIPE, text=True, timeout=120)
    os.close(w)
    assert proc.returncode == 141 and proc.stderr == ""  # quiet, and 128 + SIGPIPE as a shell would report


def test_a_command_imports_only_its_own_plugin():
    # `emulator run` must not pay for the sweep store, the search or the plots at start-up;
    # `emulator sweep --help` still lists sweep's own options
    code = ("import sys\n"
            "from emulator.cli import main\n"
            "main(['run', 'scenarios/quickstart.yaml', '--json'])\n"
            "print(sorted(m for m in ('emulator.studies.store', 'emulator.studies.search', 'emulator.studies.plot',"
            " 'emulator.tools.calibrate') if m in sys.modules), file=sys.stderr)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0 and out.stderr.strip() == "[]", out.stderr
    help_text = subprocess.run([sys.executable, "-m", "emulator", "sweep", "--help"], cwd=ROOT,
                               capture_output=True, text=True).stdout
    assert "--db" in help_text
    listing = subprocess.run([sys.executable, "-m", "emulator", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert all(name in listing.stdout for name in ("sweep", "search", "validate", "export", "live"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task") or (os.cpu_count() or 1) < 2, reason="needs Linux, 2+ cores")
def test_run_loads_openblas_on_one_thread_and_leaves_the_environment_alone():
    # OpenBLAS starts a thread per core when numpy loads it (one more thread here, on 2+ cores);
    # `emulator run` loads it with OPENBLAS_NUM_THREADS=1: the process keeps its one thread, and the
    # variable is gone again afterwards (no child process inherits it)
    code = ("import os, sys; from emulator.cli import main; main(['run', 'scenarios/quickstart.yaml', '--json']); "
            "print(len(os.listdir('/proc/self/task')), 'OPENBLAS_NUM_THREADS' in os.environ, file=sys.stderr)")
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    env["PYTHONPATH"] = ROOT
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT, env=env)
    assert out.stderr.strip().splitlines()[-1] == "1 False"
