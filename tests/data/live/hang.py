"""Scripts that wait for ever on the real transport, for `emulator live --real 2` (the watchdog's tests).

argv[1] picks the case:
- noinit: real rank 1 exits without init_process_group while rank 0 all-reduces over the world;
- alone: both initialise, only rank 0 issues the all-reduce;
- recv: rank 0 receives from rank 1, which never sends and exits;
- crossed: rank 0 receives from rank 1 while rank 1 (alive) waits in an all-reduce over the world.
"""
import os
import sys

import torch
import torch.distributed as dist

case, rank = sys.argv[1], int(os.environ["RANK"])
if case == "noinit" and rank == 1:
    sys.exit(0)
dist.init_process_group()
if rank == 0 and case in ("noinit", "alone"):
    dist.all_reduce(torch.ones(1))
elif rank == 0:
    dist.recv(torch.zeros(1), src=1)
elif case == "crossed":
    dist.all_reduce(torch.ones(1))
dist.destroy_process_group()
