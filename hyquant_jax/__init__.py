"""hyquant-jax: hybrid-precision quantized attention (HyQuant) for JAX."""

from hyquant_jax.api import Completion, Generation, Model, load
from hyquant_jax.attention import decode_attention, decode_step, prefill_attention
from hyquant_jax.cache import (
    HybridKVCache,
    accumulate_ring_scores,
    append,
    capacities,
    dequantize_keys,
    dequantize_values,
    flush_full_rings,
    freeze,
)
from hyquant_jax.config import HyQuantConfig, num_vl_tokens
from hyquant_jax.flax_layer import HyQuantAttention, PromptCache
from hyquant_jax.generate import GenerateResult, generate, kv_cache_bytes
from hyquant_jax.model_attention import (
    ATTENTION_KINDS,
    HybridAttention,
    QuantizedCacheAttention,
    kivi_attention,
    make_attention,
    uniform_attention,
)
from hyquant_jax.quant import (
    dequantize_channels,
    dequantize_tokens,
    pack,
    quantize_channels,
    quantize_tokens,
    unpack,
)
from hyquant_jax.reference import (
    exact_attention,
    hybrid_decode_attention_reference,
    hybrid_prefill_attention_reference,
    uniform_quantized_attention,
    uniform_quantized_prefill_reference,
)
from hyquant_jax.sampling import SamplingConfig
from hyquant_jax.vti import tail_queries, vertical_token_identification

__version__ = "0.1.0"

__all__ = [
    "ATTENTION_KINDS",
    "Completion",
    "Generation",
    "Model",
    "GenerateResult",
    "HyQuantAttention",
    "HyQuantConfig",
    "HybridAttention",
    "HybridKVCache",
    "PromptCache",
    "QuantizedCacheAttention",
    "SamplingConfig",
    "accumulate_ring_scores",
    "append",
    "capacities",
    "decode_attention",
    "decode_step",
    "dequantize_channels",
    "dequantize_keys",
    "dequantize_tokens",
    "dequantize_values",
    "exact_attention",
    "flush_full_rings",
    "freeze",
    "generate",
    "hybrid_decode_attention_reference",
    "hybrid_prefill_attention_reference",
    "kivi_attention",
    "kv_cache_bytes",
    "load",
    "make_attention",
    "num_vl_tokens",
    "pack",
    "prefill_attention",
    "quantize_channels",
    "quantize_tokens",
    "tail_queries",
    "uniform_attention",
    "uniform_quantized_attention",
    "uniform_quantized_prefill_reference",
    "unpack",
    "vertical_token_identification",
]
