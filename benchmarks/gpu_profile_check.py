"""Profile -> predict, checked on a real GPU: your own model at other sizes, batches and families.

    python benchmarks/gpu_profile_check.py [--out DIR] [--steps 10] [--only gpt2-base,...]
    python benchmarks/gpu_profile_check.py --cross --json FILE [--out DIR] [--no-compile]

Needs one CUDA GPU, torch and transformers (no downloads: every model is built from its config with
random weights and trained on random token ids). Under 5 minutes on one H200. Not part of CI.

For each configuration below it trains the model as a plain Hugging Face loop does (fp32 weights,
``torch.autocast(bfloat16)``, ``AdamW(fused=True)``, ``zero_grad(set_to_none=True)``):
1. the measured step: CUDA events around each of ``--steps`` steps after 3 warm-ups, median;
2. for the *base* configuration of each family, a profile: ``torch.profiler`` with
   ``record_shapes=True`` and ``schedule(wait=0, warmup=1, active=2)``, written as a Kineto trace.

Then it predicts every configuration of a family from that family's base profile alone, with
``emulator run`` of a scenario whose ``workload.profile`` is the base trace and whose ``model`` and
``training.micro_batch`` are the configuration's, and prints measured, predicted and the error.
The base configuration predicts its own profile (the 3 % check); the others are the reshaping check
(10 % mean absolute error, 15 % each). Results: ``DIR/gpu_profile_check.json`` and
``benchmarks/results/gpu_profile_check.json`` (written atomically).

``--cross``: one GPU kind predicted from another's profile (issue #41). On the lent GPU it trains the
GPT-3 1.3B shape exactly as ``../shared/traces/kineto/h200-hf-gpt-1.3b/`` was recorded (its README:
``GPT2Config`` with dropout 0, SDPA, fp32 weights, bf16 autocast, fused AdamW, micro-batch 4 x 2048),
measures its unprofiled step (CUDA events, median of ``--steps`` after 3 warm-ups), profiles it, and
predicts, side by side with the measured steps:

- the round trip: the lent GPU's trace on a one-GPU node of the lent GPU (3 %);
- the H200 step measured in that README from the lent GPU's trace (10 %);
- the reverse: the H200 trace predicted on the lent GPU (10 %);
- a ``torch.compile``d step (unless ``--no-compile``): profiled at micro-batch 2, predicted at 2 (round
  trip) and at 4 against its measured step (10 %), with the compiled share the summary names;
- CUPTI's cost per launch: the host's time to issue ``LAUNCHES`` tiny kernels (``x.add_(1)`` on one
  element), without the profiler, under ``activities=[CUDA]`` and under ``[CPU, CUDA]`` with
  ``record_shapes``; the fastest of 5 runs each. The first difference per launch is CUPTI's
  (emulator/importers/profile.py PROFILER_LAUNCH_S), the second per launch that and the recorded op's;
  the per-op cost of this host's CPU profiler (benchmarks/profiler_overhead.py) beside them.

Prints one table and writes the JSON to ``--json FILE`` (after each stage, so a run stopped at a time limit
keeps what it measured). Not yet run on a GPU: estimated at about 5 minutes on one H100, the two
compilations of the 1.3B model most of it. Each row carries its summary's MFU, to check none is above 100 %.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results", "gpu_profile_check.json")
# The H200 trace (the shared inputs' copy when present, else the clone's own copy of it) and the step it was
# measured at without the profiler: ../shared/traces/kineto/h200-hf-gpt-1.3b/README.md, medians of two runs
# of 10 steps, 262.2 and 260.5 ms, and the peak memory allocated, 53.4 GiB.
H200_TRACES = (os.path.join(ROOT, "..", "shared", "traces", "kineto", "h200-hf-gpt-1.3b", "trace.json.gz"),
               os.path.join(ROOT, "traces", "h200-hf-gpt-1.3b", "trace.json.gz"))
H200_MEASURED_S = (0.2622 + 0.2605) / 2
H200_PEAK_B = 53.4 * 2**30
H200_NODE = "dgx-h200"
LAUNCHES = 20000


@dataclass(frozen=True)
class Config:
    """One model configuration of a family: the sizes, the micro-batch, the sequence."""

    name: str
    family: str  # gpt2 | llama
    base: bool  # the family's profiled configuration
    layers: int
    hidden: int
    heads: int
    vocab: int
    micro_batch: int
    seq_len: int
    kv_heads: int = 0
    ffn_hidden: int = 0


CONFIGS = (
    # GPT-2 style (the shared trace's family): the base is the GPT-3 1.3B shape of ../shared/traces/kineto/
    Config("gpt2-base", "gpt2", True, 24, 2048, 16, 50257, 4, 2048),
    Config("gpt2-mb2", "gpt2", False, 24, 2048, 16, 50257, 2, 2048),
    Config("gpt2-mb8", "gpt2", False, 24, 2048, 16, 50257, 8, 2048),
    Config("gpt2-seq1024", "gpt2", False, 24, 2048, 16, 50257, 4, 1024),
    Config("gpt2-h1536", "gpt2", False, 24, 1536, 16, 50257, 4, 2048),
    Config("gpt2-l16", "gpt2", False, 16, 2048, 16, 50257, 4, 2048),
    Config("gpt2-v50304", "gpt2", False, 24, 2048, 16, 50304, 4, 2048),
    # Llama style (RMSNorm, SwiGLU, RoPE, grouped-query attention): the Llama-3.2-1B shape
    Config("llama-base", "llama", True, 16, 2048, 32, 128256, 4, 2048, kv_heads=8, ffn_hidden=8192),
    Config("llama-mb2", "llama", False, 16, 2048, 32, 128256, 2, 2048, kv_heads=8, ffn_hidden=8192),
    Config("llama-seq4096", "llama", False, 16, 2048, 32, 128256, 2, 4096, kv_heads=8, ffn_hidden=8192),
    Config("llama-l8", "llama", False, 8, 2048, 32, 128256, 4, 2048, kv_heads=8, ffn_hidden=8192),
)


def build(c: Config):  # type: ignore[no-untyped-def]
    """The model of ``c`` on the GPU, fp32 weights, SDPA attention, random weights."""
    import torch
    import transformers as tf

    if c.family == "gpt2":
        cfg = tf.GPT2Config(n_embd=c.hidden, n_layer=c.layers, n_head=c.heads, n_positions=max(2048, c.seq_len),
                            vocab_size=c.vocab, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0, use_cache=False)
    else:
        cfg = tf.LlamaConfig(hidden_size=c.hidden, num_hidden_layers=c.layers, num_attention_heads=c.heads,
                             num_key_value_heads=c.kv_heads, intermediate_size=c.ffn_hidden, vocab_size=c.vocab,
                             max_position_embeddings=max(4096, c.seq_len), tie_word_embeddings=True,
                             use_cache=False)
    return tf.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").to(torch.device("cuda"))


def train(c: Config, steps: int, trace: str | None, compiled: bool = False) -> tuple[float, float]:
    """The median step time (s) of ``c`` and its peak memory (B, torch.cuda.max_memory_allocated); with
    ``trace``, also a profile of two steps written there; ``compiled``: the model under ``torch.compile``
    (its compilation in the warm-up steps)."""
    import torch

    model = build(c)
    if compiled:
        model = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x = torch.randint(0, c.vocab, (c.micro_batch, c.seq_len), device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    torch.cuda.reset_peak_memory_stats()
    for _ in range(3):
        step()
    times = []
    for _ in range(steps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    if trace is not None:
        from torch.profiler import ProfilerActivity, profile, schedule

        acts = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
        with profile(activities=acts, record_shapes=True, schedule=schedule(wait=0, warmup=1, active=2),
                     on_trace_ready=lambda p: p.export_chrome_trace(trace)) as prof:
            for _ in range(3):
                step()
                prof.step()
    peak = float(torch.cuda.max_memory_allocated())
    return statistics.median(times), peak  # the model and optimizer go with this frame (main empties the cache)


def _free() -> None:
    import gc

    import torch

    gc.collect()
    torch.cuda.empty_cache()


def scenario(base: Config, c: Config, trace: str, base_peak: float, node: str = H200_NODE) -> str:
    """A one-GPU scenario on a ``node`` preset predicting ``c`` from ``base``'s profile (and its measured
    peak memory; 0: none given)."""
    kv = f", kv_heads: {base.kv_heads}" if base.kv_heads else ""
    ffn = f", ffn_hidden: {base.ffn_hidden}" if base.ffn_hidden else ""
    peak = f", peak_memory: {base_peak:.0f} B" if base_peak else ""
    return (f"name: {c.name}\ncluster: {{nodes: 1, node: {{preset: {node}, gpus_per_node: 1}}}}\n"
            f"workload:\n  profile: {trace}\n"
            f"  profiled: {{micro_batch: {base.micro_batch}, seq_len: {base.seq_len}, layers: {base.layers}, "
            f"hidden: {base.hidden}, heads: {base.heads}, vocab: {base.vocab}{kv}{ffn}{peak}}}\n"
            f"model: {{layers: {c.layers}, hidden: {c.hidden}, heads: {c.heads}, seq_len: {c.seq_len}, "
            f"vocab: {c.vocab}{', kv_heads: %d' % c.kv_heads if c.kv_heads else ''}"
            f"{', ffn_hidden: %d' % c.ffn_hidden if c.ffn_hidden else ''}}}\n"
            f"training: {{micro_batch: {c.micro_batch}, global_batch: {c.micro_batch}}}\n")


def summary(base: Config, c: Config, trace: str, base_peak: float, folder: str, node: str = H200_NODE,
            name: str = "") -> dict:
    """The JSON summary ``emulator run`` prints for ``c`` on ``node`` from ``base``'s profile ``trace``."""
    path = os.path.join(folder, f"{name or c.name}.yaml")
    with open(path, "w") as fh:
        fh.write(scenario(base, c, trace, base_peak, node))
    out = subprocess.run([sys.executable, "-m", "emulator", "run", path, "--json"], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    return dict(json.loads(out.stdout))


def predict(base: Config, c: Config, trace: str, base_peak: float, folder: str,
            node: str = H200_NODE) -> tuple[float, float]:
    """(iteration s, peak memory B) that ``emulator run`` predicts for ``c`` from ``base``'s profile."""
    s = summary(base, c, trace, base_peak, folder, node)
    return float(s["iteration_time_s"]), float(s["memory"]["peak_bytes_per_gpu"])


# ---------------------------------------------------------------------------- --cross


def h200_trace() -> str:
    """The H200 trace: ../shared's when present, else the clone's copy."""
    return next((p for p in H200_TRACES if os.path.exists(p)), H200_TRACES[-1])


def node_of(device: str) -> str | None:
    """The catalog node preset whose GPU is the CUDA device ``device`` (None: no catalog GPU is it)."""
    sys.path.insert(0, ROOT)
    from emulator.devices.translation import catalog_name
    from emulator.scenario import catalog

    gpu = catalog_name(device)
    return next((n for n in catalog.node_names() if catalog.node(n).gpu.name == gpu), None) if gpu else None


def cross_row(what: str, base: Config, c: Config, trace: str, peak: float, node: str, measured: float | None,
              folder: str) -> dict:
    """One prediction of ``c`` on ``node`` from ``trace``, beside the step measured there (None: not measured)."""
    shown = os.path.relpath(trace, ROOT) if os.path.abspath(trace).startswith(ROOT + os.sep) else trace
    row = {"row": what, "trace": shown, "node": node, "micro_batch": c.micro_batch,
           "measured_s": measured, "predicted_s": None, "error": None, "mfu": None, "compiled_share": None,
           "translated_from": None, "host_bound": None, "refused": None}
    try:
        s = summary(base, c, trace, peak, folder, node, name=f"{c.name}-{node}-{what.replace(' ', '-')}")
    except subprocess.CalledProcessError as e:  # a refusal (exit 2) is a result: the row keeps its message
        row["refused"] = (e.stderr or "").strip() or f"exit {e.returncode}"
        return row
    pred = float(s["iteration_time_s"])
    row.update(predicted_s=pred, error=pred / measured - 1 if measured else None, mfu=s.get("mfu"),
               compiled_share=(s.get("profile_kernels") or {}).get("compiled_share"),
               translated_from=(s.get("translation") or {}).get("from"), host_bound=s.get("host_bound"))
    return row


def h200_rows(lent_trace: str, lent_node: str, lent_measured: float | None, folder: str,
              lent_peak: float = 0.0) -> list[dict]:
    """The eager rows: the lent GPU's round trip, its trace predicting the H200's measured step, and the
    H200 trace predicting the lent GPU's step (needs no GPU: the predictions of existing traces)."""
    base = CONFIGS[0]
    return [cross_row("round trip", base, base, lent_trace, lent_peak, lent_node, lent_measured, folder),
            cross_row("to H200", base, base, lent_trace, lent_peak, H200_NODE, H200_MEASURED_S, folder),
            cross_row("H200 to lent", base, base, h200_trace(), H200_PEAK_B, lent_node, lent_measured, folder)]


def launch_cost(n: int = LAUNCHES) -> dict:
    """Host seconds to issue ``n`` tiny kernels, without the profiler, under CUPTI alone and under the CPU
    and CUDA profiler with record_shapes; per launch, the differences."""
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile

    x = torch.zeros(1, device="cuda")

    def issue() -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            x.add_(1.0)
        issued = time.perf_counter() - t
        torch.cuda.synchronize()
        return issued

    def best() -> float:
        issue()
        return min(issue() for _ in range(5))

    plain = best()
    with profile(activities=[ProfilerActivity.CUDA]):
        cupti = best()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True):
        both = best()
    return {"launches": n, "plain_s": plain, "cuda_activity_s": cupti, "cpu_cuda_activity_s": both,
            "per_launch_s": (cupti - plain) / n, "per_launch_and_op_s": (both - plain) / n}


def cross(args: argparse.Namespace) -> None:
    """--cross: the lent GPU against the H200 trace, eager and compiled, and the profiler's own costs."""
    import time

    import torch

    sys.path.insert(0, ROOT)
    from benchmarks.profiler_overhead import measure
    from emulator.outputs.atomic import write_text

    t0 = time.perf_counter()
    device = torch.cuda.get_device_name()
    node = node_of(device)
    if node is None:
        raise SystemExit(f"{device}: no catalog node has this GPU (emulator/devices/translation.py CUDA_NAMES)")
    base = CONFIGS[0]
    rows: list[dict] = []
    costs: dict = {}

    def save() -> None:  # after each stage: a run stopped at its time limit keeps what it measured
        doc = {"device": device, "node": node, "h200_measured_s": H200_MEASURED_S, "rows": rows, "profiler": costs,
               "wall_s": time.perf_counter() - t0}
        write_text(args.json, json.dumps(doc, indent=2, sort_keys=True) + "\n")

    def stage(what: str, new: list[dict]) -> None:
        rows.extend(new)
        save()
        print(f"[{time.perf_counter() - t0:5.0f} s] {what}", *(_line(r) for r in new), sep="\n  ", flush=True)

    trace = os.path.join(args.out, "lent-gpt2-base.pt.trace.json.gz")
    step, peak = train(base, args.steps, trace)
    _free()
    print(f"[{time.perf_counter() - t0:5.0f} s] {device}: eager step {step * 1e3:.1f} ms", flush=True)
    costs["launch"] = launch_cost()
    stage("eager rows", h200_rows(trace, node, step, args.out, peak))
    if not args.no_compile:
        small = Config("gpt2-mb2-compiled", "gpt2", True, 24, 2048, 16, 50257, 2, 2048)
        big = Config("gpt2-mb4-compiled", "gpt2", False, 24, 2048, 16, 50257, 4, 2048)
        ctrace = os.path.join(args.out, "lent-gpt2-mb2-compiled.pt.trace.json.gz")
        c_step, c_peak = train(small, args.steps, ctrace, compiled=True)
        torch._dynamo.reset()  # its compiled graphs go (they hold the model), and no shape is marked dynamic
        _free()
        stage(f"compiled mb 2: {c_step * 1e3:.1f} ms",
              [cross_row("compiled round trip", small, small, ctrace, c_peak, node, c_step, args.out)])
        b_step, _ = train(big, args.steps, None, compiled=True)
        torch._dynamo.reset()
        _free()
        stage(f"compiled mb 4: {b_step * 1e3:.1f} ms",
              [cross_row("compiled at mb 4", small, big, ctrace, c_peak, node, b_step, args.out)])
    costs["cpu_profiler"] = measure(5)  # last: it sets torch to one thread
    save()
    print(f"\n{device} ({node}); H200: {H200_NODE}, measured {H200_MEASURED_S * 1e3:.1f} ms")
    print(f"{'row':20s} {'node':9s} {'mb':>3s} {'measured':>10s} {'predicted':>10s} {'error':>8s} {'MFU':>6s} "
          f"{'compiled':>8s}")
    for r in rows:
        print(_line(r))
    lc = costs["launch"]
    print(f"CUPTI per launch {lc['per_launch_s'] * 1e6:.2f} us, with the CPU profiler's op "
          f"{lc['per_launch_and_op_s'] * 1e6:.2f} us ({lc['launches']} launches, {lc['plain_s'] * 1e6 / lc['launches']:.2f} "
          f"us each unprofiled); CPU profiler per recorded op on this host "
          f"{costs['cpu_profiler']['overhead_per_op_s'] * 1e6:.2f} us")


def _line(r: dict) -> str:
    """One row of the --cross table."""
    m = f"{r['measured_s'] * 1e3:8.1f}ms" if r["measured_s"] else f"{'-':>10s}"
    head = f"{r['row']:20s} {r['node']:9s} {r['micro_batch']:3d} {m}"
    if r["refused"]:
        return f"{head} refused: {r['refused']}"
    e = f"{r['error']:+8.1%}" if r["error"] is not None else f"{'-':>8s}"
    mfu = f"{r['mfu']:6.1%}" if r["mfu"] is not None else f"{'-':>6s}"
    cs = f"{r['compiled_share']:8.1%}" if r["compiled_share"] is not None else f"{'-':>8s}"
    return f"{head} {r['predicted_s'] * 1e3:8.1f}ms {e} {mfu} {cs}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=tempfile.mkdtemp(prefix="gpu-profile-check-"))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--only", default="", help="comma-separated configuration names")
    ap.add_argument("--cross", action="store_true", help="the lent GPU against the H200 trace (see above)")
    ap.add_argument("--json", default="", help="--cross: the JSON file to write")
    ap.add_argument("--no-compile", action="store_true", help="--cross: leave out the torch.compile'd step")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.cross:
        if not args.json:
            ap.error("--cross needs --json FILE")
        cross(args)
        return
    chosen = [c for c in CONFIGS if not args.only or c.name in args.only.split(",")]
    bases = {c.family: c for c in CONFIGS if c.base}
    measured: dict[str, tuple[float, float]] = {}
    traces: dict[str, str] = {}
    for c in sorted(chosen, key=lambda c: not c.base):  # bases first: their traces feed the rest
        trace = os.path.join(args.out, f"{c.name}.pt.trace.json") if c.base else None
        measured[c.name] = train(c, args.steps, trace)
        _free()
        if trace is not None:
            traces[c.family] = trace
        print(f"{c.name:14s} measured {measured[c.name][0] * 1e3:8.1f} ms, {measured[c.name][1] / 2**30:.1f} GiB",
              flush=True)
    rows = []
    for c in chosen:
        if c.family not in traces:
            continue
        base = bases[c.family]
        pred, mem = predict(base, c, traces[c.family], measured[base.name][1], args.out)
        (t, peak) = measured[c.name]
        rows.append({**asdict(c), "measured_s": t, "predicted_s": pred, "error": pred / t - 1,
                     "measured_peak_bytes": peak, "predicted_peak_bytes": mem, "memory_error": mem / peak - 1})
    print(f"\n{'config':14s} {'measured':>10s} {'predicted':>10s} {'error':>8s} {'memory':>9s} {'error':>8s}")
    for r in rows:
        print(f"{r['name']:14s} {r['measured_s'] * 1e3:8.1f}ms {r['predicted_s'] * 1e3:8.1f}ms {r['error']:+8.1%} "
              f"{r['measured_peak_bytes'] / 2**30:7.1f}Gi {r['memory_error']:+8.1%}")
    others = [abs(r["error"]) for r in rows if not r["base"]]
    if others:
        print(f"reshaped: mean |error| {statistics.mean(others):.1%}, worst {max(others):.1%}")
    sys.path.insert(0, os.path.dirname(HERE))
    from emulator.outputs.atomic import write_text

    doc: dict = {"rows": rows}
    try:
        from benchmarks.results_file import stamp  # the docs site's provenance stamp
        doc.update(stamp(__file__))
    except ImportError:
        pass
    text = json.dumps(doc, indent=2, sort_keys=True) + "\n"
    write_text(os.path.join(args.out, "gpu_profile_check.json"), text)
    write_text(RESULTS, text)


if __name__ == "__main__":
    main()
