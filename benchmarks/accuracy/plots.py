"""Plots of the accuracy benchmark (matplotlib, Agg). Each function writes one PNG and returns its path."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path, rect=None) -> Path:
    """Lay out, write at 110 dpi and close a figure; returns its path."""
    fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


def attention_heatmaps(maps: list[dict], length: int, path: Path) -> Path:
    """Paper Fig. 1: pooled causal attention maps with the VL columns HyQuant keeps marked.

    maps: dicts with "layer", "head", "pooled" float [n, n] (mean attention
    probability per block of queries x keys), "vl" key positions of that
    head's VL set, "window".
    """
    plt = _plt()
    cols = min(3, len(maps))
    rows = -(-len(maps) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 4.4 * rows), squeeze=False)
    for ax, m in zip(axes.flat, maps):
        pooled = np.asarray(m["pooled"])
        img = np.log10(np.maximum(pooled, 1e-7))
        ax.imshow(img, cmap="magma", origin="upper", extent=(0, length, length, 0), vmin=-6, vmax=0,
                  interpolation="nearest")
        vl = np.asarray(m["vl"])
        ax.scatter(vl, np.full(vl.shape, -0.012 * length), marker="|", s=30, color="tab:cyan", clip_on=False,
                   linewidths=0.8)
        ax.set_title(f"layer {m['layer']}, head {m['head']} ({len(vl)} VL keys)", fontsize=9)
        ax.set_xlabel("key position")
        ax.set_ylabel("query position")
        ax.set_ylim(length, -0.03 * length)
    for ax in list(axes.flat)[len(maps):]:
        ax.axis("off")
    fig.suptitle(f"SmolLM2-135M attention on a {length}-token WikiText window (log10 mean probability per block); "
                 "cyan ticks: VL keys chosen by VTI (rho 5%, W 128)", fontsize=10)
    return _save(fig, path)


def coverage(result: dict, path: Path) -> Path:
    """Attention-mass coverage per layer (paper Table 1), one panel per context length."""
    plt = _plt()
    lengths = list(result["lengths"])
    fig, axes = plt.subplots(1, len(lengths), figsize=(6 * len(lengths), 4.4), squeeze=False)
    styles = {"top1": ("top-1% columns", "-"), "top5": ("top-5% columns", "-"),
              "top5_win": ("top-5% + window 128", "-"), "vti_win": ("HyQuant's VL set (VTI, 5%) + window", "--")}
    for ax, length in zip(axes[0], lengths):
        per = result["per_length"][str(length)]["per_layer"]
        for key, (label, ls) in styles.items():
            ax.plot(range(len(per[key])), per[key], ls, marker=".", label=label)
        ax.set_title(f"{length} tokens ({result['per_length'][str(length)]['windows']} windows)")
        ax.set_xlabel("layer")
        ax.set_ylabel("share of causal attention mass")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    wide = len(lengths) > 1
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=4 if wide else 2)
    return _save(fig, path, rect=(0, 0.08 if wide else 0.14, 1, 1))


def operator_mse(result: dict, methods: list[str], path: Path) -> Path:
    """Relative MSE of the decode attention output per layer and method, one panel per length."""
    plt = _plt()
    lengths = list(result["lengths"])
    fig, axes = plt.subplots(1, len(lengths), figsize=(5 * len(lengths), 4.2), squeeze=False, sharey=True)
    for ax, length in zip(axes[0], lengths):
        for name in methods:
            cell = result["methods"][name].get(str(length))
            if cell:
                ax.semilogy(range(len(cell["per_layer"])), cell["per_layer"], marker=".", label=name)
        ax.set_title(f"decode attention at {length} tokens")
        ax.set_xlabel("layer")
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel("relative MSE vs exact float32")
    axes[0][-1].legend(fontsize=7, loc="best")
    return _save(fig, path)


def sweeps(result: dict, path: Path) -> Path:
    """rho sweep, W sweep, key/value scheme and the B.5 components: mean relative MSE per length."""
    plt = _plt()
    fig, axes = plt.subplots(1, 4, figsize=(20, 4.2))
    lengths = [str(x) for x in result["sweep_lengths"]]
    for key, ax, xlabel in (("rho", axes[0], "rho (share of the prefix kept as VL)"),
                            ("window", axes[1], "W (full-precision window)")):
        sweep = result[key]
        xs = [float(x) for x in sweep["values"]]
        for length in lengths:
            ys = [sweep["mean"][length][i] for i in range(len(xs))]
            ax.semilogy(xs, ys, marker="o", label=f"{length} tokens")
        ax.set_xlabel(xlabel)
        ax.set_title(f"HyQuant K4V4 {key} sweep ({sweep['fixed']})", fontsize=9)
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("mean relative MSE over layers")
    axes[0].legend(fontsize=8)
    for key, ax, title in (("scheme", axes[2], "low-bit scheme (K4V4, W 128, rho 5%)"),
                           ("components", axes[3], "components (paper B.5), K4V4 channel_key")):
        block = result[key]
        names = list(block["names"])
        width = 0.8 / max(1, len(lengths))
        for i, length in enumerate(lengths):
            ys = [block["mean"][length][j] for j in range(len(names))]
            ax.bar(np.arange(len(names)) + i * width, ys, width, label=f"{length} tokens")
        ax.set_yscale("log")
        ax.set_xticks(np.arange(len(names)) + width * (len(lengths) - 1) / 2)
        ax.set_xticklabels(names, fontsize=8, rotation=15)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3, axis="y", which="both")
    return _save(fig, path)


def retrieval_grids(result: dict, path: Path) -> Path:
    """Needle grids: exact-match accuracy per depth x length, one panel per task and method."""
    plt = _plt()
    tasks, methods = list(result["tasks"]), list(result["methods"])
    lengths, depths = list(result["lengths"]), list(result["depths"])
    fig, axes = plt.subplots(len(tasks), len(methods), figsize=(2.6 * len(methods) + 1, 2.4 * len(tasks) + 0.6),
                             squeeze=False)
    for r, task in enumerate(tasks):
        for c, name in enumerate(methods):
            ax = axes[r][c]
            cells = result["methods"][name][task]["grid"]
            grid = np.array([[np.nan if cells[str(length)][str(d)] is None else cells[str(length)][str(d)]
                              for length in lengths] for d in depths], float)
            ax.imshow(grid, cmap="RdYlGn", vmin=0, vmax=1, aspect="auto")
            for i in range(len(depths)):
                for j in range(len(lengths)):
                    ax.text(j, i, f"{grid[i, j]:.0%}" if np.isfinite(grid[i, j]) else "-", ha="center",
                            va="center", fontsize=7)
            ax.set_xticks(range(len(lengths)))
            ax.set_xticklabels([f"{x / 1024:g}K" for x in lengths], fontsize=7)
            ax.set_yticks(range(len(depths)))
            ax.set_yticklabels([f"{d:.0%}" for d in depths], fontsize=7)
            if r == 0:
                ax.set_title(name, fontsize=9)
            if c == 0:
                ax.set_ylabel(f"{task}\ndepth", fontsize=9)
    lo, hi = result.get("samples_per_cell", [result["samples"]] * 2)
    fig.suptitle(f"Retrieval exact match ({lo if lo == hi else f'{lo}-{hi}'} samples per cell)", fontsize=10)
    return _save(fig, path)


def perplexity(result: dict, path: Path) -> Path:
    """WikiText perplexity per method with the spread over windows, and the paired change vs bf16."""
    plt = _plt()
    names = list(result["methods"])
    ppl = [result["methods"][n]["ppl"] for n in names]
    lo = [result["methods"][n]["ppl"] - min(result["methods"][n]["ppl_per_window"]) for n in names]
    hi = [max(result["methods"][n]["ppl_per_window"]) - result["methods"][n]["ppl"] for n in names]
    delta = [100 * result["methods"][n]["ppl_change_vs_bf16"] for n in names]
    dstd = [100 * result["methods"][n]["delta_nll_std"] for n in names]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2))
    axes[0].bar(names, ppl, yerr=[lo, hi], capsize=3, color="tab:blue")
    axes[0].set_ylabel("perplexity")
    axes[0].set_title("pooled over windows (whiskers: min / max window)", fontsize=9)
    axes[1].bar(names, delta, yerr=dstd, capsize=3, color="tab:orange")
    axes[1].axhline(1.0, color="red", lw=0.8, ls="--", label="target for HyQuant K4V4: +1%")
    axes[1].set_ylabel("perplexity change vs bf16 (%)")
    axes[1].set_title("paired per window (whiskers: std of dNLL x 100)", fontsize=9)
    axes[1].legend(fontsize=8)
    for ax in axes:
        ax.tick_params(axis="x", rotation=30, labelsize=8)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(f"WikiText-2: {result['prefix']}-token prefix by prefill, {result['tokens']} tokens teacher-forced "
                 f"through decode, {len(result['windows'])} windows", fontsize=10)
    return _save(fig, path, rect=(0, 0, 1, 0.95))
