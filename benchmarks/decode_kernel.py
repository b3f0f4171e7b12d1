"""Decode attention kernel benchmark: hybrid K4V4 cache vs bf16 baselines, one process.

For each case (same random inputs for every method):
  hybrid   the Pallas HyQuant kernel over a HybridKVCache (K4V4, rho 5%, W 128)
  cudnn    jax.nn.dot_product_attention(implementation="cudnn"), bf16 cache
  pallas   jax.experimental.pallas.ops.gpu.decode_attention.gqa, bf16 cache
  xla      plain jnp einsum/softmax, bf16 cache
  kivi     uniform 4-bit cache (per-channel keys, per-token values) dequantized
           to bf16, then the best of cudnn / xla attention
Times: per call inside a jitted fori_loop (`loop_ms`) and per call from Python
(`call_ms`). Bandwidth = bytes the method must read / loop time.

Run on the GPU box from the repo root:
  python -m benchmarks.decode_kernel --out $OUT [--sweep] [--split-sweep 8,16,32] [--graph-compare]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import subprocess

import jax
import jax.numpy as jnp
import numpy as np

import hyquant_jax as hq
from benchmarks.cases import DECODE_CASES, DECODE_CONFIG, DECODE_SMOKE_CASES, QWEN3_8B_HEADS, qwen3_8b_case
from benchmarks.common import (
    default_name,
    environment,
    module_command,
    module_env,
    output_folder,
    pallas_triton_op,
    run_script,
    time_in_loop,
    time_per_call,
    write_json,
)
from benchmarks.read_bandwidth import read_bandwidth
from hyquant_jax import quant
from hyquant_jax.decode_launch import DecodeTuning, decode_layout, plan
from hyquant_jax.decode_launch import decode_attention as kernel_decode
from hyquant_jax.reference import hybrid_decode_attention_reference

pallas_decode = pallas_triton_op("decode_attention")  # JAX's Pallas Triton decode kernel, the `pallas` baseline



@dataclasses.dataclass
class Inputs:
    q: jax.Array  # [B, Hq, D] bf16
    k: jax.Array  # [B, S, Hkv, D] bf16 (layout of the bf16 baselines)
    v: jax.Array
    lengths: jax.Array
    cache: hq.HybridKVCache
    kivi: dict


def make_inputs(batch, q_heads, kv_heads, head_dim, context, config, seed=0) -> Inputs:
    kq, kk, kv = jax.random.split(jax.random.PRNGKey(seed), 3)
    k = jax.random.normal(kk, (batch, kv_heads, context, head_dim), jnp.bfloat16)
    v = jax.random.normal(kv, (batch, kv_heads, context, head_dim), jnp.bfloat16)
    q_tail = jax.random.normal(kq, (batch, q_heads, config.window, head_dim), jnp.bfloat16)
    lengths = jnp.full((batch,), context, jnp.int32)
    cache = hq.freeze(k, v, lengths, q_tail, config, max_len=context + 256)
    q = jax.random.normal(jax.random.fold_in(kq, 1), (batch, q_heads, head_dim), jnp.bfloat16)
    kivi = kivi_quantize(k, v)
    return Inputs(q, jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2), lengths, cache, kivi)


# ----------------------------------------------------------------------------- baselines

def cudnn_attention(q, k, v):
    out = jax.nn.dot_product_attention(q[:, None], k, v, implementation="cudnn")
    return out[:, 0]


def xla_attention(q, k, v):
    b, hq, d = q.shape
    h = k.shape[2]
    qg = q.reshape(b, h, hq // h, d).astype(jnp.float32) / math.sqrt(d)
    s = jnp.einsum("bhgd,bshd->bhgs", qg, k, preferred_element_type=jnp.float32)
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("bhgs,bshd->bhgd", p.astype(v.dtype), v,
                      preferred_element_type=jnp.float32).reshape(b, hq, d).astype(q.dtype)


def pallas_attention(q, k, v, k_splits=16):
    if pallas_decode is None:
        raise NotImplementedError(f"jax {jax.__version__} has no jax.experimental.pallas.ops.gpu.decode_attention")
    return pallas_decode.gqa(q, k, v, k_splits=k_splits)


KIVI_GROUP = 64


def kivi_quantize(k, v):
    """Uniform 4-bit KIVI-style cache: keys per channel over 64-token groups, values per token."""
    b, h, s, d = k.shape
    pad = (-s) % KIVI_GROUP
    kp = jnp.pad(k, ((0, 0), (0, 0), (0, pad), (0, 0))).reshape(b, h, -1, KIVI_GROUP, d)
    kc, ks, kz = quant.quantize_channels(kp, 4)
    vc, vs, vz = quant.quantize_tokens(v, 4, symmetric=False)
    return dict(k_codes=quant.pack(kc.reshape(b, h, -1, d), 4), k_scale=ks, k_zero=kz,
                v_codes=quant.pack(vc, 4), v_scale=vs, v_zero=vz)


def kivi_attention(q, kivi, attend):
    b, h, s, dp = kivi["v_codes"].shape
    d = 2 * dp
    kc = quant.unpack(kivi["k_codes"], 4).reshape(b, h, -1, KIVI_GROUP, d)
    k = quant.dequantize_channels(kc, kivi["k_scale"], kivi["k_zero"]).reshape(b, h, -1, d)[:, :, :s]
    v = quant.dequantize_tokens(quant.unpack(kivi["v_codes"], 4), kivi["v_scale"], kivi["v_zero"], 4)
    k = jnp.swapaxes(k.astype(jnp.bfloat16), 1, 2)
    v = jnp.swapaxes(v.astype(jnp.bfloat16), 1, 2)
    return attend(q, k, v)


def kivi_bytes(kivi) -> int:
    return int(sum(x.size * x.dtype.itemsize for x in kivi.values()))


# ----------------------------------------------------------------------------- measuring

def loop_iters(context, batch):
    return 2 if INTERPRET else int(max(20, min(400, 4e6 / (context * batch))))


def measure(fn, q, operands, iters, reps):
    try:
        return {"loop_ms": 1e3 * time_in_loop(fn, q, operands, iters, reps),
                "call_ms": 1e3 * time_per_call(fn, q, operands, reps=max(10, 3 * reps))}
    except Exception as e:  # a baseline that cannot run this shape is reported, not fatal
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}


INTERPRET = jax.default_backend() != "gpu"  # CPU smoke runs only


def hybrid_fn(config, tuning):
    return lambda q, cache: kernel_decode(q, cache, config, tuning=tuning, interpret=INTERPRET)[0]


def check_hybrid(inp: Inputs, config, tuning) -> float:
    ref, _ = hybrid_decode_attention_reference(inp.q.astype(jnp.float32), inp.cache, config)
    out, _ = kernel_decode(inp.q, inp.cache, config, tuning=tuning, interpret=INTERPRET)
    out = np.asarray(out, np.float32)
    if not np.all(np.isfinite(out)):
        return float("nan")
    return float(np.linalg.norm(out - np.asarray(ref)) / np.linalg.norm(np.asarray(ref)))


def _run_tuning(inp: Inputs, config, t: DecodeTuning, iters, reps, rows, log) -> float:
    """Time one tuning in the loop; append a row (or the error) to `rows`; return ms (inf on error)."""
    try:
        r = {"loop_ms": 1e3 * time_in_loop(hybrid_fn(config, t), inp.q, (inp.cache,), iters, reps)}
    except Exception as e:
        r = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
    r["n_low"] = decode_layout(inp.cache, config, inp.q.shape[1], t).n_low
    rows.append({"tuning": dataclasses.asdict(t), **r})
    log(f"    sweep {t}: {r}")
    return r.get("loop_ms", float("inf"))


def sweep(inp: Inputs, config, iters, reps, log) -> tuple[DecodeTuning, list]:
    """Search at one shape: conversion, then pages per tile x warps x stages, then splits.

    Variants that give the same kernel layout as one already timed are skipped
    (e.g. None and the explicit value the heuristic would pick).
    """
    rows, seen = [], set()

    def run(t: DecodeTuning) -> float:
        key = (decode_layout(inp.cache, config, inp.q.shape[1], t), t.num_warps, t.num_stages)
        if key in seen:
            return float("inf")
        seen.add(key)
        return _run_tuning(inp, config, t, iters, reps, rows, log)

    base = DecodeTuning()
    best, best_ms = base, run(base)
    variants = [dataclasses.replace(base, convert=c) for c in ("magic", "cast")]
    variants += [dataclasses.replace(base, pages_per_tile=p, num_warps=w, num_stages=st)
                 for p in (1, 2, 4) for w in (2, 4) for st in (2, 3, 4)]
    for t in variants:
        if (ms := run(t)) < best_ms:
            best, best_ms = t, ms
    n_low = decode_layout(inp.cache, config, inp.q.shape[1], best).n_low
    for n in (max(1, n_low // 2), n_low * 2):
        t = dataclasses.replace(best, n_low=n)
        if (ms := run(t)) < best_ms:
            best, best_ms = t, ms
    return best, rows


TUNING_KEYS = {"warps": "num_warps", "stages": "num_stages", "pages": "pages_per_tile", "n_low": "n_low",
               "n_vl": "n_vl", "convert": "convert", "low": "low_bit", "mosaic_per_sm": "mosaic_blocks_per_sm",
               "mosaic_stages": "mosaic_stages", "mosaic_splits": "mosaic_splits"}
STRING_KEYS = ("convert", "low")


def select_cases(spec: str, cases=DECODE_CASES) -> list:
    """Cases named by a comma-separated spec: every case containing an item, and for an item 'B<b> <n>K'
    that names none, the Qwen3-8B heads at that batch and context (e.g. 'B25 32K'). Empty spec: all cases."""
    if not spec.strip():
        return list(cases)
    out = []
    for item in filter(None, (x.strip() for x in spec.split(","))):
        found = [c for c in cases if item in c[0]]
        shape = re.fullmatch(r"B(\d+) (\d+)K", item)
        if not found and shape and int(shape[1]) > 0 and int(shape[2]) > 0:
            found = [qwen3_8b_case(int(shape[1]), int(shape[2]) * 1024, f"qwen3-8b {item}")]
        if not found:
            raise ValueError(f"--cases: {item!r} names no case (known: {[c[0] for c in cases]}; or 'B<batch> <n>K')")
        out += [c for c in found if c not in out]
    return out


def parse_tunings(spec: str) -> list[DecodeTuning]:
    """'warps=1,pages=1;warps=2' -> [DecodeTuning(num_warps=1, pages_per_tile=1), DecodeTuning(num_warps=2)].

    An empty item is the default tuning. Keys: warps, stages, pages, n_low, n_vl, convert, low (the low-bit
    kernel: mosaic or triton), mosaic_per_sm, mosaic_stages, mosaic_splits.
    """
    out = []
    for item in spec.split(";"):
        fields = {}
        for kv in filter(None, (x.strip() for x in item.split(","))):
            key, _, value = kv.partition("=")
            if key not in TUNING_KEYS or not value:
                raise ValueError(f"--compare-tunings: bad item {kv!r}; expected key=value with key in "
                                 f"{sorted(TUNING_KEYS)}")
            fields[TUNING_KEYS[key]] = value if key in STRING_KEYS else int(value)
        out.append(DecodeTuning(**fields))
    return out


def compare_tunings(cases, tunings, reps, log) -> list:
    """Time every tuning on every case in one process; each row has loop_ms and the error vs the reference."""
    out = []
    for name, b, hq_, hkv, d, s in cases:
        inp = make_inputs(b, hq_, hkv, d, s, DECODE_CONFIG)
        rows = []
        for t in tunings:
            _run_tuning(inp, DECODE_CONFIG, t, loop_iters(s, b), reps, rows, log)
            if "error" not in rows[-1]:
                rows[-1]["rel_err_vs_reference"] = check_hybrid(inp, DECODE_CONFIG, t)
        out.append({"case": name, "rows": rows})
        del inp
    return out


def split_sweep(batches, context, reps, log) -> list:
    """Low-bit splits per KV head (n_low) against batch size at one context, Qwen3-8B heads.

    The heuristic's choice is timed first, then fixed n_low values; cudnn bf16
    gives the scale. Answers: which n_low is best at each batch?
    """
    out = []
    heads, kv_heads, head_dim = QWEN3_8B_HEADS
    for b in batches:
        inp = make_inputs(b, heads, kv_heads, head_dim, context, DECODE_CONFIG)
        iters = loop_iters(context, b)
        rows = []
        base = DecodeTuning()
        _run_tuning(inp, DECODE_CONFIG, base, iters, reps, rows, log)
        for n in (1, 2, 4, 8, 16, 32):
            if n != rows[0]["n_low"]:
                _run_tuning(inp, DECODE_CONFIG, dataclasses.replace(base, n_low=n), iters, reps, rows, log)
        cudnn = measure(cudnn_attention, inp.q, (inp.k, inp.v), iters, reps)
        out.append({"batch": b, "context": context, "heuristic_n_low": rows[0]["n_low"], "rows": rows,
                    "cudnn_loop_ms": cudnn.get("loop_ms"),
                    "bytes": {"bf16": b * context * kv_heads * head_dim * 4,
                              "hybrid": int(np.sum(inp.cache.used_bytes(DECODE_CONFIG)))}})
        log(f"  split sweep B{b}: {out[-1]}")
        del inp
    return out


def run_case(name, batch, q_heads, kv_heads, head_dim, context, tuning, reps, log, schemes=False):
    inp = make_inputs(batch, q_heads, kv_heads, head_dim, context, DECODE_CONFIG)
    iters = loop_iters(context, batch)
    bf16_bytes = batch * context * kv_heads * head_dim * 2 * 2
    hybrid_bytes = int(np.sum(inp.cache.used_bytes(DECODE_CONFIG)))
    row = {"case": name, "batch": batch, "heads": [q_heads, kv_heads], "head_dim": head_dim, "context": context,
           "tuning": dataclasses.asdict(tuning), "bytes": {"bf16": bf16_bytes, "hybrid": hybrid_bytes,
                                                          "kivi4": kivi_bytes(inp.kivi)}}
    row["hybrid_rel_err_vs_reference"] = check_hybrid(inp, DECODE_CONFIG, tuning)
    bf16_ops = (inp.q, (inp.k, inp.v))
    row["hybrid"] = measure(hybrid_fn(DECODE_CONFIG, tuning), inp.q, (inp.cache,), iters, reps)
    row["low_bit_kernel"] = plan(inp.cache, DECODE_CONFIG, q_heads, tuning, interpret=INTERPRET).low_bit
    if row["low_bit_kernel"] == "mosaic":  # the Triton kernel alone, on the same cache, for the comparison
        triton = dataclasses.replace(tuning, low_bit="triton")
        row["hybrid_triton"] = measure(hybrid_fn(DECODE_CONFIG, triton), inp.q, (inp.cache,), iters, reps)
        row["hybrid_triton"]["rel_err_vs_reference"] = check_hybrid(inp, DECODE_CONFIG, triton)
    row["cudnn"] = measure(cudnn_attention, *bf16_ops, iters, reps)
    row["xla"] = measure(xla_attention, *bf16_ops, iters, reps)
    pallas = [measure(lambda q, k, v, s=s: pallas_attention(q, k, v, s), *bf16_ops, iters, reps) for s in (16, 64)]
    row["pallas"] = min(pallas, key=lambda r: r.get("loop_ms", float("inf")))
    kivi_attend = cudnn_attention if "loop_ms" in row["cudnn"] else xla_attention
    row["kivi4"] = measure(lambda q, kv: kivi_attention(q, kv, kivi_attend), inp.q, (inp.kivi,), iters, reps)
    if schemes:
        for scheme in sorted({"token_sym", "token_asym", "channel_key"} - {DECODE_CONFIG.scheme}):
            cfg = dataclasses.replace(DECODE_CONFIG, scheme=scheme)
            sinp = make_inputs(batch, q_heads, kv_heads, head_dim, context, cfg)
            row[f"hybrid_{scheme}"] = measure(hybrid_fn(cfg, tuning), sinp.q, (sinp.cache,), iters, reps)
            row[f"hybrid_{scheme}"]["bytes"] = int(np.sum(sinp.cache.used_bytes(cfg)))
            row[f"hybrid_{scheme}"]["rel_err_vs_reference"] = check_hybrid(sinp, cfg, tuning)
    best = min((row[m]["loop_ms"], m) for m in ("cudnn", "xla", "pallas") if "loop_ms" in row[m])
    row["best_bf16"] = best[1]
    for m in ("hybrid", "hybrid_triton", "kivi4"):
        if "loop_ms" in row.get(m, {}):
            row[m]["speedup_vs_best_bf16"] = best[0] / row[m]["loop_ms"]
    for m, nbytes in (("hybrid", hybrid_bytes), ("cudnn", bf16_bytes), ("xla", bf16_bytes), ("pallas", bf16_bytes)):
        if "loop_ms" in row[m]:
            row[m]["tb_per_s"] = nbytes / (row[m]["loop_ms"] * 1e-3) / 1e12
    del inp
    return row


def table(rows) -> str:
    lines = [f"{'case':<20} {'hybrid':>9} {'triton':>9} {'cudnn':>9} {'pallas':>9} {'xla':>9} {'kivi4':>9} "
             f"{'speedup':>8} {'hyb TB/s':>9} {'err':>8}"]
    for r in rows:
        def ms(m):
            return f"{r[m]['loop_ms']:.4f}" if "loop_ms" in r.get(m, {}) else "n/a"
        sp = r["hybrid"].get("speedup_vs_best_bf16", float("nan"))
        tb = r["hybrid"].get("tb_per_s", float("nan"))
        lines.append(f"{r['case']:<20} {ms('hybrid'):>9} {ms('hybrid_triton'):>9} {ms('cudnn'):>9} "
                     f"{ms('pallas'):>9} {ms('xla'):>9} {ms('kivi4'):>9} {sp:>7.2f}x {tb:>9.2f} "
                     f"{r['hybrid_rel_err_vs_reference']:>8.1e}")
    return "\n".join(lines)


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    b1 = [r for r in rows if r["batch"] == 1 and r["heads"] == [32, 8]]
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    ctx = [r["context"] for r in b1]
    for m in ("hybrid", "cudnn", "pallas", "xla", "kivi4"):
        ax[0].plot(ctx, [r[m].get("loop_ms", np.nan) for r in b1], marker="o", label=m)
    if b1:  # a run without B=1 Qwen3 cases (--cases) leaves this panel empty; log axes would fail on it
        ax[0].set(xscale="log", yscale="log")
    ax[0].set(xlabel="context (tokens)", ylabel="ms per call (jitted loop)",
              title="Decode attention, Qwen3-8B heads, B=1")
    ax[0].legend()
    ax[1].bar([r["case"] for r in rows], [r["hybrid"].get("speedup_vs_best_bf16", np.nan) for r in rows])
    ax[1].axhline(3.0, color="r", ls="--", label="target 3x")
    ax[1].set(ylabel="speedup vs best bf16", title="HyQuant kernel speedup")
    ax[1].tick_params(axis="x", rotation=60)
    ax[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


SCHEDULE_OPTION = "xla_gpu_command_buffer_scheduling_mode"


def compare_schedules(cases, modes, reps, log) -> list:
    """Time the hybrid decode (default tuning) and the bf16 baselines under each XLA command-buffer scheduling
    mode (LHS: XLA's default, the thunks' order; CONCURRENT: CUDA-graph nodes ordered only by data
    dependencies, so independent kernels such as the Mosaic low-bit kernel and the Triton VL/ring launch may
    overlap), one process, same inputs."""
    out = []
    for name, b, hq_, hkv, d, s in cases:
        inp = make_inputs(b, hq_, hkv, d, s, DECODE_CONFIG)
        iters = loop_iters(s, b)
        bf16_ops = (inp.q, (inp.k, inp.v))
        fns = {"hybrid": (hybrid_fn(DECODE_CONFIG, DecodeTuning()), inp.q, (inp.cache,)),
               "cudnn": (cudnn_attention, *bf16_ops), "xla": (xla_attention, *bf16_ops),
               "pallas": (pallas_attention, *bf16_ops)}
        row = {"case": name}
        for mode in modes:
            opts = {SCHEDULE_OPTION: mode}
            for method, (fn, q, ops) in fns.items():
                try:
                    row.setdefault(method, {})[mode] = 1e3 * time_in_loop(fn, q, ops, iters, reps,
                                                                          compiler_options=opts)
                except Exception as e:  # noqa: BLE001 (a baseline that cannot run is reported)
                    row.setdefault(method, {})[mode] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        log(f"  schedules {name}: {row}")
        out.append(row)
        del inp
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="directory for the JSON and the plot (default: benchmarks/results; a "
                                                 "temporary folder with --smoke)")
    p.add_argument("--name", default=None, help="file stem of the outputs (default: decode_kernel_<device>)")
    p.add_argument("--cases", default="", help="comma-separated substrings selecting cases (default: all)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--sweep", action="store_true", help="tune the kernel at B1 32K and B16 32K first")
    p.add_argument("--split-sweep", default="", metavar="BATCHES",
                   help="comma-separated batch sizes: time n_low = 1..32 at 32K for each (e.g. 8,16,24,32,48,64)")
    p.add_argument("--compare-tunings", default="", metavar="SPEC",
                   help="only time these kernel tunings on the selected cases, e.g. 'warps=1,pages=1;warps=2;' "
                        "(keys warps, stages, pages, n_low, n_vl, convert; an empty item is the default)")
    p.add_argument("--compare-schedules", default="", metavar="MODES",
                   help="only time the default hybrid and the bf16 baselines under these XLA command-buffer "
                        "scheduling modes, e.g. 'LHS,CONCURRENT' (xla_gpu_command_buffer_scheduling_mode)")
    p.add_argument("--smoke", action="store_true", help="tiny case only (CPU check of the script)")
    p.add_argument("--graph-compare", action="store_true",
                   help="re-run B1 1K/4K/32K in a subprocess with XLA command buffers (CUDA graphs) disabled")
    args = p.parse_args(argv)
    log = lambda s: print(s, flush=True)  # noqa: E731
    env = environment()
    log(f"{env}")
    args.out = output_folder(args.out, args.smoke)
    args.name = args.name or default_name("decode_kernel")
    selected = select_cases(args.cases, DECODE_SMOKE_CASES if args.smoke else DECODE_CASES)
    probe = read_bandwidth(4 << 20 if args.smoke else 2 << 30, iters=2 if args.smoke else 20)
    result = {"env": env, "config": dataclasses.asdict(DECODE_CONFIG), "read_bandwidth_tb_s": probe["best"],
              "read_bandwidth": probe}
    log(f"read bandwidth {probe['best']:.2f} TB/s (best of {probe['tb_s']})")

    if args.compare_tunings:
        try:
            tunings = parse_tunings(args.compare_tunings)
        except ValueError as e:
            p.error(str(e))
        result["tuning_compare"] = compare_tunings(selected, tunings, args.reps, log)
        write_json(os.path.join(args.out, args.name + ".json"), result)
        return
    if args.compare_schedules:
        modes = [m.strip() for m in args.compare_schedules.split(",") if m.strip()]
        result["schedule_compare"] = compare_schedules(selected, modes, args.reps, log)
        write_json(os.path.join(args.out, args.name + ".json"), result)
        return
    tunings = {}
    if args.sweep:
        result["sweep"] = {}
        shapes = [("B1 1K smoke", 1, 8, 2, 64, 1024)] if args.smoke else [
            qwen3_8b_case(1, 32768, "B1 32K"), qwen3_8b_case(16, 32768, "B16 32K")]
        for name, b, hq_, hkv, d, s in shapes:
            inp = make_inputs(b, hq_, hkv, d, s, DECODE_CONFIG)
            best, rows = sweep(inp, DECODE_CONFIG, 2 if args.smoke else loop_iters(s, b), 3, log)
            tunings[b] = best
            result["sweep"][name] = {"best": dataclasses.asdict(best), "rows": rows}
            del inp
    if args.split_sweep:
        batches = [int(x) for x in args.split_sweep.split(",") if x.strip()]
        result["split_sweep"] = split_sweep(batches, 1024 if args.smoke else 32768, 3, log)
    rows = []
    for name, b, hq_, hkv, d, s in selected:
        tuning = tunings.get(1 if b < 8 else 16, DecodeTuning())
        log(f"case {name} ...")
        rows.append(run_case(name, b, hq_, hkv, d, s, tuning, args.reps, log, schemes=(name == "qwen3-8b B1 32K")))
        log(f"  {rows[-1]}")
    result["cases"] = rows
    if args.graph_compare:
        # jax 0.11.2's XLA rejects the --legacy_command_buffer_custom_call_targets flag (Unknown flag):
        # Triton custom calls are captured into command buffers (CUDA graphs) by default since openxla/xla#30765.
        # So the comparison runs the same cases with command buffers switched off.
        env_vars = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_command_buffer="))
        sub = module_command("benchmarks.decode_kernel", "--out", args.out, "--name", args.name + "_no_cmdbuf",
                             "--cases", "B1 1K,B1 4K,B1 32K", "--reps", str(args.reps))
        log("command-buffer compare: XLA_FLAGS=--xla_gpu_enable_command_buffer= " + " ".join(sub))
        subprocess.run(sub, env=module_env(env_vars), check=False)
        import json
        try:
            with open(os.path.join(args.out, args.name + "_no_cmdbuf.json")) as f:
                result["without_command_buffers"] = json.load(f)["cases"]
        except OSError as e:
            result["without_command_buffers"] = {"error": str(e)}
    write_json(os.path.join(args.out, args.name + ".json"), result)
    try:
        plot(rows, os.path.join(args.out, args.name + ".png"))
    except Exception as e:  # plotting must not lose the measurements
        log(f"plot failed: {e}")
    log(table(rows))


if __name__ == "__main__":
    run_script(main)
