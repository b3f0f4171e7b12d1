"""A float64 reference for llama.cpp's K-quant and 5-bit block formats, written from ggml's C dequantizers
(`dequantize_row_q*` in ggml-quants.c) element by element, to check the loader (which uses the `gguf`
package's vectorized NumPy code) against an independent implementation. Also makes random valid blocks.

A block holds QK_K = 256 weights (32 for Q5_0 / Q5_1); the fp16 scales are little-endian.
"""

from __future__ import annotations

import numpy as np

QK_K = 256
BLOCK_BYTES = {"Q2_K": 84, "Q3_K": 110, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210, "Q5_0": 22, "Q5_1": 24}
BLOCK_WEIGHTS = {"Q5_0": 32, "Q5_1": 32}
# byte offsets of each block's fp16 fields, and their scale (for random blocks of a sane magnitude)
_HALVES = {"Q2_K": {80: 0.01, 82: 0.01}, "Q3_K": {108: 0.01}, "Q4_K": {0: 0.002, 2: 0.002},
           "Q5_K": {0: 0.002, 2: 0.002}, "Q6_K": {208: 0.002}, "Q5_0": {0: 0.05}, "Q5_1": {0: 0.05, 2: 0.05}}


def block_weights(qtype: str) -> int:
    return BLOCK_WEIGHTS.get(qtype, QK_K)


def _half(b: np.ndarray, at: int) -> float:
    return float(b[at:at + 2].copy().view("<f2")[0])


def random_blocks(rng: np.random.Generator, qtype: str, rows: int, cols: int) -> np.ndarray:
    """uint8 [rows, cols / block_weights * BLOCK_BYTES]: random bits with finite fp16 scales."""
    n = cols // block_weights(qtype)
    data = rng.integers(0, 256, (rows, n, BLOCK_BYTES[qtype]), dtype=np.uint8)
    for at, scale in _HALVES[qtype].items():
        data[:, :, at:at + 2] = (rng.standard_normal((rows, n)) * scale).astype("<f2")[..., None].view(np.uint8)
    return data.reshape(rows, -1)


def _scale_min_k4(j: int, q: np.ndarray) -> tuple[int, int]:
    if j < 4:
        return int(q[j]) & 63, int(q[j + 4]) & 63
    return ((int(q[j + 4]) & 0xF) | ((int(q[j - 4]) >> 6) << 4),
            (int(q[j + 4]) >> 4) | ((int(q[j]) >> 6) << 4))


def _q2_k(b: np.ndarray) -> list[float]:
    scales, qs, d, dmin = b[0:16], b[16:80], _half(b, 80), _half(b, 82)
    y, i = [], 0
    for n in range(2):
        q = qs[32 * n:32 * n + 32]
        for shift in (0, 2, 4, 6):
            for half in (0, 16):
                sc = int(scales[i])
                i += 1
                y += [d * (sc & 0xF) * ((int(q[half + l]) >> shift) & 3) - dmin * (sc >> 4) for l in range(16)]
    return y


def _q3_k(b: np.ndarray) -> list[float]:
    hmask, qs, raw, d = b[0:32], b[32:96], b[96:108], _half(b, 108)
    # 16 6-bit scales: low 4 bits from bytes 0-7, high 2 bits from bytes 8-11
    scales = []
    for j in range(16):
        low = (int(raw[j]) & 0xF) if j < 8 else (int(raw[j - 8]) >> 4)
        high = (int(raw[8 + j % 4]) >> (2 * (j // 4))) & 3
        scales.append((low | (high << 4)) - 32)
    y, i, m = [], 0, 1
    for n in range(2):
        q = qs[32 * n:32 * n + 32]
        for shift in (0, 2, 4, 6):
            for half in (0, 16):
                dl = d * scales[i]
                i += 1
                y += [dl * (((int(q[half + l]) >> shift) & 3) - (0 if int(hmask[half + l]) & m else 4))
                      for l in range(16)]
            m <<= 1
    return y


def _q4_k(b: np.ndarray) -> list[float]:
    d, dmin, scales, qs = _half(b, 0), _half(b, 2), b[4:16], b[16:144]
    y = []
    for j in range(4):
        q = qs[32 * j:32 * j + 32]
        sc1, m1 = _scale_min_k4(2 * j, scales)
        sc2, m2 = _scale_min_k4(2 * j + 1, scales)
        y += [d * sc1 * (int(x) & 0xF) - dmin * m1 for x in q]
        y += [d * sc2 * (int(x) >> 4) - dmin * m2 for x in q]
    return y


def _q5_k(b: np.ndarray) -> list[float]:
    d, dmin, scales, qh, qs = _half(b, 0), _half(b, 2), b[4:16], b[16:48], b[48:176]
    y = []
    for j in range(4):
        q = qs[32 * j:32 * j + 32]
        sc1, m1 = _scale_min_k4(2 * j, scales)
        sc2, m2 = _scale_min_k4(2 * j + 1, scales)
        lo_bit, hi_bit = 1 << (2 * j), 1 << (2 * j + 1)
        y += [d * sc1 * ((int(q[l]) & 0xF) + (16 if int(qh[l]) & lo_bit else 0)) - dmin * m1 for l in range(32)]
        y += [d * sc2 * ((int(q[l]) >> 4) + (16 if int(qh[l]) & hi_bit else 0)) - dmin * m2 for l in range(32)]
    return y


def _q6_k(b: np.ndarray) -> list[float]:
    ql, qh, sc, d = b[0:128], b[128:192], b[192:208].view(np.int8), _half(b, 208)
    y = [0.0] * QK_K
    for n in range(2):
        L, H, S = ql[64 * n:64 * n + 64], qh[32 * n:32 * n + 32], sc[8 * n:8 * n + 8]
        for l in range(32):
            i = l // 16
            q1 = ((int(L[l]) & 0xF) | (((int(H[l]) >> 0) & 3) << 4)) - 32
            q2 = ((int(L[l + 32]) & 0xF) | (((int(H[l]) >> 2) & 3) << 4)) - 32
            q3 = ((int(L[l]) >> 4) | (((int(H[l]) >> 4) & 3) << 4)) - 32
            q4 = ((int(L[l + 32]) >> 4) | (((int(H[l]) >> 6) & 3) << 4)) - 32
            base = 128 * n
            y[base + l] = d * int(S[i]) * q1
            y[base + l + 32] = d * int(S[i + 2]) * q2
            y[base + l + 64] = d * int(S[i + 4]) * q3
            y[base + l + 96] = d * int(S[i + 6]) * q4
    return y


def _q5_0(b: np.ndarray) -> list[float]:
    d, qh, qs = _half(b, 0), int(b[2:6].copy().view("<u4")[0]), b[6:22]
    low = [((int(qs[j]) & 0xF) | (((qh >> j) & 1) << 4)) - 16 for j in range(16)]
    high = [((int(qs[j]) >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16 for j in range(16)]
    return [d * x for x in low + high]


def _q5_1(b: np.ndarray) -> list[float]:
    d, m, qh, qs = _half(b, 0), _half(b, 2), int(b[4:8].copy().view("<u4")[0]), b[8:24]
    low = [(int(qs[j]) & 0xF) | (((qh >> j) & 1) << 4) for j in range(16)]
    high = [(int(qs[j]) >> 4) | (((qh >> (j + 16)) & 1) << 4) for j in range(16)]
    return [d * x + m for x in low + high]


_DECODERS = {"Q2_K": _q2_k, "Q3_K": _q3_k, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k, "Q5_0": _q5_0, "Q5_1": _q5_1}


def dequantize(qtype: str, data: np.ndarray) -> np.ndarray:
    """float64 [rows, cols] from uint8 [rows, cols / block_weights * BLOCK_BYTES]."""
    blocks = data.reshape(data.shape[0], -1, BLOCK_BYTES[qtype])
    out = np.array([[_DECODERS[qtype](b) for b in row] for row in blocks], np.float64)
    return out.reshape(data.shape[0], blocks.shape[1] * block_weights(qtype))
