"""Prefill attention benchmark: the HyQuant hybrid Pallas kernel vs bf16 baselines, one process.

Same random inputs for every method (q, k, v ~ N(0, 1) with per-channel key
offsets, a few outlier key channels, and planted heavy columns that most
queries attend to: the regime where VL tokens matter), B=1, Hq/Hkv=32/8, D=128:

  hybrid_int8         the HyQuant kernel, INT8 Q.K in the quantized segment (glue included)
  hybrid_fp8          the same with FP8 e4m3 Q.K
  hybrid_int8_pvfp8   INT8 Q.K and FP8 P.V in the quantized segment
  hybrid_fp8_pvfp8    FP8 Q.K and FP8 P.V
  uniform_int8        same kernel, VL and window off: SageAttention-style INT8 Q.K everywhere
  hybrid_int8_kernel  the hybrid INT8 kernel alone (glue excluded)
  hybrid_int8_mgpu    the same attention through the Mosaic GPU kernel (pallas_kernels/prefill_mgpu.py:
                      warp-specialized, TMA, wgmma): one compute warpgroup of 64 rows, 64-key steps
  hybrid_int8_mgpu_2wg      two compute warpgroups (128 rows) sharing 128-key steps, taking turns (ping-pong)
  hybrid_int8_mgpu_2wg_nopp the same without ping-pong
  hybrid_int8_mgpu_2wg_masked   no ping-pong, a mask on every key step (not only the partial ones)
  hybrid_int8_mgpu_2wg_approx   no ping-pong, approximate exp2 (approx_math)
  hybrid_int8_mgpu_2wg_magic    no ping-pong, int32 Q.K dots to float by an add and a subtract (magic_convert)
  hybrid_int8_mgpu_2wg_fast     no ping-pong, approx_math and magic_convert
  hybrid_int8_mgpu_2wg_fast_pp  ping-pong, approx_math and magic_convert: the backend="mosaic" setting
  hybrid_int8_mgpu_2wg_kv64 two compute warpgroups, 64-key steps, 3 steps in SMEM
  hybrid_int8_mgpu_kernel   the Mosaic GPU kernel alone in the backend="mosaic" setting (glue excluded)
  hybrid_e2e_mosaic   hyquant_jax.prefill_attention(backend="mosaic"): VTI + glue + kernel
  hybrid_e2e          hyquant_jax.prefill_attention(backend="triton"): VTI + glue + kernel
  vti                 tail queries + vertical_token_identification alone
  cudnn_bf16          jax.nn.dot_product_attention(implementation="cudnn", is_causal=True)
  cudnn_fp8           cuDNN's FP8 flash attention through JAX (q, k, v e4m3 with one scale each, FP8 P and output,
                      causal; K/V repeated to Hq), quantization and dequantization included
  cudnn_fp8_kernel    the same on inputs quantized outside the timing
  hybrid_int8_mgpu_pvfp8        the backend="mosaic" setting with FP8 P.V over the quantized segment
  hybrid_int8_mgpu_kernel_pvfp8 that kernel alone (glue excluded)
  hybrid_e2e_mosaic_pvfp8       VTI + glue + that kernel
  pallas_mha_bf16     jax.experimental.pallas.ops.gpu.attention.mha (K/V repeated to Hq outside the timing)

Times: `loop_ms` is the median time per call inside a jitted fori_loop whose
iterations depend on each other (each output feeds one element of the next
inputs, so XLA can neither hoist the glue nor overlap calls); `call_ms` is
the median of single calls from Python with block_until_ready. Accuracy:
relative MSE (sum (o - e)^2 / sum e^2 over all rows) of each method's output
against float32 exact causal attention, per length and per synthetic "layer"
(inputs with different heavy-column and outlier strengths, like the paper's
Fig. 5), and the ratio MSE(uniform_int8) / MSE(hybrid). Real q/k/v captured
from a model can be given with --qkv-npz (arrays q0, k0, v0, q1, ...;
q [B, Hq, T, D], k/v [B, Hkv, T, D]).

Also in the same run: a correctness check of the compiled kernel against the
jnp references at one small ragged shape (relative error, NaN check), and a
small block_q / block_k / num_warps / num_stages sweep at one length, whose
best setting is used for all kernel variants.

On a GPU, from the repo root (writes benchmarks/results/prefill_kernel_<device>.json and .png):
  python -m benchmarks.prefill_kernel
CPU check that the script runs (interpret mode, tiny shapes, into a temporary folder):
  python -m benchmarks.prefill_kernel --smoke
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
import traceback
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from benchmarks.cases import QWEN3_8B_HEADS
from benchmarks.common import (
    call_seconds,
    default_name,
    environment,
    output_folder,
    pallas_triton_op,
    run_script,
    timed,
    write_json,
)
from benchmarks.trace import breakdown, profiled
from hyquant_jax import prefill_launch as pk
from hyquant_jax import reference, vti
from hyquant_jax.attention import prefill_attention
from hyquant_jax.config import HyQuantConfig
from hyquant_jax.prefill_launch import PrefillTuning
from pallas_kernels import prefill_mgpu as mgpu

pallas_attention = pallas_triton_op("attention")  # JAX's Pallas Triton attention, the `pallas_mha_bf16` baseline

TRACE_TOP = 20  # kernels listed per traced method
# prefill_block 128 so that kernel block_q 64 and 128 have the same semantics (sweep).
CONFIG = HyQuantConfig(window=128, prefill_block=128, rho=0.05)
SWEEP = [  # (block_q, block_k, num_warps, num_stages)
    (64, 64, 4, 2), (64, 64, 4, 3), (128, 64, 8, 2), (128, 64, 8, 3), (128, 128, 8, 2), (128, 32, 8, 3),
]
MHA_SWEEP = [(128, 64, 8, 2), (128, 128, 8, 2)]
LAYERS = [  # synthetic "layers" for the per-layer accuracy table: (name, heavy strength, outlier gain)
    ("no heavy cols", 0.0, 1.0), ("heavy 15", 15.0, 1.0), ("heavy 30", 30.0, 1.0),
    ("heavy 30 + outliers x4", 30.0, 4.0), ("heavy 45 + outliers x8", 45.0, 8.0), ("outliers x8", 0.0, 8.0),
]


# ----------------------------------------------------------------------------- environment / IO

def log(*args):
    print(*args, flush=True)


# ----------------------------------------------------------------------------- inputs

def make_inputs(seed, b, hq, hkv, t, d, heavy=30.0, outlier=4.0, heavy_frac=0.005):
    """Random q, k, v (bf16, never zero) with planted heavy columns and outlier key channels."""
    ks = jax.random.split(jax.random.PRNGKey(seed), 8)
    g = hq // hkv
    u = jax.random.normal(ks[0], (hkv, d))
    u = u / jnp.linalg.norm(u, axis=-1, keepdims=True)  # one "sink" direction per KV head
    q = jax.random.normal(ks[1], (b, hq, t, d)) + 2.0 * jnp.repeat(u, g, axis=0)[None, :, None, :]
    k = jax.random.normal(ks[2], (b, hkv, t, d)) + 2.0 * jax.random.normal(ks[3], (1, hkv, 1, d))
    ch = jax.random.choice(ks[4], d, (4,), replace=False)
    k = k.at[..., ch].multiply(outlier)  # token-varying outlier channels: hurt per-token int8
    n_heavy = max(4, int(t * heavy_frac))
    pos = jnp.concatenate([jnp.arange(4), jax.random.choice(ks[5], jnp.arange(4, t), (n_heavy - 4,), replace=False)])
    k = k.at[:, :, pos, :].add(heavy * u[None, :, None, :])
    v = jax.random.normal(ks[6], (b, hkv, t, d))
    return tuple(x.astype(jnp.bfloat16) for x in (q, k, v))


@jax.jit
def exact_causal(q, k, v):
    """float32 exact causal GQA attention, chunked over queries. q [B,Hq,T,D]; k, v [B,Hkv,T,D]."""
    b, hq, t, d = q.shape
    hkv = k.shape[1]
    chunk = min(t, 512)
    tp = -(-t // chunk) * chunk
    q = jnp.pad(q, ((0, 0), (0, 0), (0, tp - t), (0, 0)))
    qg = q.astype(jnp.float32).reshape(b, hkv, hq // hkv, tp // chunk, chunk, d).transpose(3, 0, 1, 2, 4, 5)
    k32, v32 = k.astype(jnp.float32), v.astype(jnp.float32)

    def one(args):
        qc, c = args
        logits = jnp.einsum("bhgtd,bhsd->bhgts", qc, k32, precision=lax.Precision.HIGHEST) / math.sqrt(d)
        pos = c * chunk + jnp.arange(chunk)
        logits = jnp.where(jnp.arange(t)[None, :] <= pos[:, None], logits, -jnp.inf)
        p = jax.nn.softmax(logits, axis=-1)
        return jnp.einsum("bhgts,bhsd->bhgtd", p, v32, precision=lax.Precision.HIGHEST)

    out = lax.map(one, (qg, jnp.arange(tp // chunk)))
    return out.transpose(1, 2, 3, 0, 4, 5).reshape(b, hq, tp, d)[:, :, :t]


@jax.jit
def rel_mse(out, exact):
    e = exact.astype(jnp.float32)
    return jnp.sum((out.astype(jnp.float32) - e) ** 2) / jnp.sum(e ** 2)


# ----------------------------------------------------------------------------- timing

def _probe(out):
    if isinstance(out, (tuple, list)):
        return sum(jnp.sum(x.astype(jnp.float32)) for x in jax.tree_util.tree_leaves(out))
    return out[(0,) * out.ndim].astype(jnp.float32)  # a custom call cannot be partially evaluated


def _perturb(a, s):
    if a.dtype not in (jnp.bfloat16, jnp.float16, jnp.float32):
        return a
    return a.at[(0,) * a.ndim].add((s * 1e-9).astype(a.dtype))


def make_loop(fn, arrays):
    """loop(n, arrays) -> (arrays, last output): n dependent calls of fn, n traced (one compile for all n)."""
    out_shape = jax.eval_shape(fn, *arrays)

    @jax.jit
    def loop(n, arrays):
        def body(_, carry):
            arrays, _ = carry
            out = fn(*arrays)
            s = _probe(out)
            return tuple(_perturb(a, s) for a in arrays), out

        init = jax.tree_util.tree_map(lambda x: jnp.zeros(x.shape, x.dtype), out_shape)
        return lax.fori_loop(0, n, body, (arrays, init))

    return loop


def bench(fn, arrays, reps, min_loop_s=0.1, max_iters=50, trace_into: dict | None = None):
    """(loop_ms, call_ms, iters, compile_s, output of one call) of fn(*arrays).

    One compiled program serves both timings (and returns the output for the accuracy check). With a dict
    `trace_into`, one more call runs under the JAX profiler and its GPU kernel breakdown is stored there.
    """
    arrays = tuple(arrays)
    loop = make_loop(fn, arrays)
    one = jnp.int32(1)
    (_, first), compile_s = timed(loop, one, arrays)
    timed(loop, one, arrays)
    call = statistics.median(call_seconds(loop, one, arrays, reps=reps))
    iters = int(min(max_iters, max(3, math.ceil(min_loop_s / max(call, 1e-6)))))
    n = jnp.int32(iters)
    timed(loop, n, arrays)
    loop_s = statistics.median(call_seconds(loop, n, arrays, reps=reps)) / iters
    if trace_into is not None:
        _, _, events = profiled(lambda: jax.block_until_ready(loop(one, arrays)))
        trace_into.update(breakdown(events, 1, TRACE_TOP))
    return loop_s * 1e3, call * 1e3, iters, compile_s, first


# ----------------------------------------------------------------------------- methods

def hybrid_fn(config, tuning, interpret, pv_format="bf16"):
    """tuning: (block_q, block_k, num_warps, num_stages) of the Triton kernel."""
    def fn(q, k, v, lengths, vl_idx, vl_count):
        return pk.prefill_attention(q, k, v, lengths, vl_idx, vl_count, config, interpret=interpret,
                                    pv_format=pv_format, tuning=PrefillTuning(*tuning))

    return fn


# The Mosaic variants below are changes to one compute warpgroup on 64-key steps without the speed options.
ONE_WG = dict(compute_wgs=1, block_kv=64, pingpong=False, approx_math=False, magic_convert=False)


def mgpu_fn(config, interpret, **kernel):
    tuning = PrefillTuning(**{**ONE_WG, **kernel})

    def fn(q, k, v, lengths, vl_idx, vl_count):
        return pk.prefill_attention_mgpu(q, k, v, lengths, vl_idx, vl_count, config, interpret=interpret,
                                         tuning=tuning)

    return fn


def uniform_fn(qk_format, tuning, interpret, pv_format="bf16"):
    def fn(q, k, v, lengths):
        return pk.uniform_prefill_attention(q, k, v, lengths, qk_format, interpret=interpret, pv_format=pv_format,
                                            tuning=PrefillTuning(*tuning))

    return fn


def vti_fn(config):
    def fn(q, k, lengths):
        q_tail = vti.tail_queries(q, lengths, vti.tail_query_count(config))
        return vti.vertical_token_identification(q_tail, k, lengths, config)

    return fn


def cudnn_fn(q_btnd, k_btnd, v_btnd):
    return jax.nn.dot_product_attention(q_btnd, k_btnd, v_btnd, is_causal=True, implementation="cudnn")


def fp8_tensor(x):
    """x -> (float8_e4m3fn codes, float32 [1, 1, 1, 1] scale): one scale for the whole tensor, as cuDNN's FP8
    attention takes its inputs."""
    x = x.astype(jnp.float32)
    scale = jnp.maximum(jnp.max(jnp.abs(x)), 1e-30) / 448.0
    return (x / scale).astype(jnp.float8_e4m3fn), scale.reshape(1, 1, 1, 1)


def cudnn_fp8_kernel_fn(scale):
    """cuDNN's FP8 causal flash attention on quantized [B, T, H, D] inputs with their scales; the FP8 output is
    returned dequantized (bf16)."""
    from jax._src.cudnn import fused_attention_stablehlo as cudnn_attention

    def fn(qq, sq, kq, sk, vq, sv):
        one = jnp.ones((1, 1, 1, 1), jnp.float32)
        params = dict.fromkeys(cudnn_attention.fp8_params_keys, one)
        # P in [0, 1] is stored as P * 448; the output (a convex combination of the values) in the values' scale
        params.update(descale_q=sq, descale_k=sk, descale_v=sv, descale_s=one / 448.0, scale_s=one * 448.0,
                      scale_o=1.0 / sv)
        out, _, _ = cudnn_attention.dot_product_attention(
            qq, kq, vq, fp8_params=params, scale=scale, mask_type=cudnn_attention.MaskType.CAUSAL, use_fp8=True)
        return (out.astype(jnp.float32) * sv).astype(jnp.bfloat16)

    return fn


def cudnn_fp8_fn(scale):
    kernel = cudnn_fp8_kernel_fn(scale)

    def fn(q_btnd, k_btnd, v_btnd):
        return kernel(*fp8_tensor(q_btnd), *fp8_tensor(k_btnd), *fp8_tensor(v_btnd))

    return fn


def mha_fn(tuning, interpret, scale):
    bq, bk, nw, ns = tuning

    def fn(q_btnd, k_rep, v_rep):
        if pallas_attention is None:
            raise NotImplementedError(f"jax {jax.__version__} has no jax.experimental.pallas.ops.gpu.attention")
        return pallas_attention.mha(q_btnd, k_rep, v_rep, None, sm_scale=scale, causal=True,
                                    block_sizes=pallas_attention.BlockSizes(block_q=bq, block_k=bk),
                                    num_warps=nw, num_stages=ns, interpret=interpret)

    return fn


def to_btnd(x):
    return jnp.swapaxes(x, 1, 2)


# ----------------------------------------------------------------------------- sections

def correctness(interpret, tuning=None, shape=(2, 8, 2, 1000, 128), lengths=(1000, 613)):
    """Compiled kernel vs the jnp references at one small ragged shape."""
    b, hq, hkv, t, d = shape
    q, k, v = make_inputs(11, b, hq, hkv, t, d)
    lengths = jnp.asarray(lengths, jnp.int32)
    config = HyQuantConfig(window=128, prefill_block=128 if tuning else 64, rho=0.05)
    kw = {} if tuning is None else dict(tuning=PrefillTuning(*tuning))
    q_tail = vti.tail_queries(q, lengths, vti.tail_query_count(config))
    vl_idx, vl_count = vti.vertical_token_identification(q_tail, k, lengths, config)
    rows = []
    cases = [("hybrid int8", "int8", "bf16", False, 4e-3), ("hybrid fp8", "fp8", "bf16", False, 4e-3),
             ("hybrid int8 + fp8 P.V", "int8", "fp8", False, 2e-2), ("uniform int8", "int8", "bf16", True, 4e-3)]
    for name, fmt, pv, uniform, tol in cases:
        cfg = HyQuantConfig(window=config.window, prefill_block=config.prefill_block, rho=config.rho, prefill_qk=fmt)
        try:
            if uniform:
                ref = reference.uniform_quantized_prefill_reference(q, k, v, lengths, fmt)
                out = pk.uniform_prefill_attention(q, k, v, lengths, fmt, interpret=interpret, pv_format=pv, **kw)
            else:
                ref = reference.hybrid_prefill_attention_reference(q, k, v, lengths, vl_idx, vl_count, cfg)
                out = pk.prefill_attention(q, k, v, lengths, vl_idx, vl_count, cfg, interpret=interpret,
                                           pv_format=pv, **kw)
            o = np.asarray(out, np.float32)
            r = np.asarray(ref, np.float32)
            err = float(np.linalg.norm(o - r) / np.linalg.norm(r))
            pad_zero = bool(np.all(o[1, :, int(lengths[1]):] == 0))
            nan = bool(np.isnan(o).any())
            rows.append(dict(case=name, tuning=tuning, rel_err=err, tol=tol, nan=nan, padded_rows_zero=pad_zero,
                             ok=bool(err < tol and not nan and pad_zero)))
        except Exception as e:  # noqa: BLE001 - report and go on
            rows.append(dict(case=name, tuning=tuning, error=f"{type(e).__name__}: {e}"[:2000], ok=False))
            traceback.print_exc()
        log("correctness", rows[-1])
    return rows


def sweep(t, interpret, reps, b, hq, hkv, d):
    q, k, v = make_inputs(0, b, hq, hkv, t, d)
    lengths = jnp.full((b,), t, jnp.int32)
    vl_idx, vl_count = jax.jit(vti_fn(CONFIG))(q, k, lengths)
    rows = []
    for tuning in SWEEP:
        try:
            loop_ms, call_ms, iters, comp, _ = bench(hybrid_fn(CONFIG, tuning, interpret), (q, k, v, lengths, vl_idx,
                                                                                         vl_count), reps)
            rows.append(dict(method="hybrid_int8", tuning=tuning, loop_ms=loop_ms, call_ms=call_ms, iters=iters,
                             compile_s=comp))
        except Exception as e:  # noqa: BLE001
            rows.append(dict(method="hybrid_int8", tuning=tuning, error=f"{type(e).__name__}: {e}"[:1000]))
        log("sweep", rows[-1])
    scale = 1.0 / math.sqrt(d)
    qt = to_btnd(q)
    kr, vr = (jnp.repeat(to_btnd(x), hq // hkv, axis=2) for x in (k, v))
    for tuning in MHA_SWEEP:
        try:
            loop_ms, call_ms, iters, comp, _ = bench(mha_fn(tuning, interpret, scale), (qt, kr, vr), reps)
            rows.append(dict(method="pallas_mha_bf16", tuning=tuning, loop_ms=loop_ms, call_ms=call_ms, iters=iters,
                             compile_s=comp))
        except Exception as e:  # noqa: BLE001
            rows.append(dict(method="pallas_mha_bf16", tuning=tuning, error=f"{type(e).__name__}: {e}"[:1000]))
        log("sweep", rows[-1])
    return rows


def parse_tuning(spec: str | None) -> tuple[int, ...] | None:
    """'128,64,8,3' -> (128, 64, 8, 3); None or '' -> None."""
    return tuple(int(x) for x in spec.split(",")) if spec else None


def best_tuning(rows, method, default):
    ok = [r for r in rows if r["method"] == method and "loop_ms" in r]
    return tuple(min(ok, key=lambda r: r["loop_ms"])["tuning"]) if ok else default


def run_length(t, tuning, mha_tuning, interpret, reps, b, hq, hkv, d, have_cudnn, only=None, trace=frozenset()):
    q, k, v = make_inputs(0, b, hq, hkv, t, d)
    lengths = jnp.full((b,), t, jnp.int32)
    vl_idx, vl_count = jax.jit(vti_fn(CONFIG))(q, k, lengths)
    scale = 1.0 / math.sqrt(d)
    qt = to_btnd(q)
    kt, vt = to_btnd(k), to_btnd(v)
    kr, vr = (jnp.repeat(x, hq // hkv, axis=2) for x in (kt, vt))
    fp8 = HyQuantConfig(window=CONFIG.window, prefill_block=CONFIG.prefill_block, rho=CONFIG.rho, prefill_qk="fp8")
    hyb_args = (q, k, v, lengths, vl_idx, vl_count)
    kargs, kernel = pk.prepare_kernel_call(q, k, v, lengths, vl_idx, vl_count, CONFIG, interpret=interpret,
                                           tuning=PrefillTuning(*tuning))

    def e2e(q, k, v, lengths):
        q_tail = vti.tail_queries(q, lengths, vti.tail_query_count(CONFIG))
        vl = vti.vertical_token_identification(q_tail, k, lengths, CONFIG)
        return pk.prefill_attention(q, k, v, lengths, *vl, CONFIG, interpret=interpret, tuning=PrefillTuning(*tuning))

    methods = {
        "hybrid_int8": (hybrid_fn(CONFIG, tuning, interpret), hyb_args, True),
        "hybrid_fp8": (hybrid_fn(fp8, tuning, interpret), hyb_args, True),
        "hybrid_int8_pvfp8": (hybrid_fn(CONFIG, tuning, interpret, "fp8"), hyb_args, True),
        "hybrid_fp8_pvfp8": (hybrid_fn(fp8, tuning, interpret, "fp8"), hyb_args, True),
        "uniform_int8": (uniform_fn("int8", tuning, interpret), (q, k, v, lengths), True),
        "hybrid_int8_kernel": (kernel, kargs, False),
        "hybrid_e2e": (e2e, (q, k, v, lengths), False),
        "vti": (vti_fn(CONFIG), (q, k, lengths), False),
        "pallas_mha_bf16": (mha_fn(mha_tuning, interpret, scale), (qt, kr, vr), True),
    }
    if have_cudnn:
        methods["cudnn_bf16"] = (cudnn_fn, (qt, kt, vt), True)
        methods["cudnn_fp8"] = (cudnn_fp8_fn(scale), (qt, kr, vr), True)
        methods["cudnn_fp8_kernel"] = (cudnn_fp8_kernel_fn(scale), (*fp8_tensor(qt), *fp8_tensor(kr),
                                                                    *fp8_tensor(vr)), True)
    if d in mgpu.HEAD_DIMS and (only is None or any(m.startswith("hybrid_int8_mgpu") for m in only)):
        two = dict(compute_wgs=2, block_kv=128, pingpong=True)
        margs, _ = pk.prepare_kernel_call(q, k, v, lengths, vl_idx, vl_count, CONFIG,
                                          tuning=PrefillTuning(block_q=mgpu.BLOCK, block_k=128))
        methods["hybrid_int8_mgpu"] = (mgpu_fn(CONFIG, interpret), hyb_args, True)
        methods["hybrid_int8_mgpu_2wg"] = (mgpu_fn(CONFIG, interpret, **two), hyb_args, True)
        methods["hybrid_int8_mgpu_2wg_nopp"] = (mgpu_fn(CONFIG, interpret, **dict(two, pingpong=False)), hyb_args,
                                                True)
        methods["hybrid_int8_mgpu_2wg_masked"] = (
            mgpu_fn(CONFIG, interpret, **dict(two, pingpong=False, skip_masks=False)), hyb_args, True)
        methods["hybrid_int8_mgpu_2wg_approx"] = (
            mgpu_fn(CONFIG, interpret, **dict(two, pingpong=False, approx_math=True)), hyb_args, True)
        methods["hybrid_int8_mgpu_2wg_magic"] = (
            mgpu_fn(CONFIG, interpret, **dict(two, pingpong=False, magic_convert=True)), hyb_args, True)
        methods["hybrid_int8_mgpu_2wg_fast"] = (
            mgpu_fn(CONFIG, interpret, **dict(two, pingpong=False, approx_math=True, magic_convert=True)),
            hyb_args, True)
        methods["hybrid_int8_mgpu_2wg_fast_pp"] = (mgpu_fn(CONFIG, interpret, **PrefillTuning().mosaic()), hyb_args,
                                                   True)
        methods["hybrid_int8_mgpu_2wg_kv64"] = (mgpu_fn(CONFIG, interpret, compute_wgs=2, block_kv=64, stages=3),
                                                hyb_args, True)
        methods["hybrid_int8_mgpu_kernel"] = (partial(mgpu.hybrid_prefill_mgpu, scale=scale, interpret=interpret,
                                                      **PrefillTuning().mosaic()), margs, False)
        pv_fp8 = PrefillTuning(pv_fp8=True)
        methods["hybrid_int8_mgpu_pvfp8"] = (mgpu_fn(CONFIG, interpret, **pv_fp8.mosaic()), hyb_args, True)
        fargs = margs[:7] + mgpu.fp8_values(margs[7]) + margs[9:]
        methods["hybrid_int8_mgpu_kernel_pvfp8"] = (partial(mgpu.hybrid_prefill_mgpu, scale=scale,
                                                            interpret=interpret, **pv_fp8.mosaic()), fargs, False)

        def e2e_pvfp8(q, k, v, lengths):
            vl = vti_fn(CONFIG)(q, k, lengths)
            return pk.prefill_attention_mgpu(q, k, v, lengths, *vl, CONFIG, interpret=interpret, tuning=pv_fp8)

        methods["hybrid_e2e_mosaic_pvfp8"] = (e2e_pvfp8, (q, k, v, lengths), True)
        if not interpret:
            methods["hybrid_e2e_mosaic"] = (
                lambda q, k, v, lengths: prefill_attention(q, k, v, lengths, CONFIG, backend="mosaic")[0],
                (q, k, v, lengths), False)
    if only is not None:
        methods = {name: m for name, m in methods.items() if name in only}
    exact = exact_causal(q, k, v)
    rows = {}
    for name, (fn, args, accuracy) in methods.items():
        row = dict(T=t)
        kernels = {} if name in trace else None
        try:
            row["loop_ms"], row["call_ms"], row["iters"], row["compile_s"], out = bench(fn, args, reps,
                                                                                         trace_into=kernels)
            if kernels is not None:
                row["trace"] = kernels
            if accuracy:
                if out.shape != q.shape:  # [B, T, H, D] layouts
                    out = to_btnd(out)
                row["rel_mse"] = float(rel_mse(out, exact))
                row["nan"] = bool(jnp.isnan(out.astype(jnp.float32)).any())
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {e}"[:2000]
            traceback.print_exc()
        flops = 4.0 * b * hq * d * t * t / 2  # causal QK + PV
        if "loop_ms" in row and name not in ("vti",):
            row["tflops"] = flops / (row["loop_ms"] * 1e-3) / 1e12
        rows[name] = row
        log(f"T={t}", name, row)
    return rows


def layer_accuracy(t, tuning, interpret, b, hq, hkv, d, npz=None):
    """Per-'layer' relative MSE of uniform int8 vs hybrid variants (paper Fig. 5 style)."""
    layers = []
    if npz:
        data = np.load(npz)
        i = 0
        while f"q{i}" in data:
            layers.append((f"layer {i}", *(jnp.asarray(data[f"{n}{i}"], jnp.bfloat16) for n in "qkv")))
            i += 1
    else:
        for j, (name, heavy, outlier) in enumerate(LAYERS):
            layers.append((name, *make_inputs(100 + j, b, hq, hkv, t, d, heavy=heavy, outlier=outlier)))
    fp8 = HyQuantConfig(window=CONFIG.window, prefill_block=CONFIG.prefill_block, rho=CONFIG.rho, prefill_qk="fp8")
    fns = {
        "hybrid_int8": hybrid_fn(CONFIG, tuning, interpret),
        "hybrid_fp8": hybrid_fn(fp8, tuning, interpret),
        "hybrid_int8_pvfp8": hybrid_fn(CONFIG, tuning, interpret, "fp8"),
        "hybrid_fp8_pvfp8": hybrid_fn(fp8, tuning, interpret, "fp8"),
    }
    rows = []
    for name, q, k, v in layers:
        lengths = jnp.full((q.shape[0],), q.shape[2], jnp.int32)
        vl = jax.jit(vti_fn(CONFIG))(q, k, lengths)
        exact = exact_causal(q, k, v)
        row = dict(layer=name, T=int(q.shape[2]))
        try:
            row["uniform_int8"] = float(rel_mse(uniform_fn("int8", tuning, interpret)(q, k, v, lengths), exact))
            for m, fn in fns.items():
                row[m] = float(rel_mse(fn(q, k, v, lengths, *vl), exact))
                row[f"ratio_uniform_over_{m}"] = row["uniform_int8"] / max(row[m], 1e-30)
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {e}"[:2000]
            traceback.print_exc()
        rows.append(row)
        log("layer", row)
    return rows


# ----------------------------------------------------------------------------- report

def summarize(results, lengths):
    s = {}
    for t in lengths:
        r = results.get(str(t), {})

        def ms(name):
            return r.get(name, {}).get("loop_ms")

        row = {}
        for name in r:
            if name.startswith(("hybrid", "uniform")) and ms(name):
                if ms("cudnn_bf16"):
                    row[f"{name}_speedup_vs_cudnn"] = ms("cudnn_bf16") / ms(name)
                if ms("pallas_mha_bf16"):
                    row[f"{name}_speedup_vs_mha"] = ms("pallas_mha_bf16") / ms(name)
        if ms("vti") and ms("hybrid_int8"):
            row["vti_share_of_prefill"] = ms("vti") / (ms("vti") + ms("hybrid_int8"))
        if ms("vti") and ms("hybrid_e2e_mosaic"):
            row["vti_share_of_mosaic_prefill"] = ms("vti") / ms("hybrid_e2e_mosaic")
        if ms("hybrid_int8_kernel") and ms("hybrid_int8"):
            row["glue_share_of_hybrid"] = 1.0 - ms("hybrid_int8_kernel") / ms("hybrid_int8")
        u = r.get("uniform_int8", {}).get("rel_mse")
        for name in r:
            h = r[name].get("rel_mse") if name.startswith("hybrid") else None
            if u and h:
                row[f"mse_ratio_uniform_over_{name}"] = u / h
        s[str(t)] = row
    return s


def plot(results, lengths, layers, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(18, 5))
    names = ["hybrid_int8", "hybrid_fp8", "hybrid_int8_pvfp8", "hybrid_fp8_pvfp8", "uniform_int8", "cudnn_bf16",
             "pallas_mha_bf16", "hybrid_e2e", "hybrid_int8_mgpu", "hybrid_int8_mgpu_2wg",
             "hybrid_int8_mgpu_2wg_fast_pp", "hybrid_e2e_mosaic"]
    for name in names:
        xs = [t for t in lengths if results.get(str(t), {}).get(name, {}).get("loop_ms")]
        if xs:
            axes[0].plot(xs, [results[str(t)][name]["loop_ms"] for t in xs], marker="o", label=name)
    axes[0].set(xscale="log", yscale="log", xlabel="T (tokens)", ylabel="ms per call (in-jit loop)",
                title="Causal prefill attention, B1 Hq32 Hkv8 D128")
    axes[0].set_xticks(lengths, [f"{t // 1024}K" for t in lengths])
    axes[0].legend(fontsize=7)
    for name in names[:5] + ["pallas_mha_bf16", "hybrid_int8_mgpu", "hybrid_int8_mgpu_2wg",
                             "hybrid_int8_mgpu_2wg_fast_pp", "hybrid_e2e_mosaic"]:
        xs = [t for t in lengths if results.get(str(t), {}).get(name, {}).get("loop_ms")
              and results[str(t)].get("cudnn_bf16", {}).get("loop_ms")]
        if xs:
            axes[1].plot(xs, [results[str(t)]["cudnn_bf16"]["loop_ms"] / results[str(t)][name]["loop_ms"]
                              for t in xs], marker="o", label=name)
    axes[1].axhline(1.0, color="k", lw=0.8, ls="--")
    axes[1].set(xscale="log", xlabel="T (tokens)", ylabel="speedup vs cuDNN bf16", title="Speed vs cuDNN bf16")
    axes[1].set_xticks(lengths, [f"{t // 1024}K" for t in lengths])
    axes[1].legend(fontsize=7)
    ok = [r for r in layers if "uniform_int8" in r]
    if ok:
        x = np.arange(len(ok))
        width = 0.2
        for i, m in enumerate(["hybrid_int8", "hybrid_fp8", "hybrid_int8_pvfp8", "hybrid_fp8_pvfp8"]):
            axes[2].bar(x + (i - 1.5) * width, [r[f"ratio_uniform_over_{m}"] for r in ok], width, label=m)
        axes[2].axhline(5.0, color="k", lw=0.8, ls="--")
        axes[2].set_xticks(x, [r["layer"] for r in ok], rotation=30, ha="right", fontsize=7)
        axes[2].set(yscale="log", ylabel="MSE(uniform int8) / MSE(method)",
                    title=f"Accuracy vs fp32 exact (T={ok[0]['T']})")
        axes[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def print_table(payload, lengths):
    log("\n=== correctness (compiled kernel vs jnp reference) ===")
    for r in payload["correctness"]:
        log(f"  {r['case']:<24} tuning={r.get('tuning')} rel_err={r.get('rel_err', float('nan')):.2e} "
            f"nan={r.get('nan')} ok={r['ok']} {r.get('error', '')[:200]}")
    if payload["sweep"]:
        log(f"\n=== block sweep (T={payload['sweep_length']}) ===")
        for r in payload["sweep"]:
            log(f"  {r['method']:<16} {str(r['tuning']):<18} loop_ms={r.get('loop_ms', float('nan')):8.3f} "
                f"compile_s={r.get('compile_s', float('nan')):5.1f} {r.get('error', '')[:120]}")
        log(f"  best hybrid tuning: {payload['tuning']}, best mha tuning: {payload['mha_tuning']}")
    if payload["layers"]:
        log("\n=== per-layer accuracy: relative MSE vs fp32 exact ===")
        log(f"  {'layer':<24} {'uniform_int8':>12} {'hyb_int8':>10} {'hyb_fp8':>10} {'int8+pv8':>10} "
            f"{'fp8+pv8':>10} {'ratio(u/int8)':>13}")
        for r in payload["layers"]:
            if "uniform_int8" in r:
                log(f"  {r['layer']:<24} {r['uniform_int8']:12.3e} {r['hybrid_int8']:10.3e} {r['hybrid_fp8']:10.3e} "
                    f"{r['hybrid_int8_pvfp8']:10.3e} {r['hybrid_fp8_pvfp8']:10.3e} "
                    f"{r['ratio_uniform_over_hybrid_int8']:13.1f}")
    log("\n=== speed and accuracy per length (loop_ms: in-jit loop, call_ms: per call) ===")
    log(f"  {'T':>6} {'method':<20} {'loop_ms':>9} {'call_ms':>9} {'TFLOP/s':>8} {'rel_mse':>10}")
    for t in lengths:
        for name, r in payload["results"].get(str(t), {}).items():
            if "error" in r:
                log(f"  {t:>6} {name:<20} ERROR {r['error'][:100]}")
                continue
            log(f"  {t:>6} {name:<20} {r['loop_ms']:9.3f} {r['call_ms']:9.3f} {r.get('tflops', float('nan')):8.1f} "
                f"{r.get('rel_mse', float('nan')):10.3e}")
    log("\n=== summary ===")
    for t, row in payload["summary"].items():
        log(f"  T={t}: " + ", ".join(f"{k}={v:.3g}" for k, v in row.items()))


# ----------------------------------------------------------------------------- main

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="folder for the JSON and the PNG (default: benchmarks/results; a "
                                                "temporary folder with --smoke)")
    ap.add_argument("--lengths", type=int, nargs="*", default=[4096, 8192, 16384, 32768])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--sweep-length", type=int, default=8192)
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--layer-length", type=int, default=4096, help="T of the per-layer accuracy table")
    ap.add_argument("--qkv-npz", default=None, help="real per-layer q/k/v (q0, k0, v0, q1, ...) for accuracy")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes in interpret mode (CPU check of the script)")
    ap.add_argument("--methods", default=None, help="comma-separated subset of the timed methods (default: all)")
    ap.add_argument("--no-layers", action="store_true", help="skip the per-layer accuracy table")
    ap.add_argument("--name", default=None, help="JSON/PNG file name without extension (default: "
                                                 "prefill_kernel_<device>)")
    ap.add_argument("--mha-tuning", default=None,
                    help="Pallas mha block_q,block_k,num_warps,num_stages instead of the sweep's best (without a "
                         "sweep the default is 128,64,8,2; 128,128,8,2 was 1.16x faster at 8K in the H200's "
                         "sweep)")
    ap.add_argument("--trace", default="", metavar="METHODS",
                    help="comma-separated methods whose one call is also profiled: GPU kernel breakdown in the JSON")
    ap.add_argument("--tuning", default=None,
                    help="Triton kernel block_q,block_k,num_warps,num_stages instead of the sweep's best")
    args = ap.parse_args(argv)
    args.out = output_folder(args.out, args.smoke)
    args.name = args.name or default_name("prefill_kernel")
    json_path = os.path.join(args.out, args.name + ".json")

    interpret = args.smoke or jax.default_backend() != "gpu"
    b, (hq, hkv, d) = 1, ((4, 2, 64) if args.smoke else QWEN3_8B_HEADS)
    lengths = [256] if args.smoke else args.lengths
    reps = 2 if args.smoke else args.reps
    have_cudnn = jax.default_backend() == "gpu"
    global SWEEP, MHA_SWEEP
    if args.smoke:
        SWEEP, MHA_SWEEP = SWEEP[:2], MHA_SWEEP[-1:]
    only = None if args.methods is None else set(args.methods.split(","))
    env = environment()
    log("environment", env)
    t_start = time.perf_counter()

    payload = dict(env, config=dict(window=CONFIG.window, prefill_block=CONFIG.prefill_block, rho=CONFIG.rho),
                   shape=dict(B=b, Hq=hq, Hkv=hkv, D=d), lengths=lengths, reps=reps, interpret=interpret)
    default = pk.default_blocks(d, CONFIG.prefill_block)
    small = (2, 4, 2, 300, 64) if args.smoke else (2, 8, 2, 1000, 128)
    payload["correctness"] = correctness(interpret, None, small, (small[3], small[3] * 3 // 5))
    payload["sweep_length"] = 256 if args.smoke else args.sweep_length
    payload["sweep"] = [] if args.no_sweep else sweep(payload["sweep_length"], interpret, reps, b, hq, hkv, d)
    payload["tuning"] = parse_tuning(args.tuning) or best_tuning(payload["sweep"], "hybrid_int8", default)
    payload["mha_tuning"] = (parse_tuning(args.mha_tuning)
                             or best_tuning(payload["sweep"], "pallas_mha_bf16", (128, 64, 8, 2)))
    if payload["tuning"] != default:
        payload["correctness"] += correctness(interpret, payload["tuning"], small, (small[3], small[3] * 3 // 5))

    def save(complete):
        """Write the JSON so far: a run cut off by a time limit keeps the lengths it finished."""
        payload["complete"] = complete
        payload["summary"] = summarize(payload["results"], [t for t in lengths if str(t) in payload["results"]])
        payload["wall_s"] = time.perf_counter() - t_start
        write_json(json_path, payload, default=str)

    payload["results"] = {}
    for t in lengths:
        payload["results"][str(t)] = run_length(t, payload["tuning"], payload["mha_tuning"], interpret, reps, b, hq,
                                                hkv, d, have_cudnn, only, frozenset(args.trace.split(",")))
        save(complete=False)
    layer_t = 256 if args.smoke else args.layer_length
    payload["layers"] = ([] if args.no_layers else
                         layer_accuracy(layer_t, payload["tuning"], interpret, b, hq, hkv, d, args.qkv_npz))
    save(complete=True)
    png_path = os.path.join(args.out, args.name + ".png")
    try:
        plot(payload["results"], lengths, payload["layers"], png_path)
    except Exception:  # noqa: BLE001 - the numbers matter more than the picture
        traceback.print_exc()
    print_table(payload, lengths)
    log(f"\nwrote {json_path} and {png_path}; wall {payload['wall_s']:.0f} s")


if __name__ == "__main__":
    run_script(main)
