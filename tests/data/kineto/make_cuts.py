"""Re-create the cuts in this folder and in traces/ from the real traces (read-only inputs).

Run from the repository root: ``.venv/bin/python tests/data/kineto/make_cuts.py``.
It needs ../shared/traces/kineto (see README.md here for sources and licence).
"""
from __future__ import annotations

import gzip
import json
import os

SRC = os.path.join("..", "shared", "traces", "kineto")
HERE = os.path.join("tests", "data", "kineto")
KEEP = ("kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cpu_op", "user_annotation")


def _load(path: str) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def _dump(data: dict, path: str) -> None:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt") as f:
        json.dump(data, f, separators=(",", ":"))


def _window(data: dict, t0: float, t1: float, world: int | None) -> dict:
    """Events of the kept categories that start in [t0, t1], and a ProfilerStep#10 spanning them."""
    gpu = ("kernel", "gpu_memcpy", "gpu_memset")
    ev = [e for e in data["traceEvents"] if e.get("cat") in KEEP
          and t0 <= e.get("ts", -1) <= t1 + (2000 if e["cat"] in gpu else 0)
          and not str(e.get("name", "")).startswith("ProfilerStep")]
    main_tid = next(e["tid"] for e in data["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep"))
    ev.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#10", "pid": ev[0]["pid"],
               "tid": main_tid, "ts": t0, "dur": t1 - t0, "args": {}})
    out = {k: v for k, v in data.items() if k not in ("traceEvents", "deviceProperties", "INFO")}
    if world is not None:
        out["distributedInfo"] = dict(out["distributedInfo"], world_size=world)
    out["traceEvents"] = sorted(ev, key=lambda e: e["ts"])
    return out


def dlrm_first_all_to_all() -> None:
    """Ranks 0 and 1 of DLRM, each from 150 us before its first nccl:all_to_all to the end of that kernel."""
    d = os.path.join(SRC, "dlrm-8rank-v100")
    files = sorted(os.listdir(d))
    datas = [_load(os.path.join(d, f)) for f in files[:2]]
    t0s, t1s = [], []
    for data in datas:
        ann = min((e for e in data["traceEvents"] if e.get("name") == "nccl:all_to_all"), key=lambda e: e["ts"])
        k = min((e for e in data["traceEvents"] if e.get("cat") == "kernel" and "nccl" in e["name"]
                 and e["ts"] > ann["ts"]), key=lambda e: e["ts"])
        t0s.append(ann["ts"] - 150)
        t1s.append(k["ts"] + k["dur"])
    os.makedirs(os.path.join(HERE, "dlrm-2rank"), exist_ok=True)
    for r, data in enumerate(datas):
        _dump(_window(data, t0s[r], t1s[r], 2), os.path.join(HERE, "dlrm-2rank", f"rank{r}.json"))


def resnet_one_allreduce() -> None:
    """ResNet rank 0: the first DDP all-reduce bucket and 300 us of work before it."""
    data = _load(os.path.join(SRC, "resnet-ddp-a100", "rank0.json.gz"))
    k = min((e for e in data["traceEvents"] if e.get("cat") == "kernel"
             and e.get("args", {}).get("Collective name") == "allreduce"), key=lambda e: e["ts"])
    launch = next(e for e in data["traceEvents"] if e.get("cat") == "cuda_runtime"
                  and e.get("args", {}).get("correlation") == k["args"]["correlation"])
    _dump(_window(data, launch["ts"] - 300, k["ts"] + k["dur"], None), os.path.join(HERE, "resnet-allreduce.json"))


def example_traces() -> None:
    """traces/: the 8 DLRM rank files as they are; ResNet rank 0 cut to ProfilerStep#6, and its GPU side whole."""
    out = os.path.join("traces", "dlrm-8rank-v100")
    os.makedirs(out, exist_ok=True)
    d = os.path.join(SRC, "dlrm-8rank-v100")
    for f in sorted(os.listdir(d)):
        with open(os.path.join(d, f), "rb") as src, open(os.path.join(out, f), "wb") as dst:
            dst.write(src.read())
    data = _load(os.path.join(SRC, "resnet-ddp-a100", "rank0.json.gz"))
    step = next(e for e in data["traceEvents"] if e.get("name") == "ProfilerStep#6")
    t0, t1 = step["ts"], step["ts"] + step["dur"]
    ev = [e for e in data["traceEvents"] if e.get("cat") in KEEP and t0 <= e.get("ts", -1) <= t1 + 20000]
    cut = {k: v for k, v in data.items() if k not in ("traceEvents", "INFO")}
    cut["traceEvents"] = ev
    out = os.path.join("traces", "resnet-ddp-a100")
    os.makedirs(out, exist_ok=True)
    with gzip.open(os.path.join(out, "rank0-step6.json.gz"), "wt", compresslevel=9) as f:
        json.dump(cut, f, separators=(",", ":"))
    # every step, GPU-side events and their launches only (no cpu_op): what calibrate --kineto
    # measures the node's NCCL figures and comm_overlap_slowdown from
    whole = {k: v for k, v in data.items() if k not in ("traceEvents", "INFO")}
    whole["traceEvents"] = [e for e in data["traceEvents"] if e.get("cat") in
                            ("kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "user_annotation")]
    out = os.path.join("traces", "resnet-ddp-a100-all-steps")
    os.makedirs(out, exist_ok=True)
    with gzip.open(os.path.join(out, "rank0-gpu.json.gz"), "wt", compresslevel=9) as f:
        json.dump(whole, f, separators=(",", ":"))


if __name__ == "__main__":
    dlrm_first_all_to_all()
    resnet_one_allreduce()
    example_traces()
