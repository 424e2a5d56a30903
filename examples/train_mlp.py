"""A tiny data-parallel training script: an MLP regressing a fixed random teacher, on CPU.

Plain PyTorch DDP, nothing emulator-specific. Run it for real:
    torchrun --nproc_per_node 4 examples/train_mlp.py
or as rank 0 of 64 on an emulated cluster:
    emulator live scenarios/live-dgx-a100-8node.yaml -- python examples/train_mlp.py
"""
import argparse
import json
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--batch", type=int, default=64, help="samples per rank per iteration")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket_cap_mb")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process (0: leave as is)")
    p.add_argument("--times", help="write this rank's per-iteration wall times (JSON) here")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args()


def mlp(width, layers):
    mods = []
    for _ in range(layers - 1):
        mods += [nn.Linear(width, width), nn.ReLU()]
    mods.append(nn.Linear(width, 1))
    return nn.Sequential(*mods)


def forward_backward(model, teacher, opt, gen, batch, hidden):
    """One iteration's forward and backward on a fresh batch; returns the loss."""
    x = torch.randn(batch, hidden, generator=gen)
    with torch.no_grad():
        y = teacher(x)
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    return loss


def main():
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # same initial weights everywhere (DDP broadcasts rank 0's anyway)
    teacher = nn.Linear(args.hidden, 1)  # the target: a fixed random linear map
    model = DDP(mlp(args.hidden, args.layers), bucket_cap_mb=args.bucket_mb)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(1000 + rank)
    times, last = [], time.perf_counter()
    for it in range(args.iters):
        loss = forward_backward(model, teacher, opt, gen, args.batch, args.hidden)
        opt.step()
        now = time.perf_counter()
        times.append(now - last)
        last = now
        if rank == 0 and not args.quiet:
            print(f"iter {it:3d} loss {loss.item():.6f}", flush=True)
    if args.times:
        with open(args.times, "w") as fh:
            json.dump({"rank": rank, "world": world, "iteration_times_s": times}, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
