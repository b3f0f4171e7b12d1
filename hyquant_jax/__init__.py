"""hyquant-jax: hybrid-precision quantized attention (HyQuant) for JAX.

The names here are what a user of the library needs (README.md): whole models (`load`, `Model.generate`,
`generate` on token ids), the settings, the attention functions on arrays (prefill, Freeze, decode), the cache
and the Flax layer. Everything else stays in its module: `hyquant_jax.cache` (append, flush, dequantize),
`hyquant_jax.quant` (pack, quantize), `hyquant_jax.reference` (the jnp references), `hyquant_jax.vti`,
`hyquant_jax.model_attention` (the attention implementations a model takes), `hyquant_jax.sharding`,
`hyquant_jax.compile_options`, `hyquant_jax.eval` (evaluation only) and `hyquant_jax.cli` (the command).
"""

from hyquant_jax.api import Completion, Generation, Model, load
from hyquant_jax.attention import decode_attention, decode_step, prefill_attention
from hyquant_jax.cache import HybridKVCache, freeze
from hyquant_jax.config import HyQuantConfig
from hyquant_jax.flax_layer import HyQuantAttention
from hyquant_jax.generate import GenerateResult, generate
from hyquant_jax.model_attention import make_attention
from hyquant_jax.sampling import SamplingConfig
from hyquant_jax.vti import tail_queries

__version__ = "0.1.0"

__all__ = [
    "Completion",
    "GenerateResult",
    "Generation",
    "HyQuantAttention",
    "HyQuantConfig",
    "HybridKVCache",
    "Model",
    "SamplingConfig",
    "decode_attention",
    "decode_step",
    "freeze",
    "generate",
    "load",
    "make_attention",
    "prefill_attention",
    "tail_queries",
]
