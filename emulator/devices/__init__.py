"""The device layer: what one GPU costs.

Owns the pure compute cost model (compute.py: the roofline with shape-dependent GEMM
efficiency, fitted to ../shared/calibration), the measured kernel database (kernels.py: GEMM and
fused-attention rates per GPU, dtype and shape, looked up before the roofline), the GPU as the engine sees it
(gpu.py: an op's duration, with its slowdown), the sharing of one GPU by concurrent
compute streams (sharing.py).

May import: emulator.errors, emulator.program, emulator.scenario (GpuSpec) and its own
modules. Never network/, workload/, the run stage or anything above.
"""
