"""Your own model, used as a new user would: sizes the trace contradicts, keys a profile cannot
honour, traces recorded the wrong way. Each ends in exit 2 with one line naming the key (or the
cause) and both values, or in a stated law applied."""
import dataclasses
import gzip
import json
import os

import pytest

from emulator.cli import main
from emulator.importers.native import TraceError
from emulator.importers.profile import read_profile
from emulator.scenario.spec import ProfiledSpec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRACE = os.path.join(ROOT, "traces", "h200-hf-gpt-1.3b", "trace.json.gz")
SPEC = ProfiledSpec(micro_batch=4, seq_len=2048, layers=24, hidden=2048, heads=16, vocab=50257)
LLAMA = os.path.join(ROOT, "tests", "data", "profiles", "llama-cpu.json.gz")
LLAMA_SPEC = ProfiledSpec(micro_batch=2, seq_len=64, layers=4, hidden=256, heads=8, kv_heads=2, ffn_hidden=704,
                          vocab=1000)
PROFILED = "{micro_batch: 4, seq_len: 2048, layers: 24, hidden: 2048, heads: 16, vocab: 50257}"


def _refused(path: str, spec: ProfiledSpec, **change) -> str:
    with pytest.raises(TraceError) as err:
        read_profile(path, dataclasses.replace(spec, **change))
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def _scenario(tmp_path, extra: str = "", profiled: str = PROFILED, node: str = "{preset: dgx-h200, gpus_per_node: 1}",
              workload: str = "") -> str:
    path = tmp_path / "s.yaml"
    path.write_text(f"name: p\ncluster: {{nodes: 1, node: {node}}}\n"
                    f"workload:\n  profile: {TRACE}\n  profiled: {profiled}\n{workload}" + extra)
    return str(path)


def _exit2(capsys, path: str, *args: str) -> str:
    assert main(["run", path, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def _mutated(tmp_path, name: str, change) -> str:
    """The H200 trace with ``change`` applied to its event list."""
    with gzip.open(TRACE, "rt") as f:
        data = json.load(f)
    data["traceEvents"] = change(data["traceEvents"])
    out = tmp_path / name
    with gzip.open(out, "wt") as f:
        json.dump(data, f)
    return str(out)


# ---------------------------------------------------------------------------- 1. sizes the trace contradicts


@pytest.mark.parametrize("layers", [12, 8, 10, 25, 48, 1])
def test_a_layer_count_the_trace_contradicts_names_both(layers):
    # 24 blocks of 34 kernels each in the forward: a divisor (12: two real blocks would make one "block"),
    # fewer, more or one are each refused with the count the trace has
    msg = _refused(TRACE, SPEC, layers=layers)
    assert f"workload.profiled.layers is {layers}" in msg and "runs 24 times" in msg


def test_a_wrong_layer_count_exits_2_from_the_cli(tmp_path, capsys):
    err = _exit2(capsys, _scenario(tmp_path, profiled=PROFILED.replace("layers: 24", "layers: 12")))
    assert "workload.profiled.layers is 12" in err and "24 times" in err


def test_a_wrong_mlp_width_names_both():
    # GPT-2's MLP: [2048, 8192] up, [8192, 2048] down; 4096 is no GEMM's dimension (8192 = 2 x 4096 alone
    # would pass for a fused gate and up, but no down projection reads 4096)
    msg = _refused(TRACE, SPEC, ffn_hidden=4096)
    assert "workload.profiled.ffn_hidden is 4096" in msg and "8192" in msg
    # Llama's 704, left out: the default 4 x 256 = 1024
    msg = _refused(LLAMA, LLAMA_SPEC, ffn_hidden=None)
    assert "ffn_hidden is 1024 (absent: 4 x hidden)" in msg and "704" in msg


def test_wrong_key_value_heads_name_both():
    # GPT-2's attention k has all 16 heads and its fused QKV is 3 x 2048 = 6144 wide; kv_heads 4 would make
    # it (16 + 2*4) * 128 = 3072 with key/value projections of 4 * 128 = 512
    msg = _refused(TRACE, SPEC, kv_heads=4)
    assert "workload.profiled.kv_heads is 4" in msg and "512" in msg and "6144" in msg
    # Llama's k holds 2 heads; left out, kv_heads is the 8 heads
    msg = _refused(LLAMA, LLAMA_SPEC, kv_heads=None)
    assert "kv_heads is 8" in msg and "2 key heads" in msg


def test_a_wrong_sequence_length_is_named_not_blamed_on_the_vocabulary():
    # GPT-2's position table has 2048 rows: at seq_len 1024 it is longer than the sequence, but it is not
    # the vocabulary's; the attention's q says 2048
    msg = _refused(TRACE, SPEC, seq_len=1024)
    assert "workload.profiled.seq_len is 1024" in msg and "2048 in the attention's q" in msg
    assert "vocab" not in msg
    msg = _refused(TRACE, SPEC, vocab=50304)
    assert "workload.profiled.vocab is 50304" in msg and "50257" in msg


# ---------------------------------------------------------------------------- 4. messages that name the cause


def _no_shapes(events):
    for e in events:
        if isinstance(e.get("args"), dict):
            for k in ("Input Dims", "Input type", "Input Strides", "Concrete Inputs"):
                e["args"].pop(k, None)
    return events


def _no_steps(events):
    return [e for e in events if not str(e.get("name", "")).startswith("ProfilerStep#")]


def _forward_only(events):
    """Every step cut before its backward: nothing is launched under autograd's engine."""
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events if str(e.get("name", "")).startswith("ProfilerStep#")
             and e.get("cat") != "gpu_user_annotation"]
    cuts = []
    for t0, t1 in steps:
        bwd = [e["ts"] for e in events if e.get("cat") == "cpu_op" and t0 <= e["ts"] <= t1
               and ("autograd::engine" in str(e.get("name")) or "Backward" in str(e.get("name")))]
        cuts.append((min(bwd), t1))
    gone = {e.get("args", {}).get("correlation") for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")
            and any(a <= e["ts"] <= b for a, b in cuts)}
    return [e for e in events if not (e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
                                      and e.get("args", {}).get("correlation") in gone)
            and not (e.get("cat") in ("cpu_op", "cuda_runtime", "cuda_driver", "python_function")
                     and any(a <= e.get("ts", -1) <= b for a, b in cuts))]


def test_a_trace_without_shapes_says_record_shapes(tmp_path, capsys):
    path = _mutated(tmp_path, "noshapes.json.gz", _no_shapes)
    err = _exit2(capsys, _with_trace(tmp_path, path))
    assert "recorded without shapes" in err and "record_shapes=True" in err


def test_a_trace_without_profiler_steps_says_schedule_and_step(tmp_path, capsys):
    # the three profiled steps read whole: the model's blocks run 3 x 24 times; not "gradient accumulation"
    path = _mutated(tmp_path, "nostep.json.gz", _no_steps)
    err = _exit2(capsys, _with_trace(tmp_path, path))
    assert "no ProfilerStep" in err and "prof.step()" in err and "one step" in err
    assert "gradient accumulation" not in err


def test_a_forward_only_trace_says_it_has_no_backward(tmp_path, capsys):
    path = _mutated(tmp_path, "fwd.json.gz", _forward_only)
    err = _exit2(capsys, _with_trace(tmp_path, path))
    assert "no backward pass" in err and "layers" not in err


def _with_trace(tmp_path, trace: str) -> str:
    path = tmp_path / "t.yaml"
    path.write_text(f"name: p\ncluster: {{nodes: 1, node: {{preset: dgx-h200, gpus_per_node: 1}}}}\n"
                    f"workload:\n  profile: {trace}\n  profiled: {PROFILED}\n")
    return str(path)
