"""NeMo's Userbuffers configurations by name (``parallel.tp_comm_overlap_cfg``): the data file and its reader.

emulator/data/userbuffers.yaml holds the configurations NeMo's recipes pass to Transformer Engine's TP
communication overlap (NVIDIA/NeMo @ 8cfedd72, nemo/collections/llm/recipes/tp_overlap_configs/userbuffers.py):
per GEMM of a layer (qkv_fprop, proj_fprop, ...) its method, the SMs its communication holds (num_sm), whether
the GEMM gives them up (set_sm_margin) and its chunks (num_splits). workload/userbuffers.py runs them.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import yaml

PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "userbuffers.yaml")


@dataclass(frozen=True)
class UbGemm:
    """One GEMM's overlap: its method (ring_exchange, pipeline or bulk), the SMs its communication holds, whether
    the GEMM runs on the others (set_sm_margin), and its chunks (0: Transformer Engine's default)."""

    method: str
    num_sm: int
    set_sm_margin: bool
    num_splits: int = 0


@functools.cache
def configs() -> dict[str, dict[str, UbGemm]]:
    """Every configuration by name: GEMM name → its overlap."""
    with open(PATH, encoding="utf-8") as fh:
        raw = yaml.safe_load(fh)
    return {name: {gemm: UbGemm(**cfg) for gemm, cfg in gemms.items()} for name, gemms in raw.items()}
