"""hyquant-jax: hybrid-precision quantized attention (HyQuant) for JAX."""

from hyquant_jax.attention import decode_attention, decode_step, prefill_attention
from hyquant_jax.cache import (
    HybridKVCache,
    accumulate_ring_scores,
    append,
    capacities,
    dequantize_keys,
    dequantize_values,
    freeze,
)
from hyquant_jax.config import HyQuantConfig, num_vl_tokens
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
from hyquant_jax.vti import tail_queries, vertical_token_identification

__all__ = [
    "HyQuantConfig",
    "HybridKVCache",
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
    "freeze",
    "hybrid_decode_attention_reference",
    "hybrid_prefill_attention_reference",
    "num_vl_tokens",
    "pack",
    "prefill_attention",
    "quantize_channels",
    "quantize_tokens",
    "tail_queries",
    "uniform_quantized_attention",
    "uniform_quantized_prefill_reference",
    "unpack",
    "vertical_token_identification",
]
