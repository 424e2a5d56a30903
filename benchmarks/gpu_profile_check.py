"""Profile -> predict, checked on a real GPU: your own model at other sizes, batches and families.

    python benchmarks/gpu_profile_check.py [--out DIR] [--steps 10] [--only gpt2-base,...]

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
RESULTS = os.path.join(HERE, "results", "gpu_profile_check.json")


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


def train(c: Config, steps: int, trace: str | None) -> tuple[float, float]:
    """The median step time (s) of ``c`` and its peak memory (B, torch.cuda.max_memory_allocated); with
    ``trace``, also a profile of two steps written there."""
    import torch

    model = build(c)
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


def scenario(base: Config, c: Config, trace: str, base_peak: float) -> str:
    """A one-GPU scenario predicting ``c`` from ``base``'s profile (and its measured peak memory)."""
    kv = f", kv_heads: {base.kv_heads}" if base.kv_heads else ""
    ffn = f", ffn_hidden: {base.ffn_hidden}" if base.ffn_hidden else ""
    return (f"name: {c.name}\ncluster: {{nodes: 1, node: {{preset: dgx-h200, gpus_per_node: 1}}}}\n"
            f"workload:\n  profile: {trace}\n"
            f"  profiled: {{micro_batch: {base.micro_batch}, seq_len: {base.seq_len}, layers: {base.layers}, "
            f"hidden: {base.hidden}, heads: {base.heads}, vocab: {base.vocab}{kv}{ffn}, "
            f"peak_memory: {base_peak:.0f} B}}\n"
            f"model: {{layers: {c.layers}, hidden: {c.hidden}, heads: {c.heads}, seq_len: {c.seq_len}, "
            f"vocab: {c.vocab}{', kv_heads: %d' % c.kv_heads if c.kv_heads else ''}"
            f"{', ffn_hidden: %d' % c.ffn_hidden if c.ffn_hidden else ''}}}\n"
            f"training: {{micro_batch: {c.micro_batch}, global_batch: {c.micro_batch}}}\n")


def predict(base: Config, c: Config, trace: str, base_peak: float, folder: str) -> tuple[float, float]:
    """(iteration s, peak memory B) that ``emulator run`` predicts for ``c`` from ``base``'s profile."""
    path = os.path.join(folder, f"{c.name}.yaml")
    with open(path, "w") as fh:
        fh.write(scenario(base, c, trace, base_peak))
    out = subprocess.run([sys.executable, "-m", "emulator", "run", path, "--json"], capture_output=True, text=True,
                         check=True, cwd=os.path.dirname(HERE))
    s = json.loads(out.stdout)
    return float(s["iteration_time_s"]), float(s["memory"]["peak_bytes_per_gpu"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=tempfile.mkdtemp(prefix="gpu-profile-check-"))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--only", default="", help="comma-separated configuration names")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
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
