"""One short check (< 5 min) of `emulator live` on one GPU: mirror results and timing with CUDA tensors.

Run where a GPU is lent:  .venv/bin/python benchmarks/live_gpu_check.py
Without CUDA it says so and exits 2 (the CPU tests check that a CUDA tensor is then a clear error).

1. mirror results: the script below runs as rank 0 of 8 (`emulator live`, virtual clock) on
   CUDA tensors: a SUM all-reduce of ones gives 8, an all-gather gives 8 copies, a
   reduce-scatter gives 8 × the local shard, a DDP step on a CUDA model runs.
2. timing: a GPU kernel of known length (``torch.cuda._sleep``, timed with CUDA events) is
   queued, then an all-reduce is issued. The backend synchronizes before stamping the issue,
   so the issue comes after the kernel: issue − start ≥ the kernel's measured length.
   (The host clock alone would stamp it at once, while the kernel still runs.)
Prints one JSON line per check and "ok" at the end; exits 1 on a failed check.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCENARIO = os.path.join(ROOT, "scenarios", "live-dgx-a100-8node.yaml")

SCRIPT = r'''
import json, sys
import torch
import torch.distributed as dist
from torch import nn
dist.init_process_group()
dev = torch.device("cuda")
n = dist.get_world_size()
out = {}
t = torch.ones(1 << 20, device=dev)
dist.all_reduce(t)
out["all_reduce"] = t[0].item()
g = torch.empty(n * 4, device=dev)
dist.all_gather_into_tensor(g, torch.arange(4.0, device=dev))
out["all_gather"] = g.view(n, 4).sum(0).tolist()
rs = torch.empty(4, device=dev)
dist.reduce_scatter_tensor(rs, torch.arange(4.0 * n, device=dev))
out["reduce_scatter"] = rs.tolist()
model = nn.parallel.DistributedDataParallel(nn.Linear(256, 256).to(dev))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for _ in range(3):
    model(torch.randn(64, 256, device=dev)).sum().backward()
    opt.step()
    opt.zero_grad()
# a kernel of known length, then an all-reduce issued right after it (asynchronously on the host)
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
torch.cuda.synchronize()
start.record()
torch.cuda._sleep(200_000_000)
end.record()
dist.all_reduce(torch.ones(1024, device=dev))
torch.cuda.synchronize()
out["kernel_s"] = start.elapsed_time(end) / 1e3
json.dump(out, open(sys.argv[1], "w"))
'''


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("live_gpu_check: this machine has no CUDA device; run it where a GPU is lent", file=sys.stderr)
        return 2
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        script, res, out = (os.path.join(tmp, n) for n in ("script.py", "res.json", "out"))
        with open(script, "w") as fh:
            fh.write(SCRIPT)
        cmd = [sys.executable, "-m", "emulator", "live", SCENARIO, "--world", "8", "--clock", "virtual", "--out", out,
               "--", "python", script, res]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
        print(proc.stdout[-2000:], proc.stderr[-2000:], sep="\n")
        if proc.returncode:
            print(json.dumps({"check": "run", "ok": False, "rc": proc.returncode}))
            return 1
        with open(res) as fh:
            got = json.load(fh)
        with open(os.path.join(out, "record.json")) as fh:
            record = json.load(fh)
    checks = {
        # 8 mirror copies of ones: 8
        "all_reduce": got["all_reduce"] == 8.0,
        # 8 copies of [0, 1, 2, 3], summed over the copies: 8 × [0, 1, 2, 3]
        "all_gather": got["all_gather"] == [0.0, 8.0, 16.0, 24.0],
        # rank 0's shard of arange(32) is [0, 1, 2, 3]; 8 mirror copies reduced: 8 × that
        "reduce_scatter": got["reduce_scatter"] == [0.0, 8.0, 16.0, 24.0],
    }
    last = record["comms"][-1]
    for name, ok in checks.items():
        print(json.dumps({"check": name, "ok": ok}))
        failed += not ok
    # the issue is stamped after a synchronize, so at least the kernel's length after the step before it
    gap = last["issue_s"] - record["comms"][-2]["end_s"] if len(record["comms"]) > 1 else 0.0
    ok = last["op"] == "all_reduce" and got["kernel_s"] > 0.05 and gap >= 0.9 * got["kernel_s"]
    print(json.dumps({"check": "issue_after_kernel", "ok": ok, "gap_s": gap, "kernel_s": got["kernel_s"]}))
    failed += not ok
    print("ok" if not failed else f"{failed} checks failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
