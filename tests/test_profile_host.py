"""Your own model: the host's part of a profiled step. The profiler's own cost taken out of the host's
launch gaps (PROFILER_OP_S, PROFILER_LAUNCH_S), and a step the host's launches set named as host-bound,
with its host floor, in the JSON summary (``host_bound``) and in one line of the table."""
import json
import os

import pytest

from emulator.cli import main
from emulator.importers import profile as IP
from emulator.importers.kineto_reader import read_rank
from emulator.importers.profile import read_profile
from emulator.scenario.spec import ProfiledSpec
from emulator.workload.profiled import PARTS, host_load

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRACE = os.path.join(ROOT, "traces", "h200-hf-gpt-1.3b", "trace.json.gz")
LLAMA = os.path.join(ROOT, "tests", "data", "profiles", "llama-cpu.json.gz")
LLAMA_SPEC = ProfiledSpec(micro_batch=2, seq_len=64, layers=4, hidden=256, heads=8, kv_heads=2, ffn_hidden=704,
                          vocab=1000)
LLAMA_PROFILED = ("{micro_batch: 2, seq_len: 64, layers: 4, hidden: 256, heads: 8, kv_heads: 2, ffn_hidden: 704, "
                  "vocab: 1000}")
GPT_PROFILED = "{micro_batch: 4, seq_len: 2048, layers: 24, hidden: 2048, heads: 16, vocab: 50257}"


def _scenario(tmp_path, trace: str, profiled: str, extra: str = "",
              node: str = "{preset: dgx-h200, gpus_per_node: 1}") -> str:
    path = tmp_path / "s.yaml"
    path.write_text(f"name: h\ncluster: {{nodes: 1, node: {node}}}\nworkload:\n  profile: {trace}\n"
                    f"  profiled: {profiled}\n" + extra)
    return str(path)


def _run(capsys, path: str, *extra: str) -> tuple[int, str]:
    code = main(["run", path, *extra])
    return code, capsys.readouterr().out


def test_host_load_by_hand():
    # (GPU s, host gap, sync, dispatch) of a tiny step whose host gaps dominate: three 1 s kernels, each
    # launched 5 s after the last. Host floor 5 + 5 + 5 = 15 s, GPU busy 3 s. Two steps back to back: the
    # host launches at 5, 10, 15 | 20, 25, 30; the GPU runs each the moment it is launched, so in step 2 it
    # idles 20 - 16 = 4, 25 - 21 = 4, 30 - 26 = 4 s: the step is 3 + 12 = 15 s, the host floor
    seq = [(1.0, 5.0, False, 0.0)] * 3
    assert host_load(seq) == (15.0, 3.0, 15.0)
    # a GPU twice as fast leaves the step at the host's 15 s: a faster GPU does not shorten it
    assert host_load([(0.5, 5.0, False, 0.0)] * 3) == (15.0, 1.5, 15.0)
    # a GPU-bound step: 10 s kernels launched 1 s apart. The GPU never waits after the first launch
    # (step 1: C = 1, 2, 3, G ends 11, 21, 31; step 2: C = 4, 5, 6, all before G frees): the step is its 30 s
    assert host_load([(10.0, 1.0, False, 0.0)] * 3) == (3.0, 30.0, 30.0)


def test_the_profilers_cost_comes_out_of_each_launch_gap(monkeypatch):
    rt = read_rank(TRACE)
    g1 = rt.gpu_ops[1]  # the second kernel: its gap runs from the first one's launch to its own
    prev = rt.gpu_ops[0].launch_ts
    ops = sum(1 for t in rt.host_op_ts if prev < t <= g1.launch_ts)  # the ops recorded in between
    raw = g1.launch_ts - prev  # no sync in the step's first launches
    monkeypatch.setattr(IP, "PROFILER_OP_S", 0.0)
    assert IP.launch_gaps(rt)[1] == pytest.approx(raw, abs=1e-12)
    monkeypatch.setattr(IP, "PROFILER_OP_S", 1e-6)
    monkeypatch.setattr(IP, "PROFILER_LAUNCH_S", 2e-6)
    # each recorded op 1 us, the launch 2 us: raw - ops * 1 us - 2 us (never below 0)
    assert IP.launch_gaps(rt)[1] == pytest.approx(max(0.0, raw - ops * 1e-6 - 2e-6), abs=1e-12)


def test_a_host_bound_profile_says_so_in_one_line_with_its_host_floor(tmp_path, capsys):
    # tests/data/profiles/make_cpu_profile.py: a Llama step's ops from a CPU run, each kernel as long as its
    # op's CPU time and launched inside it, so the host's gaps between launches (the ops' own CPU time and
    # the Python between them) outlast the kernels: host-bound by construction
    prof = read_profile(LLAMA, LLAMA_SPEC)
    L = LLAMA_SPEC.layers
    n = {part: (L if part.startswith("block") else 1) for part in PARTS}
    floor = sum(n[p] * k.launch_gap for p in PARTS for k in getattr(prof, p))
    busy = sum(n[p] * k.seconds for p in PARTS for k in getattr(prof, p))
    assert floor > busy  # the premise, from the trace itself
    path = _scenario(tmp_path, LLAMA, LLAMA_PROFILED)
    code, out = _run(capsys, path, "--json")
    assert code == 0
    s = json.loads(out)
    hb = s["host_bound"]
    # at the profiled sizes on the node's GPU every kernel keeps its measured time: the replay's host floor
    # is the sum of the launch gaps, its GPU busy time the kernels' sum; the GPU waits on the host for the
    # rest, so the step is the host floor (the host never waits: no sync in the step)
    assert hb["host_floor_s"] == pytest.approx(floor, rel=1e-9)
    assert hb["gpu_busy_s"] == pytest.approx(busy, rel=1e-9)
    assert hb["step_s"] == pytest.approx(floor, rel=1e-9)
    assert s["iteration_time_s"] == pytest.approx(hb["step_s"], rel=1e-9)  # one GPU, one micro-batch: the step
    assert hb["profiler_op_s"] == IP.PROFILER_OP_S and hb["profiler_launch_s"] == IP.PROFILER_LAUNCH_S
    code, out = _run(capsys, path)
    lines = [line for line in out.splitlines() if line.startswith("host-bound")]
    assert len(lines) == 1
    ms = f"{floor * 1e3:.1f} ms"
    assert f"the host's launches take {ms} of the {ms} step" in lines[0]
    assert "a faster GPU will not shorten it" in lines[0] and "CUPTI" in lines[0]


def test_a_gpu_bound_profile_is_not_called_host_bound(tmp_path, capsys):
    # the H200 trace: the host's launches take about 160 ms of its 261 ms step, the kernels about 250 ms
    # (traces/h200-hf-gpt-1.3b/README.md: the GPU 98% busy)
    code, out = _run(capsys, _scenario(tmp_path, TRACE, GPT_PROFILED), "--json")
    s = json.loads(out)
    assert code == 0 and "host_bound" not in s
    code, out = _run(capsys, _scenario(tmp_path, TRACE, GPT_PROFILED))
    assert "host-bound" not in out
