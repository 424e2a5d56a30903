"""Make a GPU-shaped profile of a Hugging Face Llama training step from a CPU run (for tests).

    python tests/data/profiles/make_cpu_profile.py   # needs torch and transformers; writes llama-cpu.json.gz

No GPU is needed, and none was at hand: a tiny Llama (4 layers, hidden 256, 8 heads, 2 key/value
heads, MLP 704, vocabulary 1000, tied embeddings, SDPA) trains three steps on the CPU under bf16
autocast with AdamW, profiled with ``record_shapes=True``. Every leaf aten op that computes (views
and allocations left out) becomes a CUDA launch (``cudaLaunchKernel``) on its host thread and a
kernel on stream 7 with the op's CPU time, queued in launch order, named after the op. The result
has a real Hugging Face op structure (RMSNorm, RoPE, grouped-query SDPA, SwiGLU, the loss, the
optimizer) in the layout of a GPU profile, so the importer's structural work (the repeated block,
the symbols, the parameter shapes) can be tested on a second model family. Its times are CPU
times: nothing about speed may be read from it.
"""
from __future__ import annotations

import gzip
import json
import os
import tempfile

import torch
import transformers as tf
from torch.profiler import ProfilerActivity, profile, schedule

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "llama-cpu.json.gz")
B, S = 2, 64
NO_KERNEL = ("view", "reshape", "_unsafe_view", "t", "transpose", "permute", "expand", "unsqueeze", "squeeze",
             "slice", "select", "as_strided", "empty", "empty_like", "empty_strided", "detach", "alias", "split",
             "chunk", "contiguous", "to", "_to_copy", "lift_fresh", "resolve_conj", "resolve_neg", "size",
             "stride", "is_nonzero", "item", "_local_scalar_dense", "result_type", "narrow", "unbind",
             "expand_as", "view_as", "flatten", "_reshape_alias", "set_", "zeros", "ones", "new_empty",
             "new_empty_strided", "_has_compatible_shallow_copy_type", "numel", "dim", "_nested_tensor_from_mask")


def train_and_profile(path: str) -> None:
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                         intermediate_size=704, vocab_size=1000, max_position_embeddings=S,
                         tie_word_embeddings=True, use_cache=False)
    model = tf.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, cfg.vocab_size, (B, S))

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, schedule=schedule(wait=0, warmup=1, active=2),
                 on_trace_ready=lambda p: p.export_chrome_trace(path)) as prof:
        for _ in range(3):
            step()
            prof.step()


# ops that are one kernel on a GPU whatever they call inside on the CPU (cuBLAS, fused attention)
WHOLE = ("mm", "addmm", "bmm", "baddbmm", "embedding", "embedding_dense_backward")


def _whole(name: str) -> bool:
    return name in WHOLE or "scaled_dot_product" in name and "attention" in name and "_for_cpu" in name


def _leaves(ops: list[dict]) -> list[dict]:
    """The ops that launch a kernel: a GEMM or fused attention whole, else the aten ops with no aten
    op inside them on their thread (and not inside such a whole op)."""
    by_tid: dict[object, list[dict]] = {}
    for e in ops:
        by_tid.setdefault(e["tid"], []).append(e)
    out = []
    for evs in by_tid.values():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        inside_until = -1.0
        for i, e in enumerate(evs):
            if e["ts"] < inside_until:
                continue
            if _whole(e["name"][6:]):
                out.append(e)
                inside_until = e["ts"] + e["dur"]
                continue
            nxt = evs[i + 1] if i + 1 < len(evs) else None
            if nxt is None or nxt["ts"] >= e["ts"] + e["dur"]:
                out.append(e)
    return out


def gpu_shaped(cpu_trace: str) -> dict:
    with open(cpu_trace) as fh:
        data = json.load(fh)
    events = data["traceEvents"]
    aten = [e for e in events if e.get("cat") == "cpu_op" and e.get("ph") == "X" and str(e["name"]).startswith("aten::")]
    launches = sorted((e for e in _leaves(aten) if e["name"][6:] not in NO_KERNEL), key=lambda e: e["ts"])
    gpu_free = 0.0
    for corr, e in enumerate(launches, start=1):
        t = e["ts"] + min(1.0, e["dur"] / 2)  # the launch, inside the op
        name = e["name"][6:]
        kernel = f"{'flash_fwd_kernel' if 'attention' in name and 'backward' not in name else ''}" \
                 f"{'flash_bwd_kernel' if 'attention' in name and 'backward' in name else ''}cpu_kernel_{name}"
        start = max(gpu_free, t + 5.0)
        gpu_free = start + max(1.0, e["dur"])
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": e["pid"], "tid": e["tid"],
                       "ts": t, "dur": 0.5, "args": {"correlation": corr}})
        events.append({"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": 7, "ts": start,
                       "dur": max(1.0, e["dur"]), "args": {"stream": 7, "correlation": corr, "device": 0}})
    data["traceEvents"] = events
    return data


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "cpu.json")
        train_and_profile(path)
        data = gpu_shaped(path)
    with gzip.open(OUT, "wt") as fh:
        json.dump(data, fh)


if __name__ == "__main__":
    main()
