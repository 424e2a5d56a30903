"""Data checks for `emulator live --real 2` on a world of 4 (ranks 2, 3 emulated: they mirror 0, 1).

Each real rank writes what its collectives returned (JSON) to the path in argv[1] + its rank.
"""
import json
import sys

import torch
import torch.distributed as dist

dist.init_process_group()
rank, world = dist.get_rank(), dist.get_world_size()
out = {}
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)  # SUM over 0, 1, 2 (mirrors 0), 3 (mirrors 1)
out["all_reduce_sum"] = t.item()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t, op=dist.ReduceOp.MAX)
out["all_reduce_max"] = t.item()
g = [torch.zeros(1) for _ in range(world)]
dist.all_gather(g, torch.tensor([float(rank + 1)]))
out["all_gather"] = [x.item() for x in g]
b = torch.tensor([float(rank + 1)])
dist.broadcast(b, src=3)
out["broadcast_from_3"] = b.item()
rs = torch.zeros(1)
dist.reduce_scatter_tensor(rs, torch.arange(1.0, 5.0) * (rank + 1))
out["reduce_scatter"] = rs.item()
a2a = torch.zeros(4)
dist.all_to_all_single(a2a, torch.arange(4.0) + 10 * (rank + 1))
out["all_to_all"] = a2a.tolist()
pair = dist.new_group([0, 1])  # all real: runs on the real gloo group
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t, group=pair)
out["pair_sum"] = t.item()
if rank == 0:
    dist.send(torch.tensor([42.0]), dst=1)
elif rank == 1:
    r = torch.zeros(1)
    dist.recv(r, src=0)
    out["recv_from_0"] = r.item()
dist.barrier()
with open(f"{sys.argv[1]}{rank}", "w") as fh:
    json.dump(out, fh)
dist.destroy_process_group()
