"""Accuracy cost of the INT8 decode route (benchmarks/NOTES.md), on SmolLM2-135M's attention states (CPU).

For every layer of WikiText windows: the first P tokens are frozen into a `HybridKVCache` (default config:
K4V4 channel_key, rho 5%, W 128), then the Q queries after them attend over that cache three ways:
  exact   float64 attention over the P prompt tokens (no quantization);
  hybrid  the quantized cache in float64 math, i.e. what `hybrid_decode_attention_reference` and the
          kernels compute;
  int8    the same, with the low-bit region's two products as the INT8 route computes them:
          Q.K per page: q x (the page's per-channel key scales) requantized to int8 per query row
              (max-abs / 127), dotted with the 4-bit codes, plus q . (the page's key zeros) in float;
          P.V per page: p x (each token's value scale) requantized to int8 per row (max / 127), dotted
              with the value codes, plus p . (value zeros) in float;
          the VL and window-ring tokens exact, as in the kernel. Per-row max-abs scaling makes P's
          quantization independent of the softmax's running max, so one global max per row is used.
Reports relative errors ||a - b|| / ||b|| over each layer's heads and queries: hybrid vs exact, int8 vs
exact, int8 vs hybrid (the kernel tests' bound is 1e-2 against the float32 reference of the same cache).

  python benchmarks/int8_decode_accuracy.py [--length 2048] [--queries 16] [--windows 2]
Writes benchmarks/results/int8_decode_accuracy_smollm2.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def int8_rows(x: np.ndarray) -> np.ndarray:
    """Symmetric int8 quantization per row (last axis), returned dequantized (float64)."""
    scale = np.abs(x).max(axis=-1, keepdims=True) / 127.0
    scale = np.where(scale > 0, scale, 1.0)
    return np.clip(np.round(x / scale), -127, 127) * scale


def fp8_rows(x: np.ndarray) -> np.ndarray:
    """float8 e4m3 quantization per row (max-abs scaled to 448), returned dequantized (float64)."""
    scale = np.abs(x).max(axis=-1, keepdims=True) / 448.0
    scale = np.where(scale > 0, scale, 1.0)
    return np.asarray(jnp.asarray(x / scale, jnp.float32).astype(jnp.float8_e4m3fn), np.float64) * scale


def cache_parts(cache, config):
    """float64 NumPy views of one sequence's cache (batch 0): low-bit codes, scales, zeros, validity, VL, ring."""
    from hyquant_jax import quant
    from hyquant_jax.cache import low_bit_valid, ring_valid, vl_valid

    f = lambda x: np.asarray(jnp.asarray(x, jnp.float32), np.float64)[0]  # noqa: E731
    return {
        "k_u": f(quant.unpack(cache.k_codes, config.key_bits)),  # [H, S, D] codes
        "k_s": f(cache.k_scale), "k_z": f(cache.k_zero),  # [H, pages, D]
        "v_u": f(quant.unpack(cache.v_codes, config.value_bits)),  # [H, S, D]
        "v_s": f(cache.v_scale)[..., 0], "v_z": f(cache.v_zero)[..., 0],  # [H, S] (one group per token)
        "low_ok": np.asarray(low_bit_valid(cache, config.block_size))[0],
        "vl_k": f(cache.vl_k), "vl_v": f(cache.vl_v), "vl_ok": np.asarray(vl_valid(cache))[0],
        "ring_k": f(cache.ring_k), "ring_v": f(cache.ring_v), "ring_ok": np.asarray(ring_valid(cache))[0],
    }


def decode_outputs(q: np.ndarray, parts: dict, block: int, int8_qk, int8_pv) -> np.ndarray:
    """q [Hq, Q, D] float64 -> attention outputs [Hq, Q, D] over the cache, in float64. int8_qk / int8_pv:
    False (float math) or the per-row quantizer (`int8_rows`, `fp8_rows`; True means int8) of the low-bit
    region's Q.K / P.V operand as the route computes them."""
    hq, nq, d = q.shape
    h = parts["k_u"].shape[0]
    g = hq // h
    scale = 1.0 / np.sqrt(d)
    out = np.zeros_like(q)
    for kv in range(h):
        qh = q[kv * g:(kv + 1) * g].reshape(g * nq, d)  # rows: the group's queries
        u, ks, kz = parts["k_u"][kv], parts["k_s"][kv], parts["k_z"][kv]  # [S, D], [pages, D]
        pages = u.shape[0] // block
        page_of = np.arange(u.shape[0]) // block
        if int8_qk:  # per page: q x scale to int8 per row, dotted with the codes; q . zero in float
            quant_qk = int8_rows if int8_qk is True else int8_qk
            low = np.empty((qh.shape[0], u.shape[0]))
            for p in range(pages):
                t = slice(p * block, (p + 1) * block)
                low[:, t] = quant_qk(qh * ks[p]) @ u[t].T + (qh @ kz[p])[:, None]
        else:
            low = qh @ (u * ks[page_of] + kz[page_of]).T
        logits = np.concatenate([low, qh @ parts["vl_k"][kv].T, qh @ parts["ring_k"][kv].T], axis=1) * scale
        ok = np.concatenate([parts["low_ok"], parts["vl_ok"], parts["ring_ok"]])
        logits = np.where(ok[None, :], logits, -np.inf)
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        denom = p.sum(axis=1, keepdims=True)
        n_low = u.shape[0]
        p_low, p_rest = p[:, :n_low], p[:, n_low:]
        vu, vs, vz = parts["v_u"][kv], parts["v_s"][kv], parts["v_z"][kv]
        if int8_pv:  # per page: p x value scale to int8 per row, dotted with the codes; p . zero in float
            quant_pv = int8_rows if int8_pv is True else int8_pv
            acc = np.zeros((qh.shape[0], d))
            for pg in range(pages):
                t = slice(pg * block, (pg + 1) * block)
                acc += quant_pv(p_low[:, t] * vs[t]) @ vu[t] + (p_low[:, t] @ vz[t])[:, None]
        else:
            acc = p_low @ (vu * vs[:, None] + vz[:, None])
        acc += p_rest @ np.concatenate([parts["vl_v"][kv], parts["ring_v"][kv]], axis=0)
        out[kv * g:(kv + 1) * g] = (acc / denom).reshape(g, nq, d)
    return out


def exact_outputs(q, k, v) -> np.ndarray:
    """q [Hq, Q, D], k, v [H, P, D] float64 -> [Hq, Q, D]."""
    hq, nq, d = q.shape
    g = hq // k.shape[0]
    kk, vv = np.repeat(k, g, axis=0), np.repeat(v, g, axis=0)
    logits = np.einsum("hqd,hpd->hqp", q, kk) / np.sqrt(d)
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return np.einsum("hqp,hpd->hqd", p / p.sum(axis=-1, keepdims=True), vv)


def rel(a, b) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def main():
    from benchmarks._accuracy_tasks import wikitext_tokens, window_starts
    from benchmarks.accuracy import DEFAULT_WIKITEXT
    from hyquant_jax.cache import freeze
    from hyquant_jax.config import HyQuantConfig
    from hyquant_jax.evaluation import capture_qkv
    from hyquant_jax.vti import tail_queries, tail_query_count
    from models.checkpoint import load_model

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--length", type=int, default=2048, help="prompt tokens frozen into the cache (P)")
    ap.add_argument("--queries", type=int, default=16, help="queries after the prompt (Q)")
    ap.add_argument("--windows", type=int, default=2, help="WikiText windows")
    ap.add_argument("--wikitext", type=Path, default=DEFAULT_WIKITEXT)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    t_start = time.time()
    config = HyQuantConfig()
    model_cfg, params, tokenizer = load_model(dtype="float32")
    stream = wikitext_tokens(args.wikitext, tokenizer)
    total = args.length + args.queries
    layers = {name: [] for name in ("hybrid_vs_exact", "int8_vs_exact", "int8_vs_hybrid", "int8_qk_only_vs_hybrid",
                                    "int8_pv_only_vs_hybrid", "fp8_qk_only_vs_hybrid", "fp8_pv_only_vs_hybrid",
                                    "int8_qk_fp8_pv_vs_hybrid", "int8_qk_fp8_pv_vs_exact")}
    for start in window_starts(len(stream), total, args.windows):
        tokens = jnp.asarray(stream[start:start + total])[None]
        states = capture_qkv(params, tokens, config=model_cfg)
        for i, (q, k, v) in enumerate(states):
            p = args.length
            lengths = jnp.array([p], jnp.int32)
            cache = freeze(k[:, :, :p], v[:, :, :p], lengths,
                           tail_queries(q[:, :, :p], lengths, tail_query_count(config)), config, max_len=total)
            parts = cache_parts(cache, config)
            qn = np.asarray(q, np.float64)[0, :, p:]
            exact = exact_outputs(qn, np.asarray(k, np.float64)[0, :, :p], np.asarray(v, np.float64)[0, :, :p])
            hybrid = decode_outputs(qn, parts, config.block_size, False, False)
            int8 = decode_outputs(qn, parts, config.block_size, True, True)
            qk_only = decode_outputs(qn, parts, config.block_size, True, False)
            pv_only = decode_outputs(qn, parts, config.block_size, False, True)
            fp8_qk = decode_outputs(qn, parts, config.block_size, fp8_rows, False)
            fp8_pv = decode_outputs(qn, parts, config.block_size, False, fp8_rows)
            int8_qk_fp8_pv = decode_outputs(qn, parts, config.block_size, True, fp8_rows)
            for name, (a, b) in {"hybrid_vs_exact": (hybrid, exact), "int8_vs_exact": (int8, exact),
                                 "int8_vs_hybrid": (int8, hybrid), "int8_qk_only_vs_hybrid": (qk_only, hybrid),
                                 "int8_pv_only_vs_hybrid": (pv_only, hybrid),
                                 "fp8_qk_only_vs_hybrid": (fp8_qk, hybrid), "fp8_pv_only_vs_hybrid": (fp8_pv, hybrid),
                                 "int8_qk_fp8_pv_vs_hybrid": (int8_qk_fp8_pv, hybrid),
                                 "int8_qk_fp8_pv_vs_exact": (int8_qk_fp8_pv, exact)}.items():
                if len(layers[name]) <= i:
                    layers[name].append([])
                layers[name][i].append(rel(a, b))
    summary = {}
    for name, per_layer in layers.items():
        means = [float(np.mean(x)) for x in per_layer]
        summary[name] = {"per_layer": means, "mean": float(np.mean(means)), "max_layer": float(np.max(means))}
        print(f"{name:24s} mean {summary[name]['mean']:.3e}  worst layer {summary[name]['max_layer']:.3e}")
    result = {"command": "benchmarks/int8_decode_accuracy.py " + " ".join(f"--{k} {v}" for k, v in
                                                                          (("length", args.length),
                                                                           ("queries", args.queries),
                                                                           ("windows", args.windows))),
              "model": "SmolLM2-135M-Instruct (Q4_1 GGUF, float32 compute)", "config": dataclasses.asdict(config),
              "jax": jax.__version__, "device": jax.devices()[0].device_kind, "seconds": time.time() - t_start,
              "relative_error": summary}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "int8_decode_accuracy_smollm2.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
