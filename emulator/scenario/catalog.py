"""The catalogs: GPUs and nodes (emulator/data/catalog.yaml), and models by name.

The YAML file holds the hardware figures with their units and sources (hardware.csv
and nccl.csv rows of the calibration set, or vendor datasheets); this module turns
them into :class:`GpuSpec` and :class:`NodeSpec` with SI values, reading each key
with the same key table as a scenario's inline node (schema.py).

The model catalog is a table of transformer shapes: a preset is a :class:`ModelSpec`
with ``preset`` set to its name and its implied defaults filled in
(``ModelSpec.resolved``); a scenario may change any field afterwards.

Model sources:
- GPT-3 family: Brown et al. 2020, Table 2.1 (n_layers, d_model, n_heads), seq 2048,
  vocabulary 50257 (GPT-2 BPE). The 1.3B row lists 24 heads of d_head 128, which does
  not multiply out to d_model 2048; we keep d_head 128 (16 heads). The 13B row lists
  d_model 5140, which is not a multiple of 40 heads; we use 5120 (d_head 128) as
  Megatron does.
- Megatron ladder: Narayanan et al. SC21, Table 1 (heads, hidden, layers); seq 2048,
  vocabulary 51200 (the padded GPT-2 vocabulary used there).
- Llama 2: Touvron et al. 2023 and the released configs (ffn 11008/13824/28672,
  vocabulary 32000, seq 4096; 70B uses GQA with 8 KV heads).
- Llama 3 / 3.1: Dubey et al. 2024, Table 3 (layers, hidden, ffn, heads, 8 KV heads,
  vocabulary 128256, seq 8192).
- Mixtral 8x7B: Jiang et al. 2024 and the released config (32 layers, hidden 4096,
  ffn 14336, 32 heads, 8 KV heads, 8 experts, top-2, vocabulary 32000); trained here at
  seq 4096.
- DeepSeek-V2-Lite, DeepSeek-V2, DeepSeek-V3 (MoE with shared experts and multi-latent
  attention): the configs deepseek-ai/DeepSeek-V3 @ 9b4e978, inference/configs/config_16B.json,
  config_236B.json and config_671B.json (dim, inter_dim, moe_inter_dim, n_layers, n_dense_layers,
  n_heads, n_routed_experts, n_shared_experts, n_activated_experts, q/kv_lora_rank, qk_nope/rope
  and v head dims, vocab_size), which agree with DeepSeek-V2, arXiv 2405.04434, section 3.1.2 and
  appendix B.1, and DeepSeek-V3, arXiv 2412.19437, section 4.2 ("Model Hyper-Parameters"): no
  biases or dropout, RMSNorm, SwiGLU experts, untied embeddings, trained at 4096 tokens. V3's
  multi-token-prediction module is not modelled.
- Qwen2-57B-A14B (MoE with GQA and 8 shared experts of the routed width): Qwen2 Technical
  Report, arXiv 2407.10671, Table 1 (hidden 3584, 28 layers, 28 query and 4 KV heads, expert
  intermediate size 2560, 64 routed experts, 8 activated, 8 shared, untied embeddings,
  vocabulary 151,646), pre-trained at 4096 tokens (section 3.2); its QKV biases and the shared
  experts' sigmoid gate are left out. 57.4B parameters and 14.2B activated by our count.
- Qwen3-235B-A22B (MoE with GQA and decoupled head dims, no shared experts): NeMo 8cfedd72
  nemo/collections/llm/gpt/model/qwen3.py, Qwen3Config235B_A22B (num_layers 94, hidden_size 4096,
  num_attention_heads 64, num_query_groups 4, ffn_hidden_size 12288, moe_ffn_hidden_size 1536; "Config
  for Qwen 3 235B-A22B: https://huggingface.co/Qwen/Qwen3-235B-A22B") over Qwen3MoEConfig (128
  experts, top-8, alltoall dispatcher, grouped GEMM), Qwen3Config (kv_channels 128, vocab_size
  151936, no QKV bias, QK layernorm) and Qwen2Config (RMSNorm, SwiGLU, no linear biases, no dropout,
  untied embeddings, seq_length 4096); the layer, head and expert counts agree with the Qwen3
  Technical Report (QwenLM/Qwen3 @ 7a2f61ff, Qwen3_Technical_Report.pdf, Table 2: 94 layers, 64/4
  query/KV heads, 128 experts, 8 activated). The per-head QK layernorms (2·128 weights) are left out.
  235.1B parameters and 22.2B activated by our count.
- BERT-large: Devlin et al. 2019 (24 layers, hidden 1024, 16 heads, vocabulary 30522,
  seq 512).
"""
from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Any, Mapping, TypeVar

import yaml

from emulator.errors import CatalogError, EmulatorError, UnitError, did_you_mean
from emulator.scenario.schema import GPU_KEYS, NODE_KEYS, UNIT_TYPES, Key
from emulator.scenario.spec import GpuSpec, ModelSpec, NodeSpec
from emulator.scenario.units import PARSERS, parse_ratio

_META = ("source",)
T = TypeVar("T")  # a catalog entry: GpuSpec or NodeSpec


def _convert(name: str, key: Key, value: Any) -> Any:
    if key.type in UNIT_TYPES:
        return PARSERS[key.type](value)
    if key.type == "ratio":
        return parse_ratio(value)
    if key.type == "enum" and str(value) not in key.enum:
        raise UnitError(f"expected one of {', '.join(key.enum)}, got {value!r}")
    if key.type == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise UnitError(f"expected an integer, got {value!r}")
        return value
    if key.type == "number":
        return _number(key, value)
    return str(value)


def _number(key: Key, value: Any) -> float:
    """A plain number within the key's range (comm_overlap_slowdown: 1 to 10)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UnitError(f"expected a number, got {value!r}")
    lo = key.minimum if key.minimum is not None else float("-inf")
    hi = key.maximum if key.maximum is not None else float("inf")
    if not lo <= value <= hi:
        raise UnitError(f"expected a number from {key.minimum:g} to {key.maximum:g}, got {value!r}"
                        if key.minimum is not None and key.maximum is not None else
                        f"expected a number in [{lo:g}, {hi:g}], got {value!r}")
    return float(value)


def measured_kernels(entry_name: str, value: Any) -> tuple[tuple[str, str, tuple[int, ...], float], ...]:
    """A GPU entry's ``kernels``: a list of "gemm DTYPE BxMxNxK TIME" strings (what ``emulator
    calibrate --kineto`` writes: one GEMM shape and its measured kernel time each), as
    (op, dtype, dims, seconds) for devices/kernels.py."""
    if not isinstance(value, list):
        raise EmulatorError(f"catalog.yaml: {entry_name}.kernels: expected a list of "
                            '"gemm DTYPE BxMxNxK TIME" strings, got {value!r}')
    out = []
    for i, item in enumerate(value):
        parts = str(item).split(None, 3)
        try:
            op, dtype, dims_text, time_text = parts
            dims = tuple(int(d) for d in dims_text.split("x"))
            seconds = PARSERS["time"](time_text)
        except (ValueError, UnitError):
            raise EmulatorError(f"catalog.yaml: {entry_name}.kernels[{i}]: expected \"gemm DTYPE BxMxNxK TIME\" "
                                f'(e.g. "gemm bf16 1x4096x12288x4096 1.25 ms"), got {item!r}') from None
        if op != "gemm" or len(dims) != 4 or min(dims) < 1 or not seconds > 0:
            raise EmulatorError(f"catalog.yaml: {entry_name}.kernels[{i}]: expected a gemm with 4 positive dims "
                                f"(batch x m x n x k) and a positive time, got {item!r}")
        out.append((op, dtype, dims, seconds))
    return tuple(out)


def entry_fields(entry_name: str, entry: Mapping[str, Any], keys: Mapping[str, Key]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in entry.items():
        if name in _META or name == "gpu":
            continue
        if name == "kernels" and keys is GPU_KEYS:
            out["kernels"] = measured_kernels(entry_name, value)
            continue
        if name not in keys:
            raise EmulatorError(f"catalog.yaml: {entry_name}: unknown key {name!r}")
        try:
            out[keys[name].attr or name] = _convert(name, keys[name], value)
        except UnitError as err:
            raise EmulatorError(f"catalog.yaml: {entry_name}.{name}: {err}") from None
    return out


def _parse(raw: Any, base_gpus: Mapping[str, GpuSpec]) -> tuple[dict[str, GpuSpec], dict[str, NodeSpec]]:
    if not isinstance(raw, dict):
        raise EmulatorError("catalog.yaml: expected a mapping with 'gpus' and/or 'nodes'")
    gpus = {n: GpuSpec(name=n, **entry_fields(n, e, GPU_KEYS)) for n, e in (raw.get("gpus") or {}).items()}
    known = {**base_gpus, **gpus}
    nodes: dict[str, NodeSpec] = {}
    for n, e in (raw.get("nodes") or {}).items():
        g = e.get("gpu") if isinstance(e, dict) else None
        if g not in known:
            raise EmulatorError(f"catalog.yaml: {n}.gpu: unknown GPU {g!r}")
        try:
            nodes[n] = NodeSpec(name=n, gpu=known[g], **entry_fields(n, e, NODE_KEYS))
        except TypeError as err:  # a missing field: say which
            missing = str(err).partition("argument")[2].strip(": s")
            raise EmulatorError(f"catalog.yaml: {n}: missing {missing}") from None
    return gpus, nodes


@lru_cache(maxsize=1)
def _data() -> tuple[dict[str, GpuSpec], dict[str, NodeSpec]]:
    text = resources.files("emulator").joinpath("data/catalog.yaml").read_text(encoding="utf-8")
    return _parse(yaml.safe_load(text), {})


def load_user_catalog(path: str) -> tuple[dict[str, GpuSpec], dict[str, NodeSpec]]:
    """A user's catalog file (the shape of catalog.yaml, e.g. from ``emulator calibrate``),
    merged over the built-in one. Errors name the file."""
    try:
        with open(path, encoding="utf-8") as fh:
            raw = yaml.safe_load(fh)
        gpus, nodes = _parse(raw, _data()[0])
    except (OSError, yaml.YAMLError) as err:
        raise EmulatorError(f"{path}: cannot read the catalog: {err}") from None
    except EmulatorError as err:
        raise EmulatorError(str(err).replace("catalog.yaml", path, 1)) from None
    return {**_data()[0], **gpus}, {**_data()[1], **nodes}


def _lookup(table: Mapping[str, T], name: object, what: str) -> T:
    text = str(name)
    if text in table:
        return table[text]
    folded = {k.lower(): k for k in table}
    if text.lower() in folded:
        return table[folded[text.lower()]]
    raise CatalogError(unknown_name_message(text, list(table), what))


def unknown_name_message(name: str, known: list[str], what: str) -> str:
    """'unknown GPU "H100"; did you mean "H100-SXM5-80GB"? (known: ...)'"""
    return f'unknown {what} "{name}"{did_you_mean(name, known)} (known: {", ".join(known)})'


def gpu(name: str, user: str | None = None) -> GpuSpec:
    """A catalog GPU by name (case-insensitive); unknown names raise CatalogError."""
    return _lookup(load_user_catalog(user)[0] if user else _data()[0], name, "GPU")


def node(name: str, user: str | None = None) -> NodeSpec:
    """A catalog node by name (case-insensitive), also from a ``user`` catalog file."""
    return _lookup(load_user_catalog(user)[1] if user else _data()[1], name, "node")


def gpu_names() -> list[str]:
    return list(_data()[0])


def node_names() -> list[str]:
    return list(_data()[1])


# ------------------------------------------------------------------ models


def _gpt3(layers: int, hidden: int, heads: int) -> dict[str, Any]:
    return dict(layers=layers, hidden=hidden, heads=heads, seq_len=2048, vocab=50257, tied_embeddings=True)


def _megatron(heads: int, hidden: int, layers: int) -> dict[str, Any]:
    return dict(layers=layers, hidden=hidden, heads=heads, seq_len=2048, vocab=51200, tied_embeddings=True)


def _llama(layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int, seq: int) -> dict[str, Any]:
    return dict(layers=layers, hidden=hidden, heads=heads, kv_heads=kv, ffn_hidden=ffn,
                vocab=vocab, seq_len=seq, swiglu=True, tied_embeddings=False)


def _nemotron(layers: int, hidden: int, heads: int) -> dict[str, Any]:
    return dict(layers=layers, hidden=hidden, heads=heads, kv_heads=8, ffn_hidden=4 * hidden, vocab=256000,
                seq_len=4096, activation="squared_relu", biases=False, dropout=False, norm="layernorm",
                tied_embeddings=False)


def _hybrid(layers: int, hidden: int, heads: int, kv: int, ffn: int, seq: int, pattern: str) -> dict[str, Any]:
    """A Nemotron-H model (Megatron-Bridge's HybridModelProvider defaults: RMSNorm, squared ReLU, no biases,
    dropout or position embedding, untied embeddings; Mamba-2 heads of 64 in 8 groups)."""
    return dict(layers=layers, hidden=hidden, heads=heads, kv_heads=kv, ffn_hidden=ffn, vocab=131072, seq_len=seq,
                activation="squared_relu", biases=False, dropout=False, norm="rmsnorm", tied_embeddings=False,
                position_embedding_type="none", hybrid_layer_pattern=pattern, mamba_head_dim=64, mamba_num_groups=8)


def _deepseek(layers: int, hidden: int, heads: int, ffn: int, expert_ffn: int, experts: int, shared: int,
              top_k: int, dense: int, q_rank: int, vocab: int) -> dict[str, Any]:
    return dict(layers=layers, hidden=hidden, heads=heads, ffn_hidden=ffn, expert_ffn_hidden=expert_ffn,
                experts=experts, shared_experts=shared, top_k=top_k, first_dense_layers=dense, q_lora_rank=q_rank,
                kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, vocab=vocab,
                seq_len=4096, swiglu=True, tied_embeddings=False)


def _dsa(heads: int, dim: int, topk: int, loss: float) -> dict[str, Any]:
    return dict(experimental_attention_variant="dsa", dsa_indexer_n_heads=heads, dsa_indexer_head_dim=dim,
                dsa_indexer_topk=topk, dsa_indexer_loss_coeff=loss)


MODELS: dict[str, dict[str, Any]] = {
    "gpt3-125m": _gpt3(12, 768, 12),
    "gpt3-350m": _gpt3(24, 1024, 16),
    "gpt3-760m": _gpt3(24, 1536, 16),
    "gpt3-1.3b": _gpt3(24, 2048, 16),
    "gpt3-2.7b": _gpt3(32, 2560, 32),
    "gpt3-6.7b": _gpt3(32, 4096, 32),
    "gpt3-13b": _gpt3(40, 5120, 40),
    "gpt3-175b": _gpt3(96, 12288, 96),
    "megatron-1.7b": _megatron(24, 2304, 24),
    "megatron-3.6b": _megatron(32, 3072, 30),
    "megatron-7.5b": _megatron(32, 4096, 36),
    "megatron-18b": _megatron(48, 6144, 40),
    "megatron-39b": _megatron(64, 8192, 48),
    "megatron-76b": _megatron(80, 10240, 60),
    "megatron-145b": _megatron(96, 12288, 80),
    "megatron-310b": _megatron(128, 16384, 96),
    "megatron-530b": _megatron(128, 20480, 105),
    "megatron-1t": _megatron(160, 25600, 128),
    "llama2-7b": _llama(32, 4096, 32, 32, 11008, 32000, 4096),
    "llama2-13b": _llama(40, 5120, 40, 40, 13824, 32000, 4096),
    "llama2-70b": _llama(80, 8192, 64, 8, 28672, 32000, 4096),
    "llama3-8b": _llama(32, 4096, 32, 8, 14336, 128256, 8192),
    "llama3-70b": _llama(80, 8192, 64, 8, 28672, 128256, 8192),
    "llama3-405b": _llama(126, 16384, 128, 8, 53248, 128256, 8192),
    "mixtral-8x7b": dict(_llama(32, 4096, 32, 8, 14336, 32000, 4096), experts=8, top_k=2),
    # Nemotron-4 (NVIDIA): squared-ReLU MLP of 4h, no biases, no dropout, GQA with 8 KV heads, RoPE,
    # untied embeddings, 256k vocabulary, 4096 tokens. 340B: arXiv 2406.11704 (Nemotron-4 340B
    # Technical Report, section 2.1); 15B: arXiv 2402.16819 (Nemotron-4 15B, Table 1). LayerNorm with a
    # shift although the linears have no biases: NeMo 64e6c666 nemo/collections/llm/gpt/model/nemotron.py
    # lines 40 and 44 (normalization "LayerNorm", add_bias_linear False), and TE's LayerNormLinear keeps a
    # layer_norm_bias for any norm but RMSNorm (TransformerEngine 3b2a7b00, v1.14,
    # transformer_engine/pytorch/module/layernorm_linear.py line 952).
    "nemotron4-15b": _nemotron(32, 6144, 48),
    "nemotron4-340b": _nemotron(96, 18432, 96),
    # DeepSeek (sources above): layers, hidden, heads, dense ffn, expert ffn, routed, shared, top-k,
    # leading dense layers, query rank (0: none), vocabulary
    "deepseek-v2-lite": _deepseek(27, 2048, 16, 10944, 1408, 64, 2, 6, 1, 0, 102400),
    "deepseek-v2": _deepseek(60, 5120, 128, 12288, 1536, 160, 2, 6, 1, 1536, 102400),
    # with its one multi-token prediction module: huggingface deepseek-ai/DeepSeek-V3 config.json
    # num_nextn_predict_layers 1 (DeepSeek-V3 Technical Report, arXiv 2412.19437, section 2.2: D = 1)
    "deepseek-v3": dict(_deepseek(61, 7168, 128, 18432, 2048, 256, 1, 8, 3, 1536, 129280), mtp_num_layers=1),
    # DeepSeek-V3.2: DeepSeek-V3's architecture with DeepSeek Sparse Attention's lightning indexer (Megatron-Core
    # d98e8a64dd dsa.py, DSAIndexer, after deepseek-ai/DeepSeek-V3.2-Exp inference/model.py); the indexer's 64 heads
    # of 128 dims, its top 2048 keys and its loss coefficient 0.01 as Megatron-LM's own DSA test
    # (tests/functional_tests/test_cases/gpt/gpt3_mcore_te_tp2_pp2_dsa/model_config.yaml); the loss over each query's
    # top-k keys, as DeepSeek's sparse training stage (the report's section 2.1, which compute_dsa_indexer_loss
    # cites; its dense warm-up is dsa_indexer_use_sparse_loss: false)
    "deepseek-v3.2": dict(_deepseek(61, 7168, 128, 18432, 2048, 256, 1, 8, 3, 1536, 129280), mtp_num_layers=1,
                          **_dsa(64, 128, 2048, 0.01), dsa_indexer_use_sparse_loss=True),
    # GLM-5 (zai-org/GLM-5, Megatron-Bridge 067f987df glm_moe_dsa/glm5_bridge.py: MLA, DSA and MoE): 78 layers, the
    # first 3 dense, experts of 2048 with one shared, qk head 192 + rope 64, the indexer's 32 heads of 128 dims, top
    # 2048, its sparse loss of coefficient 0.001 (the bridge's provider_bridge; tests/unit_tests/models/glm_moe_dsa/
    # test_glm5_bridge.py); hidden 6144, 64 heads, dense ffn 12288, 256 experts, top 8, q rank 2048, kv rank 512,
    # v head 256, vocabulary 154880 from the checkpoint's config.json, which the verification card confirms: its 78
    # layers hold exactly 1,487,822,475,264 bytes (examples/model_verification_cards/glm5/card.yaml;
    # tests/test_sparse_attention.py); one MTP layer (num_nextn_predict_layers 1, which the card leaves out)
    "glm-5": dict(_deepseek(78, 6144, 64, 12288, 2048, 256, 1, 8, 3, 2048, 154880), qk_nope_head_dim=192,
                  v_head_dim=256, mtp_num_layers=1, **_dsa(32, 128, 2048, 0.001), dsa_indexer_use_sparse_loss=True),
    # DeepSeek-V4-Flash: HF transformers 5.25 configuration_deepseek_v4.py, DeepseekV4Config's defaults, which are
    # the deepseek-ai/DeepSeek-V4-Flash-Base checkpoint's (its auto_docstring; the shapes its GroupedLinear docstring
    # gives for Flash): 43 layers, hidden 4096, 64 heads of 512 with one shared key/value head (rope 64), q rank 1024,
    # o_groups 8 of 1024, 256 experts of 2048 (top 6) and one shared, vocabulary 129280, untied, one MTP layer; mHC of
    # 4 streams and 20 Sinkhorn iterations; window 128; the indexer's 64 heads of 128, top 512. Its layer types: the
    # first two sliding (Megatron-Bridge 067f987df deepseek_v4_bridge.py: "pure sliding-window layers (layers 0,1)"),
    # then CSA and HCA alternating from CSA (as the bridge test's checkpoint, [0, 4, 128, 4, 0]: an ASSUMPTION of
    # the order; the checkpoint's config.json is not read), the MTP layer's 0 (the bridge appends one for it). The
    # indexer's sparse loss of 0.01 as the bridge's GB200 recipes set it. 284B parameters by our count.
    "deepseek-v4-flash": dict(layers=43, hidden=4096, heads=64, kv_heads=1, head_dim=512, ffn_hidden=2048,
                              expert_ffn_hidden=2048, experts=256, shared_experts=1, top_k=6, q_lora_rank=1024,
                              qk_rope_head_dim=64, vocab=129280, seq_len=4096, swiglu=True, tied_embeddings=False,
                              mtp_num_layers=1, experimental_attention_variant="dsv4_hybrid",
                              csa_compress_ratios=(0, 0, *(4, 128) * 20, 4, 0), csa_window_size=128, o_groups=8,
                              o_lora_rank=1024, dsa_indexer_n_heads=64, dsa_indexer_head_dim=128,
                              dsa_indexer_topk=512, dsa_indexer_loss_coeff=0.01, dsa_indexer_use_sparse_loss=True,
                              enable_mhc_connections=True, mhc_num_residual_streams=4, mhc_sinkhorn_iterations=20),
    # Kimi K2 (moonshotai/Kimi-K2-Instruct): Megatron-LM d98e8a64dd examples/post_training/modelopt/conf/moonshotai/
    # Kimi-K2-Instruct.sh: 61 layers, hidden 7168, 64 heads, dense ffn 18432, multi-latent attention (q rank 1536,
    # kv rank 512, qk head 128 + rope 64, v head 128), 384 experts of 2048, top 8, one shared expert of 2048
    # (--moe-shared-expert-intermediate-size), the first layer dense (--moe-layer-freq [0]*1+[1]*60), vocabulary
    # 163840 (--padded-vocab-size), 4096 tokens; no multi-token prediction, no group-limited routing
    "kimi-k2": _deepseek(61, 7168, 64, 18432, 2048, 384, 1, 8, 1, 1536, 163840),
    "qwen2-57b-a14b": dict(_llama(28, 3584, 28, 4, 2560, 151646, 4096), expert_ffn_hidden=2560, experts=64,
                           top_k=8, shared_experts=8),
    "qwen3-235b-a22b": dict(_llama(94, 4096, 64, 4, 12288, 151936, 4096), head_dim=128, expert_ffn_hidden=1536,
                            experts=128, top_k=8),
    # Qwen3-30B-A3B: Hugging Face Qwen/Qwen3-30B-A3B config.json, which Megatron-Bridge loads
    # (067f987df src/megatron/bridge/recipes/qwen/h100/qwen3_moe.py, _QWEN3_30B_A3B_MODEL_ID =
    # "Qwen/Qwen3-30B-A3B", AutoBridge.from_hf_pretrained(...).to_megatron_provider): num_hidden_layers 48,
    # hidden_size 2048, num_attention_heads 32, num_key_value_heads 4, head_dim 128, intermediate_size 6144,
    # moe_intermediate_size 768, num_experts 128, num_experts_per_tok 8, vocab_size 151936,
    # tie_word_embeddings false, every layer MoE (decoder_sparse_step 1); trained at 4096 tokens as the
    # Qwen3-235B preset. 30.5B parameters and 3.3B activated by our count.
    "qwen3-30b-a3b": dict(_llama(48, 2048, 32, 4, 6144, 151936, 4096), head_dim=128, expert_ffn_hidden=768,
                          experts=128, top_k=8),
    # Qwen3-Next-80B-A3B (Megatron-Bridge 067f987df tests/unit_tests/models/qwen/test_qwen3_next_bridge.py, its config
    # "matching the expected model structure"): 48 layers, hidden 2048, each a gated delta net (16 key heads, 32 value
    # heads, both of 128, 4 taps: Megatron-Core's linear_* defaults) or, every 4th (full_attention_interval 4), gated
    # attention (16 heads of 256, 2 KV heads; the bridge's attention_output_gate), each with an MoE MLP of 512 experts
    # of 512, top 10, a shared expert of 512; vocabulary 151936, untied, RMSNorm, rope. As a hybrid pattern each layer
    # is two symbols, its mixer and its MLP (the bridge's experimental_attention_variant "gated_delta_net" is the
    # same stack: Megatron-Core's hybrid Symbols include G).
    "qwen3-next-80b-a3b": dict(layers=96, hidden=2048, heads=16, kv_heads=2, head_dim=256, ffn_hidden=5120,
                               vocab=151936, seq_len=4096, swiglu=True, biases=False, dropout=False, norm="rmsnorm",
                               tied_embeddings=False, position_embedding_type="rope", experts=512, top_k=10,
                               expert_ffn_hidden=512, shared_experts=1, attention_output_gate=True,
                               hybrid_layer_pattern="GEGEGE*E" * 12),
    # GPT-OSS-120B: Hugging Face openai/gpt-oss-120b config.json, which Megatron-Bridge loads (067f987df
    # src/megatron/bridge/recipes/gpt_oss/h100/gpt_oss.py: AutoBridge.from_hf_pretrained("openai/gpt-oss-120b"),
    # seq_length 4096): num_hidden_layers 36, hidden_size 2880, num_attention_heads 64, num_key_value_heads 8,
    # head_dim 64, intermediate_size 2880 (each expert's), num_local_experts 128, num_experts_per_tok 4,
    # vocab_size 201088, sliding_window 128 with layer_types alternating sliding and full attention,
    # attention_bias true, untied embeddings, RMSNorm. As the bridge maps it (src/megatron/bridge/models/
    # gpt_oss/gpt_oss_bridge.py): biases on the linears (add_bias_linear, add_qkv_bias), a gated MLP
    # (costed as SwiGLU: two input projections), window_size = (sliding_window - 1, 0) so a query attends
    # 128 keys itself included, window_attn_skip_freq 2, softmax_type "learnable" (the attention sinks,
    # "self_attn.sinks" -> "core_attention.softmax_offset"). 116.8B parameters and 5.7B activated by our
    # count (5.1B without the input embedding, as OpenAI counts).
    "gpt-oss-120b": dict(_llama(36, 2880, 64, 8, 2880, 201088, 4096), head_dim=64, expert_ffn_hidden=2880,
                         experts=128, top_k=4, biases=True, dropout=False, norm="rmsnorm", sliding_window=128,
                         window_attn_skip_freq=2, softmax_type="learnable"),
    # Nemotron-H 56B (hybrid: workload/hybrid.py), as Megatron-Bridge builds it (067f987df
    # src/megatron/bridge/recipes/nemotronh/h100/nemotronh.py, nemotronh_56b_pretrain_8gpu_h100_bf16_config:
    # HybridModelProvider(hybrid_layer_pattern=..., num_layers=118, hidden_size=8192, mamba_state_dim=256,
    # mamba_num_heads=256, ffn_hidden_size=32768, num_attention_heads=64, num_query_groups=8, mamba_num_groups=8,
    # mamba_head_dim=64, squared_relu, seq_length 8192); the provider's defaults (src/megatron/bridge/models/hybrid/
    # hybrid_provider.py): RMSNorm, no linear biases, no dropout, no position embedding, untied embeddings. 54 Mamba
    # layers, 10 attention, 54 MLP. Vocabulary 131072, the Nemotron-H tokenizer's (the family's vocab_size in
    # recipes/nemotronh/h100/nemotron_3_nano_4b.py and tests/unit_tests/models/nemotronh/test_nemotron_h_bridge.py).
    "nemotronh-56b": dict(_hybrid(118, 8192, 64, 8, 32768, 8192,
                                  "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-"
                                  "M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"),
                          mamba_state_dim=256, mamba_num_heads=256),
    # Nemotron 3 Nano (30B-A3B; hybrid with MoE), recipes/nemotronh/h100/nemotron_3_nano.py @ 067f987df,
    # nemotron_3_nano_pretrain_8gpu_h100_bf16_config: 52 layers of the pattern below (23 Mamba, 6 attention, 23
    # MoE), hidden 2688, 32 heads of 128 (kv_channels) in 2 query groups, 128 experts of 1856, top 6, one shared
    # MLP of 3712 (moe_shared_expert_intermediate_size), router in fp32, Mamba 64 heads of 64, state 128, 8 groups;
    # 8192 tokens.
    "nemotron-3-nano": dict(_hybrid(52, 2688, 32, 2, 1856, 8192,
                                    "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"),
                            head_dim=128, experts=128, top_k=6, expert_ffn_hidden=1856, shared_experts=1,
                            shared_expert_ffn_hidden=3712, moe_router_dtype="fp32", mamba_state_dim=128,
                            mamba_num_heads=64),
    # Nemotron 3 Super (120B-A12B; hybrid with latent MoE), Megatron-LM's own example (d98e8a64dd
    # examples/post_training/modelopt/conf/nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16.sh): the 88-layer pattern
    # below (40 Mamba, 8 attention, 40 MoE), hidden 4096, 32 heads of 128 in 2 query groups, 512 experts of 2688
    # (--ffn-hidden-size), top 22, one shared MLP of 5376, latent size 1024, router in fp32, Mamba 128 heads of 64
    # (state 128 and 8 groups, Megatron-Core's defaults); 8192 tokens. Its MTP depths (the release configuration's
    # "/*E/*E", tests/functional_tests/test_cases/nemotron/nemotron3_super_release_gb200/model_config.yaml) are
    # the scenario's to add, as that example leaves them out.
    "nemotron-3-super": dict(_hybrid(88, 4096, 32, 2, 2688, 8192,
                                     "MEMEMEM*EMEMEMEM*EMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEM*"
                                     "EMEMEMEME"),
                             head_dim=128, experts=512, top_k=22, expert_ffn_hidden=2688, shared_experts=1,
                             shared_expert_ffn_hidden=5376, moe_latent_size=1024, moe_router_dtype="fp32",
                             mamba_state_dim=128, mamba_num_heads=128),
    # Nemotron 3 Ultra (550B-A55B; hybrid with latent MoE), Megatron-LM's own example (d98e8a64dd
    # examples/post_training/modelopt/conf/nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16.sh): 108 layers of the
    # pattern below (48 Mamba, 12 attention, 48 MoE), hidden 8192, 64 heads of 128 in 2 query groups, 512 experts of
    # 5120, top 22, one shared MLP of 10240, latent size 2048, router in fp32, Mamba 256 heads of 64 (state 128, 8
    # groups: Megatron-Core's defaults); 8192 tokens. No MTP, as the example.
    "nemotron-3-ultra": dict(_hybrid(108, 8192, 64, 2, 5120, 8192,
                                     "MEMEMEM*EMEMEM*EMEMEMEM*EMEMEMEM*EMEMEM*EMEMEMEM*EMEMEMEM*EMEMEM*EMEMEMEM*"
                                     "EMEMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"),
                             head_dim=128, experts=512, top_k=22, expert_ffn_hidden=5120, shared_experts=1,
                             shared_expert_ffn_hidden=10240, moe_latent_size=2048, moe_router_dtype="fp32",
                             mamba_state_dim=128, mamba_num_heads=256),
    "bert-large": dict(layers=24, hidden=1024, heads=16, seq_len=512, vocab=30522, tied_embeddings=True,
                       causal=False),  # an encoder: bidirectional attention
}

# Models with biases and learned layernorm shifts (GPT-2/3, Megatron GPT, BERT) have swiglu False;
# the Llama family (RMSNorm, no biases) is marked by swiglu=True (workload/models.py, has_biases);
# Nemotron says biases and dropout outright.


def model_names() -> list[str]:
    """Every model preset's name, in catalog order."""
    return list(MODELS)


def model_preset(name: str) -> ModelSpec:
    """The preset called ``name`` (case-insensitive), its defaults filled in; CatalogError if unknown."""
    key = name.strip().lower()
    if key not in MODELS:
        raise CatalogError(unknown_name_message(name, list(MODELS), "model preset"))
    return ModelSpec(preset=key, **MODELS[key]).resolved()
