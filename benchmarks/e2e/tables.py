"""The end-to-end benchmark's printed tables and plot."""

from __future__ import annotations


def _b1(results) -> str:
    """Label of the 'B = 1' sections: one sequence per data shard with a mesh."""
    mesh = results.get("mesh")
    return f"{mesh['data']} (1 per data shard)" if mesh and mesh["data"] > 1 else "1"


def _ratio(row) -> str:
    """x bf16 column: same-config bf16 step time over this one's ('-' without a bf16 row)."""
    x = row.get("speedup_vs_bf16")
    return f"{x:6.2f}" if x is not None else "     -"


def print_tables(results) -> None:
    def speedups(rows, keys):
        base = {tuple(r[k] for k in keys): r for r in rows if r.get("method") == "bf16" and "step_ms" in r}
        for r in rows:
            b = base.get(tuple(r.get(k) for k in keys))
            if b and "step_ms" in r:
                r["speedup_vs_bf16"] = b["step_ms"] / r["step_ms"]

    speedups(results["b1"], ("prefix",))
    speedups(results["batch"], ("batch",))
    if results["b1"]:
        print(f"\nB={_b1(results)} decode: prefix, method, ms/step, tokens/s, floor ms, floor/step, x bf16")
        for r in results["b1"]:
            if "step_ms" in r:
                print(f"  {r['prefix']:>7} {r['method']:>8} {r['step_ms']:8.2f} {r['tokens_per_s']:9.1f} "
                      f"{r['floor_ms']:8.2f} {r['floor_over_step']:6.2f} {_ratio(r)}")
            else:
                print(f"  {r.get('prefix', '-'):>7} {r['method']:>8} {r.get('error', '')[:80]}")
    if results["batch"]:
        print("\nbatch sweep: batch, method, ms/step, tokens/s, peak GiB, floor/step, x bf16")
        for r in results["batch"]:
            if "step_ms" in r:
                peak = (r["peak_bytes"] or 0) / 2**30
                print(f"  {r['batch']:>5} {r['method']:>8} {r['step_ms']:8.2f} {r['tokens_per_s']:9.1f} "
                      f"{peak:8.1f} {r['floor_over_step']:6.2f} {_ratio(r)}")
            else:
                what = "OOM" if r.get("oom") else r.get("error", "")[:80]
                print(f"  {r.get('batch', '-'):>5} {r['method']:>8} {what}")
    if results["prefill"]:
        print(f"\nprefill (B={_b1(results)}): prefix, method, seconds, tokens/s, chunk, chunk attention")
        for r in results["prefill"]:
            if "seconds" in r:
                print(f"  {r['prefix']:>7} {r['method']:>8} {r['seconds']:8.3f} {r['tokens_per_s']:10.0f} "
                      f"{r.get('chunk', r['prefix']):>7} {r.get('chunk_impl', 'xla'):>6}")
            else:
                print(f"  {r.get('prefix', '-'):>7} {r['method']:>8} {r.get('error', '')[:80]}")


def plot(results, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(21, 4.8))
    methods = sorted({r["method"] for s in ("b1", "batch") for r in results[s] if "step_ms" in r})
    colors = {m: f"C{i}" for i, m in enumerate(methods)}
    for m in methods:
        rows = [r for r in results["b1"] if r["method"] == m and "step_ms" in r]
        if rows:
            x = [r["prefix"] for r in rows]
            axes[0].plot(x, [r["tokens_per_s"] for r in rows], "o-", color=colors[m], label=m)
            axes[1].plot(x, [r["step_ms"] for r in rows], "o-", color=colors[m], label=f"{m} step")
            axes[1].plot(x, [r["floor_ms"] for r in rows], "--", color=colors[m], label=f"{m} byte floor")
        rows = [r for r in results["batch"] if r["method"] == m and "step_ms" in r]
        if rows:
            axes[2].plot([r["batch"] for r in rows], [r["tokens_per_s"] for r in rows], "o-", color=colors[m], label=m)
            axes[3].plot([r["batch"] for r in rows], [(r["peak_bytes"] or 0) / 2**30 for r in rows], "o-",
                         color=colors[m], label=m)
    prefix = next((r["prefix"] for r in results["batch"] if "prefix" in r), None)
    axes[0].set(xscale="log", xlabel="cached tokens (B=1)", ylabel="decode tokens/s", title="B=1 decode")
    axes[1].set(xscale="log", xlabel="cached tokens (B=1)", ylabel="ms per step",
                title=f"B=1 step time vs byte floor ({results['bandwidth_tbs']} TB/s)")
    axes[2].set(xlabel="batch", ylabel="decode tokens/s", title=f"batch sweep at {prefix} cached tokens")
    axes[3].set(xlabel="batch", ylabel="peak device memory (GiB)", title="peak memory (batch sweep)")
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    env = results["environment"]
    mesh = results.get("mesh")
    where = f" x{mesh['data'] * mesh['model']} (mesh data={mesh['data']},model={mesh['model']})" if mesh else ""
    fig.suptitle(f"{env['device']}{where}, {results['params'] / 1e9:.2f}B-param Qwen3-shaped model, random bf16 "
                 f"weights, jax {env['jax']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
