"""An in-step neighbour for benchmarks/live_real_check.py: it stands for an emulated rank's share
of this machine's cores, in step with the real rank that rank mirrors.

In the real 4-process job, ranks 2 and 3 compute while ranks 0 and 1 compute, and wait on the
gradient all-reduce while they wait. In the 2 + 2 live run, ranks 2 and 3 are emulated, so two
processes beside the run must take their share of the 2 cores, at the same moments. This one
listens on a UNIX datagram socket; the real rank it follows sends a datagram each time it ends a
wait on communication (EMULATOR_LIVE_PACE, ``emulator.live.run``). On each, it does what the real
rank does until its next wait: the optimizer step, then the next iteration's forward and backward
of examples/train_mlp.py's model; then it sleeps until the next datagram. Datagrams that arrived
while it computed (the start-up broadcast's) are dropped, so that it never runs an iteration
ahead. It runs until it is killed.

Usage: python benchmarks/paced_neighbour.py --socket PATH --hidden H [--layers 3] [--batch 64]
"""
from __future__ import annotations

import argparse
import os
import socket
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
from train_mlp import forward_backward, mlp  # noqa: E402  (the script's own model and step, not copies)


def _drain(sock: socket.socket) -> None:
    """Drop the datagrams already queued."""
    sock.setblocking(False)
    try:
        while True:
            sock.recv(16)
    except BlockingIOError:
        pass
    finally:
        sock.setblocking(True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--socket", required=True)
    p.add_argument("--hidden", type=int, required=True)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--batch", type=int, default=64)
    args = p.parse_args()
    torch.set_num_threads(1)  # as the script runs (--threads 1)
    torch.manual_seed(0)
    teacher = nn.Linear(args.hidden, 1)
    model = mlp(args.hidden, args.layers)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(1002)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(args.socket)
    stepped = False
    while True:
        sock.recv(16)
        _drain(sock)
        if stepped:
            opt.step()
        forward_backward(model, teacher, opt, gen, args.batch, args.hidden)
        stepped = True


if __name__ == "__main__":
    sys.exit(main())
