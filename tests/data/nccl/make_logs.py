"""Write the nccl-tests logs of this folder from the figures in ../shared/calibration/nccl.csv.

Rows "DGX A100 (8 GPU NVSwitch),all_reduce,8,busbw_large_messages,230" and
"DGX A100,all_reduce,{2,8},latency_small_messages,{10,33.7}": time(S) = L_n + S * f / 230 GB/s
with f = 2(n-1)/n (so busbw = algbw * f tends to 230 GB/s), L_2 = 10 us, L_8 = 33.7 us.
Printed as all_reduce_perf 2.13 prints its table (times in us, bandwidths in GB/s).
"""
from __future__ import annotations

import os

HERE = os.path.dirname(__file__)
BUSBW = 230e9


def log(n: int, latency_us: float, with_banner: bool) -> str:
    out = []
    if with_banner:
        out.append("# nccl-tests version 2.13.9 nccl-headers=21903 nccl-library=21903")
        out.append("# Collective test starting: all_reduce_perf")
    out.append(f"# nThread 1 nGpus {n} minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 5 "
               "iters: 20 agg iters: 1 validation: 1 graph: 0")
    out += ["#", "# Using devices"]
    out += [f"#  Rank {r:2d} Group  0 Pid  41120 on    dgxa100 device {r:2d} [0x{7 + 8 * r:02x}] NVIDIA A100-SXM4-80GB"
            for r in range(n)]
    out += ["#",
            "#                                                              out-of-place                       in-place          ",
            "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong",
            "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       "]
    f = 2 * (n - 1) / n
    size = 8
    while size <= 8 * 2**30:
        t = latency_us + size * f / BUSBW * 1e6
        t_txt = f"{t:.2f}" if t < 1e4 else f"{t:.0f}"
        t = float(t_txt)
        algbw = size / (t * 1e-6) / 1e9
        cols = f"{t_txt:>8} {algbw:7.2f} {algbw * f:7.2f}  {0:5d}"
        out.append(f"{size:12d}  {size // 4:12d}     float     sum      -1 {cols} {cols}")
        size *= 2
    out += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 100.0 ", "#"]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    with open(os.path.join(HERE, "dgx-a100-2gpu.log"), "w") as fh:
        fh.write(log(2, 10.0, True))
    with open(os.path.join(HERE, "all_reduce_perf-dgx-a100-8gpu.log"), "w") as fh:
        fh.write(log(8, 33.7, False))
