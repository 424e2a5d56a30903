"""A tiny pipeline-parallel training script: one MLP stage per rank, 1F1B (or GPipe) with send/recv, on CPU.

With --schedule interleaved-1f1b --virtual V each rank holds V model chunks (rank s: chunks s, p + s, ...,
as Megatron-LM interleaves them), --layers / V linear layers each; the last rank's chunk c feeds rank 0's
chunk c + 1. Its sends are isend (waited at the end of the iteration), so the real run cannot deadlock.

Plain PyTorch, nothing emulator-specific. Run it for real:
    torchrun --nproc_per_node 4 examples/train_pipeline.py
or as stage 0 of 4, the other stages emulated, each running its own schedule:
    emulator live scenarios/live-pipeline-4stage.yaml -- python examples/train_pipeline.py
    emulator live scenarios/live-pipeline-interleaved.yaml -- python examples/train_pipeline.py \
        --schedule interleaved-1f1b --virtual 2
"""
import argparse
import json
import time

import torch
import torch.distributed as dist
from torch import nn


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=4, help="linear layers per stage")
    p.add_argument("--batch", type=int, default=32, help="samples per micro-batch")
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--schedule", choices=("1f1b", "gpipe", "interleaved-1f1b"), default="1f1b")
    p.add_argument("--virtual", type=int, default=2, help="model chunks per rank (interleaved-1f1b)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--times", help="write this rank's per-iteration wall times (JSON) here")
    return p.parse_args()


def order(schedule, stage, stages, m):
    """The stage's tasks: ('F'|'B', micro-batch), as in PipeDream-Flush (1F1B) or GPipe."""
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in reversed(range(m))]
    warm = min(stages - stage - 1, m)
    tasks = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        tasks += [("F", warm + i), ("B", i)]
    return tasks + [("B", i) for i in range(m - warm, m)]


def interleaved_order(stage, stages, m, v):
    """The stage's tasks ('F'|'B', micro-batch, chunk) in Megatron-LM's interleaved 1F1B
    (forward_backward_pipelining_with_interleaving): m a multiple of stages."""
    def task(k, phase):
        chunk = (k // stages) % v
        return phase, (k // (stages * v)) * stages + k % stages, chunk if phase == "F" else v - 1 - chunk

    total = m * v
    warm = total if m == stages else min((stages - stage - 1) * 2 + (v - 1) * stages, total)
    tasks = [task(k, "F") for k in range(warm)]
    for k in range(total - warm):
        tasks += [task(warm + k, "F"), task(k, "B")]
    return tasks + [task(k, "B") for k in range(total - warm, total)]


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    dist.init_process_group()
    stage, stages = dist.get_rank(), dist.get_world_size()
    if args.schedule == "interleaved-1f1b":
        return interleaved(args, stage, stages)
    torch.manual_seed(stage)
    model = nn.Sequential(*[m for _ in range(args.layers) for m in (nn.Linear(args.hidden, args.hidden), nn.Tanh())])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    shape = (args.batch, args.hidden)
    times, last = [], time.perf_counter()
    for _ in range(args.iters):
        inputs, outputs = {}, {}
        opt.zero_grad(set_to_none=True)
        for phase, mb in order(args.schedule, stage, stages, args.microbatches):
            if phase == "F":
                if stage == 0:
                    x = torch.randn(shape, generator=gen)
                else:
                    x = torch.empty(shape)
                    dist.recv(x, src=stage - 1)
                x.requires_grad_(stage > 0)
                y = model(x)
                inputs[mb], outputs[mb] = x, y
                if stage < stages - 1:
                    dist.send(y.detach(), dst=stage + 1)
            else:
                y = outputs.pop(mb)
                if stage == stages - 1:
                    y.pow(2).mean().backward()
                else:
                    g = torch.empty(shape)
                    dist.recv(g, src=stage + 1)
                    y.backward(g)
                x = inputs.pop(mb)
                if stage > 0:
                    dist.send(x.grad, dst=stage - 1)
        opt.step()
        now = time.perf_counter()
        times.append(now - last)
        last = now
    _finish(args, stage, stages, times)


def _finish(args, stage, stages, times):
    """Write this rank's iteration times (--times) and leave the process group."""
    if args.times:
        with open(args.times, "w") as fh:
            json.dump({"rank": stage, "world": stages, "iteration_times_s": times}, fh)
    dist.destroy_process_group()


def interleaved(args, stage, stages):
    """Interleaved 1F1B: chunk c of this rank is virtual stage c * stages + stage."""
    v, m = args.virtual, args.microbatches
    if m % stages or args.layers % v:
        raise SystemExit(f"interleaved-1f1b: --microbatches ({m}) must be a multiple of the stages ({stages}) "
                         f"and --layers ({args.layers}) of --virtual ({v})")
    torch.manual_seed(stage)
    chunks = [nn.Sequential(*[m for _ in range(args.layers // v) for m in (nn.Linear(args.hidden, args.hidden),
                                                                            nn.Tanh())]) for _ in range(v)]
    opt = torch.optim.SGD([q for c in chunks for q in c.parameters()], lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    shape = (args.batch, args.hidden)
    nxt, prev = (stage + 1) % stages, (stage - 1) % stages
    last_chunk = v - 1 if stage == stages - 1 else None  # the last virtual stage: the loss
    times, last = [], time.perf_counter()
    for _ in range(args.iters):
        inputs, outputs, sends = {}, {}, []
        opt.zero_grad(set_to_none=True)
        for phase, mb, c in interleaved_order(stage, stages, m, v):
            if phase == "F":
                if stage == 0 and c == 0:
                    x = torch.randn(shape, generator=gen)
                else:
                    x = torch.empty(shape)
                    dist.recv(x, src=prev)
                x.requires_grad_(not (stage == 0 and c == 0))
                y = chunks[c](x)
                inputs[mb, c], outputs[mb, c] = x, y
                if c != last_chunk:
                    out = y.detach()
                    sends.append((dist.isend(out, dst=nxt), out))
            else:
                y = outputs.pop((mb, c))
                if c == last_chunk:
                    y.pow(2).mean().backward()
                else:
                    g = torch.empty(shape)
                    dist.recv(g, src=nxt)
                    y.backward(g)
                x = inputs.pop((mb, c))
                if not (stage == 0 and c == 0):
                    sends.append((dist.isend(x.grad, dst=prev), x.grad))
        for work, _ in sends:
            work.wait()
        opt.step()
        now = time.perf_counter()
        times.append(now - last)
        last = now
    _finish(args, stage, stages, times)


if __name__ == "__main__":
    main()
