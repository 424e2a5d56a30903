"""Per-layer kernels and communications."""
import pytest

from emulator.scenario import GpuSpec, ModelSpec
from emulator.scenario.catalog import model_preset
from emulator.workload import flops as F
from emulator.workload import kernel_cost as KC
from emulator.workload import layer as Ly

GPT = ModelSpec(layers=48, hidden=6144, heads=64, seq_len=2048, vocab=51200)
A100 = GpuSpec("A100-SXM4-80GB", 312e12, 2039e9, 80 * 2**30, 4e-6)


def gemm_flops(steps):
    return sum(k.flops for k in Ly.kernels(steps) if k.kind in ("gemm", "flash"))


def names(steps, kind=None):
    return [c.collective for c in Ly.comms(steps)]


def test_forward_flops_match_model_count():
    # per GPU and micro-batch: b·layer_forward_flops/t (b = 4, t = 8) — except the tiny
    # router (none here). 4·(24·2048·6144² + 4·2048²·6144)/8 = 4·1.95784e12/8 = 9.7892e11
    L = Ly.layer_shape(GPT, 4, t=8)
    assert gemm_flops(Ly.forward_steps(L)) == pytest.approx(4 * F.layer_forward_flops(GPT) / 8, rel=1e-12)
    assert gemm_flops(Ly.backward_steps(L)) == pytest.approx(2 * 4 * F.layer_forward_flops(GPT) / 8, rel=1e-12)


def test_tp_comm_counts():
    L = Ly.layer_shape(GPT, 4, t=8)
    assert names(Ly.forward_steps(L)) == ["all_reduce", "all_reduce"]
    assert names(Ly.backward_steps(L)) == ["all_reduce", "all_reduce"]
    assert names(Ly.backward_steps(L, "full")) == ["all_reduce"] * 4
    # each of b·s·h elements of 2 bytes: 4·2048·6144·2 = 100 663 296 B
    assert all(c.bytes == 100_663_296 for c in Ly.comms(Ly.forward_steps(L)))
    # the backward all-reduces run under the wgrad GEMM
    assert all(c.overlap == 1 for c in Ly.comms(Ly.backward_steps(L)))
    sp = Ly.layer_shape(GPT, 4, t=8, sp=True)
    assert names(Ly.forward_steps(sp)) == ["all_gather", "reduce_scatter", "all_gather", "reduce_scatter"]
    # backward: AG of dy (blocking) before each row-parallel GEMM; AG of the input and RS of dx
    # around each column-parallel one
    assert names(Ly.backward_steps(sp)) == ["all_gather", "all_gather", "reduce_scatter"] * 2
    assert [c.overlap for c in Ly.comms(Ly.backward_steps(sp))] == [0, 1, 1] * 2
    assert Ly.comms(Ly.forward_steps(Ly.layer_shape(GPT, 4, t=1))) == []


def test_sp_shards_elementwise():
    # layernorm forward moves 2 passes of Te·h·2 bytes: Te = b·s = 8192 (no SP) or 1024 (SP, t=8)
    def ln(L):
        return next(k for k in Ly.forward_steps(L) if k.name == "ln1")

    assert ln(Ly.layer_shape(GPT, 4, t=8)).bytes == 2 * 8192 * 6144 * 2
    assert ln(Ly.layer_shape(GPT, 4, t=8, sp=True)).bytes == 2 * 1024 * 6144 * 2


def test_recompute_kernels():
    L = Ly.layer_shape(GPT, 4, t=8)
    sel = [k for k in Ly.kernels(Ly.backward_steps(L, "selective")) if k.category == "recompute"]
    assert [k.name for k in sel] == ["attn.qk", "attn.softmax", "attn.dropout", "attn.pv"]
    full = [k for k in Ly.kernels(Ly.backward_steps(L, "full")) if k.category == "recompute"]
    assert gemm_flops(full) == pytest.approx(gemm_flops(Ly.forward_steps(L)))


def test_moe_all_to_all():
    mx = model_preset("mixtral-8x7b")
    L = Ly.layer_shape(mx, 1, t=1, ep=8)
    # Megatron's token counts (8 experts × 8 B × ep 8 gathered), then dispatch and combine of
    # b·s·top_k·h·2 = 4096·2·4096·2 = 67 108 864 bytes each way (the dispatch with 8192 fp32 probabilities)
    a2a = [c for c in Ly.comms(Ly.forward_steps(L)) if c.group == "ep"]
    assert [c.name for c in a2a] == ["moe.token_counts", "moe.dispatch", "moe.combine"]
    assert [c.bytes for c in a2a] == [8 * 8 * 8, 67_108_864 + 8192 * 4, 67_108_864]
    assert len([c for c in Ly.comms(Ly.backward_steps(L)) if c.group == "ep"]) == 2
    # expert GEMMs: 1 local expert of 8192 tokens (4096·2·8/8)
    up = next(k for k in Ly.forward_steps(L) if k.name == "moe.up")
    assert (up.batch, up.m, up.n, up.k) == (1, 8192, 2 * 14336, 4096)


def test_cp_ring():
    L = Ly.layer_shape(model_preset("llama3-8b"), 1, t=1, cp=4)
    ring = [c for c in Ly.comms(Ly.forward_steps(L)) if c.group == "cp"]
    # cp − 1 = 3 steps of K and V of 2048 tokens, 8 KV heads of 128: 2·2048·8·128·2 = 8 388 608 B
    assert len(ring) == 3 and ring[0].bytes == 8_388_608 and ring[0].overlap == 1
    assert len([c for c in Ly.comms(Ly.backward_steps(L)) if c.group == "cp"]) == 3


def test_pass_time_overlap():
    # wgrad hides an all-reduce shorter than itself; a blocking one adds its full time.
    L = Ly.layer_shape(GPT, 4, t=8)
    steps = Ly.backward_steps(L)
    free = KC.pass_time(steps, A100, lambda c: 0.0)
    assert KC.pass_time(steps, A100, lambda c: 1e-4) == pytest.approx(free)
    fwd = Ly.forward_steps(L)
    assert KC.pass_time(fwd, A100, lambda c: 1e-4) == pytest.approx(KC.pass_time(fwd, A100, lambda c: 0.0) + 2e-4)
