"""Decoder-only transformer models (Llama / Mistral / Qwen2 / Qwen3 / SmolLM2) as Flax NNX modules, loaders,
tokenizers.

Knows nothing about quantization: attention is an argument of the model call (`models.attention`).
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
from models.checkpoint import default_model_path, load_model, resolve_model_path
from models.config import ModelConfig, from_hf_config
from models.transformer import (
    Decoder,
    DecoderLayer,
    ModelDef,
    SplitModel,
    abstract_model,
    cast_model,
    check_model,
    fuse_qkv,
    init_model,
    split_model,
    split_qkv,
)

__all__ = [
    "Attention",
    "BF16Attention",
    "DecodeContext",
    "Decoder",
    "DecoderLayer",
    "KVBuffer",
    "ModelConfig",
    "ModelDef",
    "PrefillContext",
    "SplitModel",
    "abstract_model",
    "cast_model",
    "causal_attention",
    "check_model",
    "default_model_path",
    "from_hf_config",
    "fuse_qkv",
    "grouped_attention",
    "init_model",
    "load_model",
    "prefix_attention",
    "resolve_model_path",
    "split_model",
    "split_qkv",
]
