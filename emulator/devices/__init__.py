"""The device layer: what one GPU and one NIC cost.

Owns the pure compute cost model (compute.py: the roofline with shape-dependent GEMM
efficiency, fitted to ../shared/calibration), the measured kernel database (kernels.py: GEMM and
fused-attention rates per GPU, dtype and shape, looked up before the roofline), the GPU as the engine sees it
(gpu.py: an op's duration, with its slowdown), the sharing of one GPU by concurrent
compute streams (sharing.py) and NIC utilisation reports (nic.py).

May import: emulator.errors, emulator.program, emulator.scenario (GpuSpec),
emulator.network (topology, for NIC ports) and its own modules. Never workload/, the
engine or anything above.
"""
