"""A tiny FSDP2 (``fully_shard``) training script on CPU: an MLP regressing a fixed random teacher.

Plain PyTorch, nothing emulator-specific. Run it for real:
    torchrun --nproc_per_node 4 examples/train_fsdp2.py
or as rank 0 of 64 on an emulated cluster:
    emulator live scenarios/live-dgx-a100-8node.yaml -- python examples/train_fsdp2.py
Each Linear is sharded on its own, so every iteration all-gathers each layer's parameters in the
forward and again in the backward (reshard after forward) and reduce-scatters its gradients.
"""
import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--batch", type=int, default=32, help="samples per rank per iteration")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--lr", type=float, default=1e-2)
    return p.parse_args()


def main():
    args = parse_args()
    torch.set_num_threads(1)
    dist.init_process_group()
    torch.manual_seed(0)
    teacher = nn.Linear(args.hidden, 1)
    model = nn.Sequential(nn.Linear(args.hidden, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 1))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(1000 + dist.get_rank())
    for it in range(args.iters):
        x = torch.randn(args.batch, args.hidden, generator=gen)
        with torch.no_grad():
            y = teacher(x)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if dist.get_rank() == 0:
            print(f"iter {it:3d} loss {loss.item():.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
