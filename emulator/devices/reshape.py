"""Reshaping a profiled kernel: its time at another micro-batch, sequence or model size.

Pure cost functions (no SimPy). A kernel of a user's profile (``emulator.importers.profile``)
carries its measured time and its shapes, each dimension named by a *symbol* of the model
(``b`` micro-batch, ``s`` sequence, ``T`` = b·s tokens, ``h`` hidden, ``ffn`` MLP width,
``qkv`` fused QKV width, ``q`` the query heads' width (h, split
under tensor parallelism), ``kv`` key/value width, ``V`` vocabulary, ``hd`` head dim, ...; ``""``
a constant). At the target :class:`Shape` every dimension is re-evaluated and the time is
rescaled by the law of the kernel's class, anchored at the measurement (a kernel whose shapes
do not change keeps its measured time exactly):

- **GEMM**: t' = t · G(M', N', K') / G(M, N, K), G the kernel model of the GPU
  (:func:`emulator.workload.kernel_cost.kernel_cost`: the measured table, then log-shape
  interpolation, then the roofline) -- the caller passes G;
- **attention** (a fused flash / cuDNN kernel): t' = t · A'/A, A the same model's fused-attention
  cost (the table, else its FLOPs 4·b·heads·s²·hd, halved when causal);
- **element-wise, reduction, copy**: bytes, t' = t₀ + (t − t₀) · E'/E, E the elements of the
  op's tensors and t₀ = min(t, ``FIXED_S``) the part of a kernel that does not grow with its data;
- **optimizer**: parameters, t' = t · P'/P;
- memsets, memcpys and kernels without shapes keep their measured time.
"""
from __future__ import annotations

from dataclasses import dataclass

# s: the part of an element-wise kernel's time that does not scale with its bytes: the shortest
# element-wise kernels of the H200 profile (../shared/traces/kineto/h200-hf-gpt-1.3b/, a bf16
# cast of a [2048] bias, aten::copy_) take 1.2-1.3 us whatever their size below ~1 MB.
FIXED_S = 1.2e-6

Dim = tuple[str, int]  # (symbol, the dimension's value in the profile); symbol "": a constant
Dims = tuple[Dim, ...]


@dataclass(frozen=True)
class Shape:
    """The sizes a profiled script runs at: micro-batch, sequence, layers and model widths."""

    b: int
    s: int
    layers: int
    h: int
    heads: int
    kvh: int
    ffn: int
    V: int
    head_dim: int = 0  # 0: h / heads (a tensor-parallel GPU's shape keeps the model's head dim)

    @property
    def hd(self) -> int:
        return self.head_dim or self.h // self.heads

    def per_gpu(self, tp: int) -> "Shape":
        """One of ``tp`` tensor-parallel GPUs' share, split as Megatron-LM splits a layer: heads,
        key/value heads (replicated below one per GPU), the MLP width and the vocabulary (the head and
        embedding, vocab-parallel) over the GPUs; the hidden size and the head dim whole."""
        if tp == 1:
            return self
        return Shape(b=self.b, s=self.s, layers=self.layers, h=self.h, heads=self.heads // tp,
                     kvh=max(1, self.kvh // tp), ffn=self.ffn // tp, V=-(-self.V // tp), head_dim=self.hd)

    def value(self, sym: str) -> int:
        """The size a symbol stands for at this shape."""
        return _SYMBOLS[sym](self)


_SYMBOLS = {
    "b": lambda x: x.b, "s": lambda x: x.s, "T": lambda x: x.b * x.s, "h": lambda x: x.h,
    "ffn": lambda x: x.ffn, "ffn2": lambda x: 2 * x.ffn, "qkv": lambda x: (x.heads + 2 * x.kvh) * x.hd,
    "kv": lambda x: x.kvh * x.hd, "V": lambda x: x.V, "hd": lambda x: x.hd, "heads": lambda x: x.heads,
    "kvh": lambda x: x.kvh, "bheads": lambda x: x.b * x.heads, "q": lambda x: x.heads * x.hd,
}
# the order in which a model width is named when several symbols have its value in the profile
WIDTHS = ("h", "ffn", "qkv", "kv", "ffn2", "V", "hd", "heads", "kvh")


def size(d: Dim, at: Shape) -> int:
    """One dimension at shape ``at`` (a constant keeps its value)."""
    sym, v = d
    return at.value(sym) if sym else v


def elements(dims: Dims, at: Shape | None = None) -> int:
    """Elements of a tensor, as profiled (``at`` None) or at shape ``at``."""
    n = 1
    for d in dims:
        n *= d[1] if at is None else size(d, at)
    return n


def bytes_ratio(tensors: tuple[Dims, ...], at: Shape) -> float:
    """E'/E: the elements of an op's tensors at ``at`` over the profiled ones (1 with no tensors)."""
    before = sum(elements(t) for t in tensors)
    return sum(elements(t, at) for t in tensors) / before if before else 1.0


def elementwise_time(t: float, tensors: tuple[Dims, ...], at: Shape) -> float:
    """t₀ + (t − t₀) · E'/E with t₀ = min(t, FIXED_S)."""
    t0 = min(t, FIXED_S)
    return t0 + (t - t0) * bytes_ratio(tensors, at)


def tokens_time(t: float, before: Shape, at: Shape) -> float:
    """t₀ + (t − t₀) · T'/T, T = b·s the tokens, t₀ = min(t, FIXED_S): a kernel with no shapes (a custom
    CUDA extension's), taken to grow with the tokens it runs on, as a layer's element-wise kernels do (an
    ASSUMPTION: its work may also grow with a width, which nothing in the profile tells)."""
    t0 = min(t, FIXED_S)
    return t0 + (t - t0) * (at.b * at.s) / (before.b * before.s)


def ratio_time(t: float, before: float, after: float) -> float:
    """t · after/before: a measured time moved by a model's ratio (kept where the model has none)."""
    return t * after / before if before > 0 else t


def params(shapes: tuple[Dims, ...], at: Shape | None = None) -> int:
    """Parameters of a set of parameter tensors, as profiled or at ``at``."""
    return sum(elements(p, at) for p in shapes)
