"""The coverage section: the attention mass the window, VL tokens and top keys hold, and the heatmaps."""

from __future__ import annotations

import math

from benchmarks.accuracy.captures import Captures
from benchmarks.accuracy.methods import progress
from benchmarks.accuracy.settings import Sizes


def coverage_of_layer(col, win, vl_idx, group: int) -> dict:
    """Coverage numbers of one layer from its column masses.

    col, win: float [Hq, T] (`evaluation.column_mass`); vl_idx: int [Hkv, K]
    HyQuant's VL set. Returns means over query heads of: top1 / top5 (mass on
    the head's global top 1% / 5% columns), top5_win (top-5% columns or the
    query's 128-token local window), kv_top5_win (the same with one top-5%
    set per KV head, what a per-KV-head selection can reach) and vti_win
    (HyQuant's VL set or the window).
    """
    import numpy as np

    col, win = np.asarray(col, np.float64), np.asarray(win, np.float64)
    hq, t = col.shape
    n1, n5 = max(1, math.ceil(0.01 * t)), max(1, math.ceil(0.05 * t))
    order = np.argsort(-col, axis=1)
    out = {"top1": [], "top5": [], "top5_win": [], "kv_top5_win": [], "vti_win": []}
    kv_col = col.reshape(hq // group, group, t).sum(1)
    kv_order = np.argsort(-kv_col, axis=1)
    for h in range(hq):
        kv = h // group

        def kept(cols):
            mask = np.zeros(t, bool)
            mask[cols] = True
            return (col[h, mask].sum() + win[h, ~mask].sum()) / t

        out["top1"].append(col[h, order[h, :n1]].sum() / t)
        out["top5"].append(col[h, order[h, :n5]].sum() / t)
        out["top5_win"].append(kept(order[h, :n5]))
        out["kv_top5_win"].append(kept(kv_order[kv, :n5]))
        vl = np.asarray(vl_idx[kv])
        out["vti_win"].append(kept(vl[vl >= 0]))
    return {k: float(np.mean(v)) for k, v in out.items()}


def _vti(q, k, config):
    """HyQuant's VL set of one layer's prompt: q [Hq, T, D], k [Hkv, T, D] -> int [Hkv, K] (-1 padded)."""
    import jax.numpy as jnp

    from hyquant_jax.eval import choose_vl

    return choose_vl(q[None], k[None], jnp.array([q.shape[1]], jnp.int32), config)[0][0]


def coverage_section(captures: Captures, sizes: Sizes, model_cfg) -> dict:
    import numpy as np

    from hyquant_jax.config import HyQuantConfig
    from hyquant_jax.eval import column_mass

    config = HyQuantConfig()
    group = model_cfg.num_heads // model_cfg.num_kv_heads
    result = {"lengths": list(sizes.coverage_lengths), "window": config.window, "rho": config.rho,
              "definition": "share of causal softmax(QK^T) mass (each query row sums to 1, averaged over all "
                            "queries and query heads) on a head's global top-1%/top-5% key columns ranked by "
                            "total column mass; top5_win adds each query's 128 most recent keys; kv_top5_win "
                            "uses one top-5% set per KV head; vti_win uses HyQuant's own VL set (VTI from the "
                            "last 128 queries, 5% of the non-window prefix) + window", "per_length": {}}
    for length in sizes.coverage_lengths:
        per_layer = {k: [] for k in ("top1", "top5", "top5_win", "kv_top5_win", "vti_win")}
        windows = captures.get(length, sizes.coverage_windows)
        for layer in progress(range(model_cfg.num_layers), desc=f"coverage {length}"):
            cells = []
            for q, k, _ in windows:
                col, win = column_mass(q[layer], k[layer], config.window)
                cells.append(coverage_of_layer(col, win, _vti(q[layer], k[layer], config), group))
            for key in per_layer:
                per_layer[key].append(float(np.mean([c[key] for c in cells])))
        result["per_length"][str(length)] = {
            "windows": len(windows), "per_layer": per_layer,
            "mean": {k: float(np.mean(v)) for k, v in per_layer.items()},
            "min_layer": {k: float(np.min(v)) for k, v in per_layer.items()}}
    return result


def heatmap_maps(captures: Captures, sizes: Sizes, model_cfg, pooled: int = 256) -> list[dict]:
    """Pooled attention maps of six layers (evenly spaced; head = layer mod Hq) with their VL columns."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from hyquant_jax.config import HyQuantConfig

    q, k, _ = captures.get(sizes.heatmap_length, 1)[0]
    t = q.shape[2]
    block = max(1, t // pooled)
    group = model_cfg.num_heads // model_cfg.num_kv_heads
    layers = np.linspace(0, model_cfg.num_layers - 1, 6).round().astype(int)
    maps = []
    for layer in layers:
        head = int(layer) % model_cfg.num_heads
        logits = q[layer, head] @ k[layer, head // group].T / math.sqrt(q.shape[-1])
        causal = jnp.tril(jnp.ones((t, t), bool))
        p = jax.nn.softmax(jnp.where(causal, logits, -jnp.inf), axis=-1)
        pooled_map = np.asarray(p).reshape(t // block, block, t // block, block).mean(axis=(1, 3))
        vl = np.asarray(_vti(q[layer], k[layer], HyQuantConfig())[head // group])
        maps.append({"layer": int(layer), "head": head, "pooled": pooled_map, "vl": vl[vl >= 0]})
    return maps
