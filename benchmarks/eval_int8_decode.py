"""Accuracy cost of the INT8 decode route (benchmarks/NOTES.md), on SmolLM2-135M (CPU).

`route_decode_attention` is hybrid decode attention over a `HybridKVCache` (K4V4 channel_key) whose
low-bit region computes its two products as the route would (the VL and window-ring tokens stay exact,
as in the kernel):
  Q.K per page: q x (the page's per-channel key scales), quantized per query row (`qk` format), dotted
      with the 4-bit codes, plus q . (the page's key zeros) in float;
  P.V per page: p x (each token's value scale), quantized per row (`pv` format), dotted with the value
      codes, plus p . (value zeros) in float. Per-row max-abs scaling makes this independent of the
      softmax's running max, so one max per row is used.
Formats: None (float32, i.e. `hybrid_decode_attention_reference`), "int8" (max-abs / 127) or "fp8"
(float8 e4m3, max-abs to 448).

Sections:
  operator    every layer of --windows WikiText windows: the first --length tokens frozen with the
              default config, the --queries queries after them attending over the cache; relative
              error ||a - b|| / ||b|| of each format pair against the float reference and against exact
              attention over the prompt (the kernel tests' bound is 1e-2 against the float reference);
  perplexity  --ppl-prefix tokens through exact prefill + Freeze, then --ppl-tokens teacher-forced decode
              steps scored (NLL, perplexity, top-1 agreement with bf16), as benchmarks/accuracy.py does.

  python benchmarks/eval_int8_decode.py [--sections operator,perplexity]   (or: hyquant eval int8_decode)
Writes benchmarks/results/eval_int8_decode_smollm2.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hyquant_jax import quant  # noqa: E402
from hyquant_jax.cache import (HybridKVCache, accumulate_ring_scores, append, low_bit_valid,  # noqa: E402
                               ring_valid, vl_valid)
from hyquant_jax.config import HyQuantConfig  # noqa: E402
from hyquant_jax.model_attention import HybridAttention  # noqa: E402

FORMATS = (None, "int8", "fp8")
# (name, Q.K format, P.V format) of the variants compared
VARIANTS = (("int8_qk", "int8", None), ("int8_pv", None, "int8"), ("fp8_qk", "fp8", None), ("fp8_pv", None, "fp8"),
            ("int8_qk_int8_pv", "int8", "int8"), ("int8_qk_fp8_pv", "int8", "fp8"))


def quantize_rows(x: jax.Array, fmt: str | None) -> jax.Array:
    """x float32 [..., N] quantized per row (last axis) with a max-abs scale, returned dequantized."""
    if fmt is None:
        return x
    top = {"int8": 127.0, "fp8": 448.0}[fmt]
    scale = jnp.max(jnp.abs(x), axis=-1, keepdims=True) / top
    scale = jnp.where(scale > 0, scale, 1.0)
    y = x / scale
    y = jnp.clip(jnp.round(y), -127, 127) if fmt == "int8" else y.astype(jnp.float8_e4m3fn).astype(jnp.float32)
    return y * scale


def check_config(config: HyQuantConfig) -> None:
    if config.scheme != "channel_key" or config.key_bits == 16 or config.value_bits == 16 or config.group_size:
        raise ValueError(f"route_decode_attention covers channel_key keys with per-token value scales, got {config}")


@partial(jax.jit, static_argnames=("config", "qk", "pv"))
def route_decode_attention(q: jax.Array, cache: HybridKVCache, config: HyQuantConfig, qk: str | None = None,
                           pv: str | None = None):
    """q [B, Hq, D] -> (out [B, Hq, D] float32, lse float32 [B, Hq]); see the module docstring."""
    check_config(config)
    for name, fmt in (("qk", qk), ("pv", pv)):
        if fmt not in FORMATS:
            raise ValueError(f"{name} must be one of {FORMATS}, got {fmt!r}")
    b, hq, d = q.shape
    h, bs = cache.num_kv_heads, config.block_size
    g = hq // h
    qg = q.astype(jnp.float32).reshape(b, h, g, d) / math.sqrt(d)
    u = quant.unpack(cache.k_codes, config.key_bits).astype(jnp.float32)  # [B, H, S, D]
    s, pages = u.shape[2], u.shape[2] // bs
    ks, kz = cache.k_scale.astype(jnp.float32), cache.k_zero.astype(jnp.float32)  # [B, H, P, D]
    a = quantize_rows(qg[:, :, :, None, :] * ks[:, :, None], qk)  # [B, H, g, P, D]
    low = jnp.einsum("bhgpd,bhptd->bhgpt", a, u.reshape(b, h, pages, bs, d))
    low = (low + jnp.einsum("bhgd,bhpd->bhgp", qg, kz)[..., None]).reshape(b, h, g, s)
    vl = jnp.einsum("bhgd,bhcd->bhgc", qg, cache.vl_k.astype(jnp.float32))
    ring = jnp.einsum("bhgd,bhrd->bhgr", qg, cache.ring_k.astype(jnp.float32))
    logits = jnp.concatenate([low, vl, ring], axis=-1)
    ok = jnp.concatenate([low_bit_valid(cache, bs), vl_valid(cache), ring_valid(cache)], axis=1)[:, None, None]
    logits = jnp.where(ok, logits, -jnp.inf)
    m = jnp.max(logits, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    p = jnp.where(ok, jnp.exp(logits - m), 0.0)
    denom = p.sum(-1)
    p_low, p_vl, p_ring = p[..., :s], p[..., s:s + vl.shape[-1]], p[..., s + vl.shape[-1]:]
    vu = quant.unpack(cache.v_codes, config.value_bits).astype(jnp.float32)  # [B, H, S, D]
    vs, vz = cache.v_scale.astype(jnp.float32)[..., 0], cache.v_zero.astype(jnp.float32)[..., 0]  # [B, H, S]
    pq = quantize_rows((p_low * vs[:, :, None]).reshape(b, h, g, pages, bs), pv)
    acc = jnp.einsum("bhgpt,bhptd->bhgd", pq, vu.reshape(b, h, pages, bs, d))
    acc = acc + jnp.einsum("bhgs,bhs->bhg", p_low, vz)[..., None]
    acc = acc + jnp.einsum("bhgc,bhcd->bhgd", p_vl, cache.vl_v.astype(jnp.float32))
    acc = acc + jnp.einsum("bhgr,bhrd->bhgd", p_ring, cache.ring_v.astype(jnp.float32))
    out = acc / jnp.where(denom > 0, denom, 1.0)[..., None]
    lse = jnp.where(denom > 0, jnp.log(jnp.where(denom > 0, denom, 1.0)) + m[..., 0], -jnp.inf)
    return out.reshape(b, hq, d), lse.reshape(b, hq)


@dataclasses.dataclass(frozen=True)
class RouteAttention(HybridAttention):
    """HyQuant with decode attention through `route_decode_attention` (prefill and Freeze as HybridAttention)."""

    qk: str | None = None
    pv: str | None = None

    def decode(self, layer, q, k, v, cache: HybridKVCache, ctx):
        dt = cache.dtype
        cache = append(cache, k.astype(dt), v.astype(dt), self.config, active=ctx.active, flush=not ctx.prepared)
        out, lse = route_decode_attention(q, cache, self.config, self.qk, self.pv)
        return out.astype(q.dtype), accumulate_ring_scores(cache, q, lse, self.config)


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def operator_section(params, model_cfg, stream, args, config) -> dict:
    from benchmarks._accuracy_tasks import window_starts
    from hyquant_jax.cache import freeze
    from hyquant_jax.evaluation import capture_qkv
    from hyquant_jax.vti import tail_queries, tail_query_count

    total = args.length + args.queries
    names = ["float_vs_exact"] + [f"{n}_vs_float" for n, _, _ in VARIANTS] + [f"{n}_vs_exact" for n, _, _ in VARIANTS]
    per_layer = {name: [[] for _ in range(model_cfg.num_layers)] for name in names}
    for start in window_starts(len(stream), total, args.windows):
        states = capture_qkv(params, jnp.asarray(stream[start:start + total])[None], config=model_cfg)
        for i, (q, k, v) in enumerate(states):
            p = args.length
            lengths = jnp.array([p], jnp.int32)
            cache = freeze(k[:, :, :p], v[:, :, :p], lengths,
                           tail_queries(q[:, :, :p], lengths, tail_query_count(config)), config, max_len=total)
            queries = jnp.moveaxis(q[0, :, p:], 1, 0)[:, None]  # [Q, 1, Hq, D]: one decode call per query
            # exact attention of the queries over the prompt (what the cache holds)
            group = q.shape[1] // k.shape[1]
            w = jax.nn.softmax(jnp.einsum("qhd,hpd->qhp", queries[:, 0], jnp.repeat(k[0, :, :p], group, 0))
                               / math.sqrt(q.shape[-1]), axis=-1)
            exact = jnp.einsum("qhp,hpd->qhd", w, jnp.repeat(v[0, :, :p], group, 0))
            run = lambda qk, pv: jax.vmap(  # noqa: E731
                lambda x: route_decode_attention(x, cache, config, qk, pv)[0][0])(queries)
            ref = run(None, None)
            per_layer["float_vs_exact"][i].append(rel(ref, exact))
            for name, qk, pv in VARIANTS:
                out = run(qk, pv)
                per_layer[f"{name}_vs_float"][i].append(rel(out, ref))
                per_layer[f"{name}_vs_exact"][i].append(rel(out, exact))
    summary = {}
    for name, layers in per_layer.items():
        means = [float(np.mean(x)) for x in layers]
        summary[name] = {"per_layer": means, "mean": float(np.mean(means)), "max_layer": float(np.max(means))}
        print(f"operator {name:26s} mean {summary[name]['mean']:.3e}  worst layer {summary[name]['max_layer']:.3e}")
    return {"length": args.length, "queries": args.queries, "windows": args.windows,
            "definition": "relative error ||a - b|| / ||b|| over a layer's heads and queries, mean over windows",
            "relative_error": summary}


def perplexity_section(params, model_cfg, stream, args, config) -> dict:
    from benchmarks._accuracy_tasks import window_starts
    from benchmarks.accuracy import Sizes, perplexity_summary
    from hyquant_jax.evaluation import decode_states, prefill_flavor, run_prefill, teacher_forced_nll
    from models import BF16Attention

    span = args.ppl_prefix + args.ppl_tokens + 1
    starts = window_starts(len(stream), span, args.ppl_windows)
    tokens = jnp.asarray(np.stack([stream[s:s + span] for s in starts]))
    lengths = jnp.full((len(starts),), args.ppl_prefix, jnp.int32)
    methods = {"bf16": BF16Attention(), "hyquant_float": RouteAttention(config, backend="reference")}
    methods.update({f"hyquant_{n}": RouteAttention(config, backend="reference", qk=qk, pv=pv)
                    for n, qk, pv in VARIANTS if n in ("int8_qk", "int8_qk_int8_pv", "int8_qk_fp8_pv")})
    nll, top1 = {}, {}
    for name, att in methods.items():
        flavor = prefill_flavor(att, None, exact=True)
        _, kvs = run_prefill(params, tokens[:, :args.ppl_prefix], lengths, config=model_cfg, prefill=flavor)
        states = decode_states(att, kvs, lengths, span)
        out, pred, _ = teacher_forced_nll(params, states, tokens[:, args.ppl_prefix:], lengths, config=model_cfg,
                                          attention=att)
        nll[name], top1[name] = np.asarray(out, np.float64), np.asarray(pred)
        print(f"perplexity {name:24s} ppl {math.exp(nll[name].mean()):.4f}")
    sizes = Sizes(ppl_prefix=args.ppl_prefix, ppl_tokens=args.ppl_tokens, ppl_windows=args.ppl_windows)
    return perplexity_summary(nll, top1, starts, sizes)


def main():
    from benchmarks._accuracy_tasks import wikitext_tokens
    from benchmarks.accuracy import DEFAULT_WIKITEXT
    from models.checkpoint import load_model

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sections", default="operator,perplexity")
    ap.add_argument("--length", type=int, default=2048, help="operator: prompt tokens frozen into the cache")
    ap.add_argument("--queries", type=int, default=16, help="operator: queries after the prompt")
    ap.add_argument("--windows", type=int, default=2, help="operator: WikiText windows")
    ap.add_argument("--ppl-prefix", type=int, default=2048)
    ap.add_argument("--ppl-tokens", type=int, default=256)
    ap.add_argument("--ppl-windows", type=int, default=2)
    ap.add_argument("--wikitext", type=Path, default=DEFAULT_WIKITEXT)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    t0 = time.time()
    config = HyQuantConfig()
    check_config(config)
    model_cfg, params, tokenizer = load_model(dtype="float32")
    stream = wikitext_tokens(args.wikitext, tokenizer)
    result = {"command": "benchmarks/eval_int8_decode.py " + " ".join(sys.argv[1:]),
              "model": "SmolLM2-135M-Instruct (Q4_1 GGUF, float32 compute)", "config": dataclasses.asdict(config),
              "jax": jax.__version__, "device": jax.devices()[0].device_kind}
    sections = args.sections.split(",")
    if "operator" in sections:
        result["operator"] = operator_section(params, model_cfg, stream, args, config)
    if "perplexity" in sections:
        result["perplexity"] = perplexity_section(params, model_cfg, stream, args, config)
    result["seconds"] = time.time() - t0
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "eval_int8_decode_smollm2.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
