"""`hyquant demo`: the hybrid KV cache on synthetic attention states.

Keys carry a few planted "vertical-line" columns (tokens every query attends
to strongly), like real LLM attention sinks. The demo freezes a prompt into a
`HybridKVCache`, decodes a number of steps (the window slides, blocks are
flushed into the low-bit region), and compares the decode attention output
with exact attention and with a uniform low-bit cache of the same bits.

A command, not library code: nothing but the CLI runs it, and its result is the command's JSON record
(`run_demo` computes it, `describe` words it).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from hyquant_jax.attention import decode_step
from hyquant_jax.backends import BACKENDS
from hyquant_jax.cache import freeze
from hyquant_jax.cli.options import add_config_args, check_backend, config_from_args
from hyquant_jax.cli.output import ResultFile
from hyquant_jax.config import HyQuantConfig
from hyquant_jax.reference import exact_attention, uniform_quantized_attention
from hyquant_jax.vti import tail_queries, tail_query_count

HELP = "hybrid KV cache on synthetic attention states: bytes and error vs exact"
DESCRIPTION = ("Freeze a synthetic prompt with planted vertical-line keys into a HybridKVCache, decode tokens "
               "through it, and print KV bytes (bf16 vs hybrid) and the decode-attention error vs exact and "
               "uniform low-bit.")


def add_parser(subparsers, formatter_class) -> None:
    """The `demo` subcommand: the synthetic shapes, then the HyQuant settings."""
    demo = subparsers.add_parser("demo", help=HELP, description=DESCRIPTION, formatter_class=formatter_class)
    demo.add_argument("--prompt-len", type=int, default=2048, help="prompt tokens frozen into the cache")
    demo.add_argument("--steps", type=int, default=256, help="decode steps (the window slides)")
    demo.add_argument("--batch", type=int, default=2, help="sequences")
    demo.add_argument("--q-heads", type=int, default=8, help="query heads")
    demo.add_argument("--kv-heads", type=int, default=2, help="KV heads (must divide --q-heads)")
    demo.add_argument("--head-dim", type=int, default=128, help="head dimension")
    demo.add_argument("--backend", default="auto", choices=BACKENDS, help="attention backend (hyquant_jax.backends)")
    demo.add_argument("--json", metavar="PATH", help="also write the result as one JSON record to PATH ('-': to "
                                                     "stdout, the text then goes to stderr)")
    add_config_args(demo)


def run(args: argparse.Namespace) -> int:
    """`hyquant demo` from parsed options: print the result (and write it with --json); exit code 0, or 2 where
    the JSON record could not be written (it went to stdout instead); bad options raise ValueError first."""
    config = config_from_args(args)
    check_shapes(args, config)
    check_backend(args.backend)
    output = ResultFile(args.json, "--json").prepare() if args.json else None
    result = run_demo(prompt_len=args.prompt_len, steps=args.steps, batch=args.batch, q_heads=args.q_heads,
                      kv_heads=args.kv_heads, head_dim=args.head_dim, config=config, backend=args.backend)
    for line in describe(result, config, args.backend):
        print(line, file=sys.stderr if args.json == "-" else sys.stdout)
    return 0 if output is None or output.write(result) else 2


def check_shapes(args: argparse.Namespace, config: HyQuantConfig) -> None:
    """The synthetic shapes: positive sizes, KV heads that divide the query heads, a head_dim the packed cache
    holds; a ValueError naming the option otherwise."""
    for option in ("prompt_len", "steps", "batch", "q_heads", "kv_heads", "head_dim"):
        value = getattr(args, option)
        if value < 1:
            raise ValueError(f"--{option.replace('_', '-')} must be >= 1, got {value}")
    if args.q_heads % args.kv_heads:
        raise ValueError(f"--kv-heads {args.kv_heads} must divide --q-heads {args.q_heads} (each KV head serves "
                         f"a group of query heads)")
    try:
        config.check_head_dim(args.head_dim)
    except ValueError as e:
        raise ValueError(f"--head-dim {args.head_dim}: {e}") from e


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
             config: HyQuantConfig | None = None, seed=0, backend="auto") -> dict:
    """Freeze a synthetic prompt, decode `steps` tokens; the bytes and errors as a JSON-able dict."""
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
    return result


def describe(result: dict, config: HyQuantConfig, backend: str) -> list[str]:
    """`run_demo`'s result in words, one line per item."""
    batch, (q_heads, kv_heads) = result["batch"], result["heads"]
    lay, nbytes, err = result["final_layout"], result["kv_bytes_per_sequence"], result["rel_error_vs_exact"]
    return [
        f"HyQuant demo: B={batch} Hq/Hkv={q_heads}/{kv_heads} D={result['head_dim']}, prompt {result['prompt_len']} "
        f"+ {result['steps']} decoded tokens, K{config.key_bits}V{config.value_bits} {config.scheme}, "
        f"W={config.window}, rho={config.rho}, backend={backend}",
        f"  cache of sequence 0: {lay['length']} tokens = {lay['pages']} low-bit pages, {lay['vl_tokens']} VL, "
        f"{lay['window_tokens']} in the window",
        f"  KV bytes per sequence per layer: bf16 {nbytes['bf16']:,}  hybrid {nbytes['hybrid']:,}  "
        f"({result['compression']:.2f}x smaller)",
        f"  decode attention rel. error vs exact: hybrid {err['hybrid_mean']:.4f}  "
        f"uniform {config.key_bits}-bit {err['uniform_mean']:.4f}",
        f"  wall time {result['seconds']:.1f} s (compilation included)",
    ]
