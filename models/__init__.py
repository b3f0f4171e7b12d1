"""Decoder-only transformer models (Llama / Mistral / Qwen2 / Qwen3 / SmolLM2), loaders, tokenizers.

Knows nothing about quantization: attention is an argument (`models.attention`).
"""

from models.attention import (
    Attention,
    BF16Attention,
    DecodeContext,
    KVBuffer,
    PrefillContext,
    causal_attention,
    grouped_attention,
    prefix_attention,
)
from models.checkpoint import default_model_path, load_model
from models.config import ModelConfig, from_hf_config
from models.transformer import (
    LayerParams,
    Params,
    cast_params,
    check_params,
    forward,
    fuse_qkv,
    init_params,
    logits,
    split_qkv,
)

__all__ = [
    "Attention",
    "BF16Attention",
    "DecodeContext",
    "KVBuffer",
    "LayerParams",
    "ModelConfig",
    "Params",
    "PrefillContext",
    "cast_params",
    "causal_attention",
    "check_params",
    "default_model_path",
    "forward",
    "from_hf_config",
    "fuse_qkv",
    "grouped_attention",
    "prefix_attention",
    "init_params",
    "load_model",
    "logits",
    "split_qkv",
]
