"""Float64 NumPy oracle for the hyquant-jax foundation.

Written from the docstrings of `hyquant_jax` and the HyQuant paper (Algorithms 1
and 4, Eq. 7), independently of the jnp code: this module must never import
`hyquant_jax`. Configs are duck-typed (any object with the `HyQuantConfig`
attribute names works).

Rounding ambiguity. The library computes quantization codes in float32, the
oracle in float64. Where an oracle quotient lies within float32 rounding error
of a rounding boundary (a .5 tie of an integer code, a midpoint of the bf16
grid for a scale, a midpoint of the fp8 grid), the two can legitimately pick
neighbouring values. Every quantizer here therefore also reports

* `code_amb` / `param_amb`: where the library may differ from the oracle, and
* `err`: a per-element bound on |library dequantized - oracle dequantized|
  (0 where nothing is ambiguous),

and the attention functions turn those bounds into a rigorous bound on the
output difference (see `softmax_rows`). Tests then compare with a float32
rounding tolerance plus that bound, which is 0 almost everywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import ml_dtypes
import numpy as np

RHO_MAX_DENOMINATOR = 10_000
BF16 = ml_dtypes.bfloat16
FP8 = ml_dtypes.float8_e4m3fn
FP8_MAX = 448.0

# Relative float32 error budget of a quotient computed in float32 (a few roundings of
# 2**-24 each) with a safety factor of 16: a value this close to a rounding
# boundary is "ambiguous".
AMB_REL = 2.0**-20


# --------------------------------------------------------------------------- VL count


def rho_fraction(rho) -> Fraction:
    """rho as the nearest fraction with denominator <= 10_000 (a positive rho stays positive)."""
    frac = Fraction(rho).limit_denominator(RHO_MAX_DENOMINATOR)
    if frac == 0 and rho > 0:
        frac = Fraction(1, RHO_MAX_DENOMINATOR)
    return frac


def num_vl_tokens(prefix_len: int, rho) -> int:
    """k = min(P, max(1, ceil(P * rho))) for P > 0 and rho > 0, else 0 (Algorithm 1, line 19)."""
    frac = rho if isinstance(rho, Fraction) else rho_fraction(rho)
    if prefix_len <= 0 or frac == 0:
        return 0
    return min(prefix_len, max(1, math.ceil(prefix_len * frac)))


# --------------------------------------------------------------------------- packing


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Element e of a row goes to byte e % Dp, bits [(e // Dp) * bits, (e // Dp + 1) * bits)."""
    codes = np.asarray(codes).astype(np.int64)
    d = codes.shape[-1]
    per_byte = 8 // bits
    assert d % per_byte == 0
    dp = d // per_byte
    out = np.zeros(codes.shape[:-1] + (dp,), np.int64)
    for e in range(d):
        out[..., e % dp] |= codes[..., e] << ((e // dp) * bits)
    assert out.max(initial=0) < 256
    return out.astype(np.uint8)


def unpack(packed: np.ndarray, bits: int) -> np.ndarray:
    packed = np.asarray(packed).astype(np.int64)
    dp = packed.shape[-1]
    d = dp * (8 // bits)
    out = np.zeros(packed.shape[:-1] + (d,), np.int64)
    for e in range(d):
        out[..., e] = (packed[..., e % dp] >> ((e // dp) * bits)) & ((1 << bits) - 1)
    return out


# --------------------------------------------------------------------------- rounding helpers


def bf16(x) -> np.ndarray:
    return np.asarray(x, np.float64).astype(BF16).astype(np.float64)


def fp8(x) -> np.ndarray:
    return np.asarray(x, np.float64).astype(FP8).astype(np.float64)


def _bf16_ambiguous(value: np.ndarray) -> np.ndarray:
    """True where float32 error in computing `value` could change its bf16 rounding."""
    lo = bf16(value * (1 - AMB_REL))
    hi = bf16(value * (1 + AMB_REL))
    return lo != hi


@dataclass
class Quantized:
    """Oracle quantization result; shapes as the library's, all float64/int64."""

    codes: np.ndarray  # int64 [..., D] unsigned codes
    scale: np.ndarray  # float64 (bf16 values) per group
    zero: np.ndarray | None  # float64 (bf16 values) per group, None for symmetric
    xhat: np.ndarray  # float64 dequantized [..., D]
    code_amb: np.ndarray  # bool [..., D]: code may differ by one level
    param_amb: np.ndarray  # bool, like scale: scale may differ by one bf16 step
    err: np.ndarray  # float64 [..., D]: bound on |other implementation's xhat - xhat|


def _group_quant(xg: np.ndarray, bits: int, symmetric: bool, axis: int, valid=None):
    """Quantize x (float64) with one scale (and zero) per slice along `axis` (kept as size 1)."""
    if symmetric:
        qmax = 2 ** (bits - 1) - 1
        absx = np.abs(xg) if valid is None else np.where(valid, np.abs(xg), 0.0)
        raw = absx.max(axis=axis, keepdims=True) / qmax
        scale = bf16(raw)
        scale = np.where(scale > 0, scale, 1.0)
        zero = -scale * 2 ** (bits - 1)
        y = xg / scale

        def code(t):
            return np.clip(np.round(t), -qmax, qmax) + 2 ** (bits - 1)

        maxabs = absx.max(axis=axis, keepdims=True)
        stored_zero = None
    else:
        levels = 2**bits - 1
        lo = xg if valid is None else np.where(valid, xg, np.inf)
        hi = xg if valid is None else np.where(valid, xg, -np.inf)
        low = lo.min(axis=axis, keepdims=True)
        high = hi.max(axis=axis, keepdims=True)
        finite = np.isfinite(low)
        zero = bf16(np.where(finite, low, 0.0))
        raw = np.where(finite, (np.where(finite, high, 0.0) - zero) / levels, 1.0)
        scale = bf16(raw)
        scale = np.where(scale > 0, scale, 1.0)
        y = (xg - zero) / scale

        def code(t):
            return np.clip(np.round(t), 0, levels)

        maxabs = np.where(finite, np.maximum(np.abs(np.where(finite, low, 0)), np.abs(np.where(finite, high, 0))), 0)
        stored_zero = zero
    with np.errstate(invalid="ignore"):
        codes = code(y)
        delta = AMB_REL * (np.abs(y) + 1.0)
        code_amb = code(y - delta) != code(y + delta)
    param_amb = _bf16_ambiguous(raw) & (raw > 0)
    xhat = codes * scale + zero
    err = np.where(code_amb, scale, 0.0)
    err = np.where(param_amb, 2 * scale * (1 + 2.0**-7) + 2.0**-6 * maxabs, err)
    codes = np.where(np.isfinite(codes), codes, 0).astype(np.int64)
    return codes, scale, stored_zero, xhat, code_amb, np.broadcast_to(param_amb, scale.shape), err


def quantize_tokens(x, bits: int, symmetric: bool, group_size: int | None = None) -> Quantized:
    """Per-token quantization over channel groups: x [..., T, D] -> scale/zero [..., T, G]."""
    x = np.asarray(x, np.float64)
    d = x.shape[-1]
    group = group_size or d
    xg = x.reshape(x.shape[:-1] + (d // group, group))
    codes, scale, zero, xhat, code_amb, param_amb, err = _group_quant(xg, bits, symmetric, -1)
    param_amb_el = np.broadcast_to(param_amb, xg.shape)
    return Quantized(
        codes=codes.reshape(x.shape),
        scale=scale[..., 0],
        zero=None if zero is None else zero[..., 0],
        xhat=xhat.reshape(x.shape),
        code_amb=(code_amb | param_amb_el).reshape(x.shape),
        param_amb=param_amb[..., 0],
        err=err.reshape(x.shape),
    )


def quantize_channels(x, bits: int, valid=None) -> Quantized:
    """Per-channel asymmetric quantization over tokens: x [..., T, D] -> scale/zero [..., D].

    Only tokens with valid[..., t] count for the range; every token gets codes.
    """
    x = np.asarray(x, np.float64)
    mask = None if valid is None else np.asarray(valid, bool)[..., None]
    codes, scale, zero, xhat, code_amb, param_amb, err = _group_quant(x, bits, False, -2, mask)
    return Quantized(
        codes=codes,
        scale=scale[..., 0, :],
        zero=zero[..., 0, :],
        xhat=xhat,
        code_amb=code_amb | np.broadcast_to(param_amb, x.shape),
        param_amb=param_amb[..., 0, :],
        err=err,
    )


def dequantize_tokens(codes, scale, zero, bits: int) -> np.ndarray:
    """x_hat = u * scale + zero with zero = -scale * 2**(bits-1) when symmetric."""
    codes = np.asarray(codes, np.float64)
    scale = np.asarray(scale, np.float64)
    d, g = codes.shape[-1], scale.shape[-1]
    u = codes.reshape(codes.shape[:-1] + (g, d // g))
    z = -scale * 2 ** (bits - 1) if zero is None else np.asarray(zero, np.float64)
    return (u * scale[..., None] + z[..., None]).reshape(codes.shape)


def dequantize_channels(codes, scale, zero) -> np.ndarray:
    return np.asarray(codes, np.float64) * np.asarray(scale, np.float64)[..., None, :] + np.asarray(
        zero, np.float64
    )[..., None, :]


@dataclass
class ScaledCodes:
    """int8/fp8 quantization with a float scale per row: values = codes * scale."""

    codes: np.ndarray  # float64 code values (integers for int8, fp8 grid values for fp8)
    scale: np.ndarray  # float64 [..., 1]
    alt: np.ndarray  # float64 [..., D]: how far the library's code may be from `codes`


def quantize_rows(x, fmt: str, extra_abs_err=None) -> ScaledCodes:
    """Symmetric int8 (max -> 127) or fp8 e4m3fn (max -> 448) with one scale per row.

    extra_abs_err: optional bound on the library's float32 error in x itself
    (e.g. from subtracting a float32 mean), in x units, broadcastable to x.
    """
    x = np.asarray(x, np.float64)
    top = 127.0 if fmt == "int8" else FP8_MAX
    scale = np.abs(x).max(axis=-1, keepdims=True) / top
    scale = np.where(scale > 0, scale, 1.0)
    y = x / scale
    if fmt == "int8":
        def rnd(t):
            return np.clip(np.round(t), -127, 127)
    else:
        rnd = fp8
    delta = AMB_REL * (np.abs(y) + 1.0)
    if extra_abs_err is not None:
        delta = delta + np.asarray(extra_abs_err) / scale
    codes = rnd(y)
    alt = np.maximum(np.abs(rnd(y + delta) - codes), np.abs(rnd(y - delta) - codes))
    return ScaledCodes(codes=codes, scale=scale, alt=alt)


# --------------------------------------------------------------------------- softmax with error bounds


def softmax_rows(logits, v, logit_err=None, v_err=None):
    """Attention of rows of scaled logits over the keys of `v`, with a perturbation bound.

    logits: [T, S] float64, -inf for masked keys; v: [S, D] finite.
    logit_err: [T, S] bound on |library logit - oracle logit| (0 if None).
    v_err: [S, D] bound on |library value - oracle value| (0 if None).

    Returns out [T, D], lse [T], out_bound [T, D], lse_bound [T]. Rows with no
    key give out 0, lse -inf. Derivation of the bound: with logit changes
    |d_j| <= e_j, the softmax weights become p'_j = p_j r_j, r_j = exp(d_j) / Z,
    Z = sum p_k exp(d_k) in [exp(-sum p_k e_k), sum p_k exp(e_k)] (Jensen), so
    |r_j - 1| <= max(exp(e_j + ebar) - 1, 1 - exp(-e_j) / Zu), and
    |o' - o| <= sum_j p_j |r_j - 1| (|v_j| + |o|) + sum_j p_j r_j v_err_j.
    """
    logits = np.asarray(logits, np.float64)
    v = np.asarray(v, np.float64)
    t, s = logits.shape
    d = v.shape[1]
    out = np.zeros((t, d))
    lse = np.full((t,), -np.inf)
    out_bound = np.zeros((t, d))
    lse_bound = np.zeros((t,))
    if s == 0:
        return out, lse, out_bound, lse_bound
    ok = np.isfinite(logits)
    peak = np.where(ok, logits, -np.inf).max(axis=1, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0.0)
    p = np.where(ok, np.exp(np.where(ok, logits, 0.0) - peak), 0.0)
    denom = p.sum(axis=1)
    rows = denom > 0
    p = p / np.where(rows, denom, 1.0)[:, None]
    out = p @ v
    lse = np.where(rows, np.log(np.where(rows, denom, 1.0)) + peak[:, 0], -np.inf)
    e = np.zeros_like(logits) if logit_err is None else np.where(ok, np.asarray(logit_err, np.float64), 0.0)
    psum = p.sum(axis=1, keepdims=True)
    psum = np.where(psum > 0, psum, 1.0)
    ebar = (p * e).sum(axis=1, keepdims=True) / psum
    zu = (p * np.exp(e)).sum(axis=1, keepdims=True) / psum  # exactly 1 when e = 0
    zu = np.where(rows[:, None], zu, 1.0)  # a row without keys has no weights and no error (not log(0))
    up = np.expm1(e + ebar)
    down = -np.expm1(-e - np.log(zu))
    w = p * np.maximum(up, down)
    out_bound = w @ np.abs(v) + w.sum(axis=1, keepdims=True) * np.abs(out)
    if v_err is not None:
        out_bound = out_bound + (p * np.exp(e + ebar)) @ np.asarray(v_err, np.float64)
    lse_bound = np.maximum(ebar[:, 0], np.log(zu[:, 0]))
    return out, lse, out_bound, lse_bound


def _scale(d, scale):
    return 1.0 / math.sqrt(d) if scale is None else scale


# --------------------------------------------------------------------------- exact attention


def exact_attention(q, k, v, kv_lengths, q_positions=None, scale=None):
    """q [B, Hq, T, D], k/v [B, Hkv, S, D]; key j visible iff j < len (and j <= position).

    Returns (out [B, Hq, T, D], lse [B, Hq, T]) in float64.
    """
    q = np.asarray(q, np.float64)
    k = np.asarray(k, np.float64)
    v = np.asarray(v, np.float64)
    b, hq, t, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    sc = _scale(d, scale)
    out = np.zeros((b, hq, t, d))
    lse = np.full((b, hq, t), -np.inf)
    for bi in range(b):
        n = int(kv_lengths[bi])
        for h in range(hq):
            kk, vv = k[bi, h // g, :n], v[bi, h // g, :n]
            logits = q[bi, h] @ kk.T * sc
            if q_positions is not None:
                pos = np.asarray(q_positions)[bi]
                logits = np.where(np.arange(n)[None, :] <= pos[:, None], logits, -np.inf)
            out[bi, h], lse[bi, h], _, _ = softmax_rows(logits, vv)
    return out, lse


# --------------------------------------------------------------------------- VTI


def tail_queries(q, lengths, num):
    """Row num-1-j of the result is the query at position lengths-1-j (zero before position 0)."""
    q = np.asarray(q, np.float64)
    b, hq, _, d = q.shape
    out = np.zeros((b, hq, num, d))
    for bi in range(b):
        for r in range(num):
            pos = int(lengths[bi]) - num + r
            if pos >= 0:
                out[bi, :, r] = q[bi, :, pos]
    return out


def tail_query_count(config) -> int:
    return config.window if config.window > 0 else config.block_size


def vti(q_tail, k, lengths, config, scale=None):
    """Algorithm 1 with softmax-normalised proxy logits summed over a KV head's query heads.

    Returns (scores, selections): scores[b][h] float64 [P_b] column masses over the
    non-window prefix, selections[b][h] a sorted list of the top-k prefix positions.
    """
    q_tail = np.asarray(q_tail, np.float64)
    k = np.asarray(k, np.float64)
    b, hq, t, d = q_tail.shape
    hkv = k.shape[1]
    g = hq // hkv
    sc = _scale(d, scale)
    scores, selections = [], []
    for bi in range(b):
        length = int(lengths[bi])
        prefix = max(0, length - config.window)
        count = num_vl_tokens(prefix, config.rho)
        used = min(t, length, tail_query_count(config))
        qbar = q_tail[bi, :, t - used:].mean(axis=1) if used else np.zeros((hq, d))
        row_scores, row_sel = [], []
        for h in range(hkv):
            mass = np.zeros(prefix)
            if prefix:
                for r in range(g):
                    logits = k[bi, h, :prefix] @ qbar[h * g + r] * sc
                    p = np.exp(logits - logits.max())
                    mass += p / p.sum()
            order = sorted(range(prefix), key=lambda i: (-mass[i], i))
            row_scores.append(mass)
            row_sel.append(sorted(order[:count]))
        scores.append(row_scores)
        selections.append(row_sel)
    return scores, selections


# --------------------------------------------------------------------------- cache simulation


class CacheSim:
    """Which token (by position id) lives where, per sequence and KV head.

    Token ids are positions: prompt tokens 0..len-1, the i-th appended token of
    sequence b gets id len_b + i. Implements Freeze (Algorithm 4 with the window
    ring) and append with block flushes and VL promotion, from the docstrings.
    """

    def __init__(self, lengths, vl_sets, config, num_heads, vl_capacity=None):
        self.config = config
        self.h = num_heads
        self.vl_capacity = vl_capacity  # a flush promotes only while the VL region has room (None: always)
        self.length = [int(x) for x in lengths]
        w, bs = config.window, config.block_size
        self.pages, self.vl, self.ring, self.score = [], [], [], []
        for bi, length in enumerate(self.length):
            recent = min(length, w)
            prefix = length - recent
            pages_b, vl_b, ring_b, score_b = [], [], [], []
            for h in range(num_heads):
                vl = sorted(vl_sets[bi][h])
                assert all(0 <= p < prefix for p in vl) and len(set(vl)) == len(vl)
                rest = [p for p in range(prefix) if p not in set(vl)]
                pages_b.append([rest[i:i + bs] for i in range(0, len(rest), bs)])
                vl_b.append(list(vl))
                ring_b.append(list(range(prefix, length)))
                score_b.append({p: 0.0 for p in range(prefix, length)})
            self.pages.append(pages_b)
            self.vl.append(vl_b)
            self.ring.append(ring_b)
            self.score.append(score_b)

    @property
    def flush_vl_count(self) -> int:
        c = self.config
        return num_vl_tokens(c.block_size, c.rho) if c.promote_flushed else 0

    def append(self, active=None):
        c = self.config
        bs = c.block_size
        kf = self.flush_vl_count
        for bi in range(len(self.length)):
            if active is not None and not active[bi]:
                continue
            new = self.length[bi]
            for h in range(self.h):
                ring = self.ring[bi][h]
                if len(ring) == c.window + bs:
                    block, self.ring[bi][h] = ring[:bs], ring[bs:]
                    ring = self.ring[bi][h]
                    by_score = sorted(range(bs), key=lambda i: (-self.score[bi][h][block[i]], i))
                    room = self.vl_capacity is None or len(self.vl[bi][h]) + kf <= self.vl_capacity
                    promoted = sorted(by_score[:kf]) if room else []
                    self.vl[bi][h].extend(block[i] for i in promoted)
                    self.pages[bi][h].append([block[i] for i in range(bs) if i not in promoted])
                    for tok in block:
                        del self.score[bi][h][tok]
                ring.append(new)
                self.score[bi][h][new] = 0.0
            self.length[bi] += 1

    def all_tokens(self, bi, h):
        return sorted([t for p in self.pages[bi][h] for t in p] + self.vl[bi][h] + self.ring[bi][h])


def hybrid_decode(q, k_tok, v_tok, sim: CacheSim, config, scale=None):
    """Decode attention over the regions of `sim`, quantizing the low-bit pages like the spec.

    q: [B, Hq, D]; k_tok, v_tok: [B, Hkv, M, D] with token id t of sequence b at
    index t. Low-bit keys: per token ("token_sym"/"token_asym", channel groups)
    or per channel over each page's tokens ("channel_key"); values per token.
    VL and window tokens are exact. Returns (out [B, Hq, D], lse [B, Hq],
    out_bound, lse_bound) in float64.
    """
    q = np.asarray(q, np.float64)
    k_tok = np.asarray(k_tok, np.float64)
    v_tok = np.asarray(v_tok, np.float64)
    b, hq, d = q.shape
    hkv = k_tok.shape[1]
    g = hq // hkv
    sc = _scale(d, scale)
    sym = config.scheme == "token_sym"
    out = np.zeros((b, hq, d))
    lse = np.full((b, hq), -np.inf)
    out_bound = np.zeros((b, hq, d))
    lse_bound = np.zeros((b, hq))
    for bi in range(b):
        for h in range(hkv):
            ks, vs, kerr, verr = [], [], [], []
            for page in sim.pages[bi][h]:
                if not page:
                    continue
                kp, vp = k_tok[bi, h, page], v_tok[bi, h, page]
                if config.key_bits == 16:
                    ks.append(kp)
                    kerr.append(np.zeros_like(kp))
                else:
                    if config.scheme == "channel_key":
                        qk = quantize_channels(kp, config.key_bits)
                    else:
                        qk = quantize_tokens(kp, config.key_bits, sym, config.group_size)
                    ks.append(qk.xhat)
                    kerr.append(qk.err)
                if config.value_bits == 16:
                    vs.append(vp)
                    verr.append(np.zeros_like(vp))
                else:
                    qv = quantize_tokens(vp, config.value_bits, sym, config.group_size)
                    vs.append(qv.xhat)
                    verr.append(qv.err)
            exact = sim.vl[bi][h] + sim.ring[bi][h]
            ks.append(k_tok[bi, h, exact])
            vs.append(v_tok[bi, h, exact])
            kerr.append(np.zeros((len(exact), d)))
            verr.append(np.zeros((len(exact), d)))
            kk, vv = np.concatenate(ks), np.concatenate(vs)
            ke, ve = np.concatenate(kerr), np.concatenate(verr)
            qh = q[bi, h * g:(h + 1) * g]
            logits = qh @ kk.T * sc
            logit_err = np.abs(qh) @ ke.T * sc
            o, l, ob, lb = softmax_rows(logits, vv, logit_err, ve)
            out[bi, h * g:(h + 1) * g] = o
            lse[bi, h * g:(h + 1) * g] = l
            out_bound[bi, h * g:(h + 1) * g] = ob
            lse_bound[bi, h * g:(h + 1) * g] = lb
    return out, lse, out_bound, lse_bound


def ring_mass(q, k_tok, sim: CacheSim, lse, scale=None):
    """Per (b, h): {token id: sum over the KV head's query heads of exp(q.k * scale - lse)} over ring tokens."""
    q = np.asarray(q, np.float64)
    k_tok = np.asarray(k_tok, np.float64)
    lse = np.asarray(lse, np.float64)
    b, hq, d = q.shape
    hkv = k_tok.shape[1]
    g = hq // hkv
    sc = _scale(d, scale)
    result = []
    for bi in range(b):
        row = []
        for h in range(hkv):
            masses = {}
            for tok in sim.ring[bi][h]:
                total = 0.0
                for r in range(g):
                    if np.isfinite(lse[bi, h * g + r]):
                        total += math.exp(float(q[bi, h * g + r] @ k_tok[bi, h, tok]) * sc - lse[bi, h * g + r])
                masses[tok] = total
            row.append(masses)
        result.append(row)
    return result


# --------------------------------------------------------------------------- uniform baselines


def quantize_dequantize(x, lengths, bits, scheme, group_size, block_size, is_key):
    """Every token of x [B, H, S, D] quantized; returns (xhat, err) float64.

    "channel_key" keys: per channel over consecutive blocks of block_size tokens
    where only tokens < lengths[b] count for the range; otherwise per token.
    """
    x = np.asarray(x, np.float64)
    if bits == 16:
        return x.copy(), np.zeros_like(x)
    if scheme == "channel_key" and is_key:
        b, h, s, d = x.shape
        xhat, err = np.zeros_like(x), np.zeros_like(x)
        for bi in range(b):
            for start in range(0, s, block_size):
                stop = min(s, start + block_size)
                valid = np.arange(start, stop) < int(lengths[bi])
                qz = quantize_channels(x[bi, :, start:stop], bits, np.broadcast_to(valid, (h, stop - start)))
                xhat[bi, :, start:stop] = qz.xhat
                err[bi, :, start:stop] = qz.err
        return xhat, err
    qz = quantize_tokens(x, bits, scheme == "token_sym", group_size)
    return qz.xhat, qz.err


def uniform_quantized_attention(q, k, v, kv_lengths, config, q_positions=None, scale=None):
    """Every cached token low-bit; returns (out, lse, out_bound, lse_bound) float64."""
    q = np.asarray(q, np.float64)
    kh, ke = quantize_dequantize(k, kv_lengths, config.key_bits, config.scheme, config.group_size,
                                 config.block_size, True)
    vh, ve = quantize_dequantize(v, kv_lengths, config.value_bits, config.scheme, config.group_size,
                                 config.block_size, False)
    b, hq, t, d = q.shape
    hkv = kh.shape[1]
    g = hq // hkv
    sc = _scale(d, scale)
    out = np.zeros((b, hq, t, d))
    lse = np.full((b, hq, t), -np.inf)
    ob = np.zeros((b, hq, t, d))
    lb = np.zeros((b, hq, t))
    for bi in range(b):
        n = int(kv_lengths[bi])
        for hh in range(hq):
            h = hh // g
            logits = q[bi, hh] @ kh[bi, h, :n].T * sc
            err = np.abs(q[bi, hh]) @ ke[bi, h, :n].T * sc
            if q_positions is not None:
                pos = np.asarray(q_positions)[bi]
                logits = np.where(np.arange(n)[None, :] <= pos[:, None], logits, -np.inf)
            out[bi, hh], lse[bi, hh], ob[bi, hh], lb[bi, hh] = softmax_rows(logits, vh[bi, h, :n], err,
                                                                          ve[bi, h, :n])
    return out, lse, ob, lb


# --------------------------------------------------------------------------- prefill


def hybrid_prefill(q, k, v, lengths, vl_sets, config, scale=None, hybrid=True, qk_format=None):
    """Causal prefill attention, Eq. 7 with the block band of the reference docstring.

    Query i (block c = i // prefill_block) sees keys j <= i. Keys j >= c *
    prefill_block - window and VL keys (vl_sets[b][h]) use exact Q.K; the other
    keys use Q.K in `qk_format` (config.prefill_qk by default): int8 / fp8 with
    one scale per query row and per row of the keys minus their mean over the
    sequence's valid keys, with q . mean added back exactly; "bf16" = exact.
    hybrid=False quantizes every key (SageAttention-style baseline). Values are
    exact. Rows of padded queries are 0. Returns (out [B, Hq, T, D], bound).
    """
    q = np.asarray(q, np.float64)
    k = np.asarray(k, np.float64)
    v = np.asarray(v, np.float64)
    b, hq, t, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    sc = _scale(d, scale)
    fmt = qk_format or config.prefill_qk
    out = np.zeros((b, hq, t, d))
    bound = np.zeros((b, hq, t, d))
    for bi in range(b):
        n = int(lengths[bi])
        if n == 0:
            continue
        pos = np.arange(n)
        causal = pos[None, :] <= pos[:, None]
        for h in range(hkv):
            kk, vv = k[bi, h, :n], v[bi, h, :n]
            mean = kk.mean(axis=0)
            centered = kk - mean
            if hybrid:
                band_lo = (pos // config.prefill_block) * config.prefill_block - config.window
                exact = pos[None, :] >= band_lo[:, None]
                vl = np.zeros(n, bool)
                vl[list(vl_sets[bi][h])] = True
                exact = exact | vl[None, :]
            else:
                exact = np.zeros((n, n), bool)
            if fmt != "bf16":
                # The library's float32 mean is off by at most ~ n * 2**-24 * mean|k| (summation) in
                # general; tests feed keys whose sums are exact in float32, leaving the final division
                # and the subtraction: a few ulps of |mean| and |k|.
                mean_err = 4 * 2.0**-24 * (np.abs(mean)[None, :] + np.abs(kk))
                kq = quantize_rows(centered, fmt, extra_abs_err=mean_err)
            for r in range(g):
                hh = h * g + r
                qq = q[bi, hh, :n]
                full = qq @ kk.T
                if fmt == "bf16":
                    low, low_err = full, np.zeros_like(full)
                else:
                    qz = quantize_rows(qq, fmt)
                    sq, sk = qz.scale, kq.scale[:, 0][None, :]
                    low = (qz.codes @ kq.codes.T) * sq * sk + (qq @ mean)[:, None]
                    low_err = (qz.alt @ np.abs(kq.codes).T + np.abs(qz.codes) @ kq.alt.T + qz.alt @ kq.alt.T) * sq * sk
                logits = np.where(exact, full, low) * sc
                logit_err = np.where(exact, 0.0, low_err) * sc
                logits = np.where(causal, logits, -np.inf)
                o, _, ob, _ = softmax_rows(logits, vv, logit_err)
                out[bi, hh, :n] = o
                bound[bi, hh, :n] = ob
    return out, bound
