"""Self-contained demo of the hybrid KV cache on synthetic attention states.

Keys carry a few planted "vertical-line" columns (tokens every query attends
to strongly), like real LLM attention sinks. The demo freezes a prompt into a
`HybridKVCache`, decodes a number of steps (the window slides, blocks are
flushed into the low-bit region), and compares the decode attention output
with exact attention and with a uniform low-bit cache of the same bits.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from hyquant_jax.attention import decode_step
from hyquant_jax.cache import freeze
from hyquant_jax.config import HyQuantConfig
from hyquant_jax.reference import exact_attention, uniform_quantized_attention
from hyquant_jax.vti import tail_queries, tail_query_count


@dataclasses.dataclass(frozen=True)
class SyntheticStates:
    q: jax.Array  # [B, Hq, N + steps, D]
    k: jax.Array  # [B, Hkv, N + steps, D]
    v: jax.Array


def planted_states(key, batch, q_heads, kv_heads, length, head_dim, heavy=8, dtype=jnp.bfloat16):
    """Random q/k/v where `heavy` key positions per KV head align with every query."""
    kq, kk, kv, kd, kp = jax.random.split(key, 5)
    direction = jax.random.normal(kd, (batch, kv_heads, 1, head_dim))
    group = q_heads // kv_heads
    q = jax.random.normal(kq, (batch, q_heads, length, head_dim))
    q = q + 1.5 * jnp.repeat(direction, group, axis=1)
    k = jax.random.normal(kk, (batch, kv_heads, length, head_dim))
    cols = jax.random.randint(kp, (batch, kv_heads, heavy), 0, length // 2)
    boost = jnp.zeros((batch, kv_heads, length)).at[
        jnp.arange(batch)[:, None, None], jnp.arange(kv_heads)[None, :, None], cols
    ].set(1.0)
    k = k + 3.0 * boost[..., None] * direction
    v = jax.random.normal(kv, (batch, kv_heads, length, head_dim))
    return SyntheticStates(q.astype(dtype), k.astype(dtype), v.astype(dtype))


def _rel_err(out, ref):
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def run_demo(prompt_len=2048, steps=256, batch=2, q_heads=8, kv_heads=2, head_dim=128,
             config: HyQuantConfig | None = None, seed=0, backend="auto", echo=print) -> dict:
    """Freeze a synthetic prompt, decode `steps` tokens, report bytes and errors."""
    config = config or HyQuantConfig()
    t0 = time.perf_counter()
    total = prompt_len + steps
    s = planted_states(jax.random.PRNGKey(seed), batch, q_heads, kv_heads, total, head_dim)
    lengths = jnp.full((batch,), prompt_len, jnp.int32)
    k0, v0 = s.k[:, :, :prompt_len], s.v[:, :, :prompt_len]
    q_tail = tail_queries(s.q[:, :, :prompt_len], lengths, tail_query_count(config))
    cache = freeze(k0, v0, lengths, q_tail, config, max_len=total)

    errors, uniform_errors = [], []
    for t in range(prompt_len, total):
        q, k, v = s.q[:, :, t], s.k[:, :, t], s.v[:, :, t]
        out, cache = decode_step(q, k, v, cache, config, backend=backend)
        if (t - prompt_len) % max(1, steps // 8) == 0 or t == total - 1:
            kv_len = jnp.full((batch,), t + 1, jnp.int32)
            ref, _ = exact_attention(q[:, :, None].astype(jnp.float32), s.k, s.v, kv_len)
            uni, _ = uniform_quantized_attention(q[:, :, None].astype(jnp.float32), s.k, s.v, kv_len, config)
            errors.append(_rel_err(out, ref[:, :, 0]))
            uniform_errors.append(_rel_err(uni[:, :, 0], ref[:, :, 0]))

    bf16_bytes = int(total * kv_heads * head_dim * 2 * 2)
    hybrid_bytes = int(cache.used_bytes(config)[0])
    result = {
        "config": dataclasses.asdict(config),
        "prompt_len": prompt_len, "steps": steps, "batch": batch,
        "heads": [q_heads, kv_heads], "head_dim": head_dim,
        "kv_bytes_per_sequence": {"bf16": bf16_bytes, "hybrid": hybrid_bytes},
        "compression": bf16_bytes / hybrid_bytes,
        "rel_error_vs_exact": {"hybrid_mean": float(np.mean(errors)), "uniform_mean": float(np.mean(uniform_errors))},
        "final_layout": {
            "pages": int(cache.num_pages[0]), "vl_tokens": int(cache.num_vl[0]),
            "window_tokens": int(cache.ring_len[0]), "length": int(cache.length[0]),
        },
        "seconds": time.perf_counter() - t0,
    }
    echo(f"HyQuant demo: B={batch} Hq/Hkv={q_heads}/{kv_heads} D={head_dim}, prompt {prompt_len} + {steps} "
         f"decoded tokens, K{config.key_bits}V{config.value_bits} {config.scheme}, W={config.window}, "
         f"rho={config.rho}, backend={backend}")
    lay = result["final_layout"]
    echo(f"  cache of sequence 0: {lay['length']} tokens = {lay['pages']} low-bit pages, {lay['vl_tokens']} VL, "
         f"{lay['window_tokens']} in the window")
    echo(f"  KV bytes per sequence per layer: bf16 {bf16_bytes:,}  hybrid {hybrid_bytes:,}  "
         f"({result['compression']:.2f}x smaller)")
    echo(f"  decode attention rel. error vs exact: hybrid {result['rel_error_vs_exact']['hybrid_mean']:.4f}  "
         f"uniform {config.key_bits}-bit {result['rel_error_vs_exact']['uniform_mean']:.4f}")
    echo(f"  wall time {result['seconds']:.1f} s (compilation included)")
    return result
