"""Megatron-style collective patterns, run under `emulator live` by tests/test_live.py.

A 2-D DeviceMesh (dp x tp), a TP all-reduce, pipeline P2P through batch_isend_irecv, object
collectives, a TP reduce-scatter and an async all-reduce. Checks the mirrored data itself.
"""
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

dist.init_process_group()
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (world // 4, 4), mesh_dim_names=("dp", "tp"))
tp, dp = mesh.get_group("tp"), mesh.get_group("dp")
assert dist.get_process_group_ranks(tp) == [0, 1, 2, 3]
assert dist.get_process_group_ranks(dp) == list(range(0, world, 4))
x = torch.ones(1024)
dist.all_reduce(x, group=tp)
assert x[0].item() == 4.0  # a sum over 4 mirrored ranks
recv = torch.zeros(256)
ops = [dist.P2POp(dist.isend, torch.full((256,), 7.0), (rank + 4) % world),
       dist.P2POp(dist.irecv, recv, (rank - 4) % world)]
for req in dist.batch_isend_irecv(ops):
    req.wait()
assert recv[0].item() == 7.0  # what a symmetric copy sends
objs = [None] * world
dist.all_gather_object(objs, {"rank": rank})
assert objs == [{"rank": 0}] * world
box = ["from rank 0"]
dist.broadcast_object_list(box, src=0)
assert box == ["from rank 0"]
out = torch.empty(256)
dist.reduce_scatter_tensor(out, torch.ones(256 * 4), group=tp)
assert out[0].item() == 4.0
dist.all_reduce(torch.ones(8), async_op=True).wait()
print("patterns ok", flush=True)
dist.destroy_process_group()
