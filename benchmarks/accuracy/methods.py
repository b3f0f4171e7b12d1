"""The accuracy benchmark's methods: each name's attention (`make_method`) and its one-line description."""

from __future__ import annotations

import dataclasses
import sys

from benchmarks.accuracy.settings import EXACT_PREFILL, KNOWN_METHODS, MAIN_METHODS


def make_method(name: str, cache_dtype, config=None):
    """The attention implementation of a method name (MAIN_METHODS), reference backend, bf16 cache.

    bf16 and the quantized baselines multiply float32 probabilities with float32 values on every
    device (their default off-GPU only), as the reference backend of HyQuant and sparse_vl does.
    """
    from hyquant_jax.config import HyQuantConfig
    from hyquant_jax.eval import VerticalSparseAttention
    from hyquant_jax.model_attention import HybridAttention, make_attention

    if name.startswith("hyquant_"):
        bits = name.split("_")[1]  # e.g. "k4v2"
        cfg = config or HyQuantConfig(key_bits=int(bits[1]), value_bits=int(bits[3]))
        return HybridAttention(cfg, backend="reference", cache_dtype=cache_dtype)
    if name == "sparse_vl":
        return VerticalSparseAttention(config or HyQuantConfig(), cache_dtype=cache_dtype)
    if name in MAIN_METHODS:
        return dataclasses.replace(make_attention(name, cache_dtype=cache_dtype), f32_probs=True)
    raise ValueError(f"unknown method {name!r}; choose from {KNOWN_METHODS}")


def describe(name: str) -> str:
    from hyquant_jax.config import HyQuantConfig

    d = HyQuantConfig()
    if name == EXACT_PREFILL:
        return ("HyQuant K4V4 decode cache after an exact prefill + VTI (generate's chunked-prefill path): "
                "isolates the cache's share of HyQuant's error")
    if name.startswith("hyquant_"):
        return (f"HyQuant {name[8:].upper()} {d.scheme}, rho {d.rho:.0%}, W {d.window}, block {d.block_size}, "
                f"INT8-QK hybrid prefill")
    return {"bf16": "exact attention, bf16 cache",
            "uniform4": "uniform 4-bit per-token symmetric, no VL, no window (exact prefill)",
            "uniform8": "uniform 8-bit per-token symmetric, no VL, no window (exact prefill)",
            "kivi4": "KIVI-style 4-bit: per-channel keys / 32 tokens, per-token values, 128-token bf16 residual",
            "kivi2": "KIVI-style 2-bit: per-channel keys / 32 tokens, per-token values, 128-token bf16 residual",
            "sparse_vl": f"vertical-only sparse: VL (rho {d.rho:.0%}) + window {d.window} kept, rest dropped"}[name]


def progress(iterable=None, **kw):
    from tqdm import tqdm

    return tqdm(iterable, file=sys.stderr, dynamic_ncols=True, leave=False, **kw)
