"""The accuracy benchmark's targets and its Markdown summary."""

from __future__ import annotations

from benchmarks.accuracy.settings import EXACT_PREFILL


def targets(result: dict) -> dict:
    """The accuracy targets (perplexity within 1% of bf16, retrieval within 2 points of bf16, operator MSE at most
    a quarter of uniform 4-bit's), evaluated from the result (None where a section did not run)."""
    out = {}
    ppl = result.get("perplexity", {}).get("methods", {})
    if "hyquant_k4v4" in ppl and "bf16" in ppl:
        change = ppl["hyquant_k4v4"]["ppl"] / ppl["bf16"]["ppl"] - 1.0
        out["perplexity_within_1pct"] = {"value": change, "threshold": 0.01, "met": abs(change) <= 0.01}
    ret = result.get("retrieval", {}).get("methods", {})
    hq = next((m for m in ("hyquant_k4v4", EXACT_PREFILL) if m in ret), None)
    if hq and "bf16" in ret:
        gap, samples = 100 * (ret[hq]["overall"] - ret["bf16"]["overall"]), ret[hq]["samples"]
        hits = result["retrieval"].get("hits")
        if hits:  # paired: only the samples both methods ran (a run stopped early may differ per method)
            done = {tuple(h[:4]): h[4] for h in hits["bf16"]}
            pairs = [(h[4], done[tuple(h[:4])]) for h in hits[hq] if tuple(h[:4]) in done]
            samples = len(pairs)
            gap = 100 * sum(a - b for a, b in pairs) / samples if pairs else float("nan")
        out["retrieval_within_2_points"] = {"value": gap, "threshold": -2.0, "met": gap >= -2.0, "method": hq,
                                            "samples": samples}
    op = result.get("operator", {}).get("ratio_to_uniform4", {})
    if "hyquant_k4v4" in op:
        worst = max(op["hyquant_k4v4"].values())
        out["operator_mse_at_most_quarter_of_uniform4"] = {"value": worst, "threshold": 0.25, "met": worst <= 0.25,
                                                           "per_length": op["hyquant_k4v4"]}
    return out


def _pct(x):
    return f"{100 * x:.1f}%"


def _sci(x):
    return f"{x:.2e}"


def summary_markdown(result: dict) -> str:
    """README-ready markdown built from a result dict (the JSON)."""
    env = result.get("env", {})
    runs = f"`{env.get('command', '')}`"
    merged = result.get("merged_from")
    combined = result.get("combined_from")
    if combined:
        stopped = sum(not c["complete"] for c in combined)
        runs = (f"{len(combined)} retrieval runs ({stopped} stopped early; commands in the JSON's combined_from, "
                f"the first `{combined[0]['command']}`) combined by {runs}")
    elif merged:
        runs = (f"`{merged['env']['command']}` ({', '.join(merged['sections'])}) and {runs} "
                f"({', '.join(s for s in result['sections'] if s not in merged['sections'])})")
    hardware = "2 CPU cores" if env.get("platform", "cpu") == "cpu" else f"one {env.get('device', 'GPU')}"
    wall = "longest run" if combined else "wall time"
    lines = ["### Accuracy on SmolLM2-135M-Instruct (`python -m benchmarks.accuracy`)", "",
             f"{env.get('device', '?')}, jax {env.get('jax', '?')}, {env.get('date', '?')[:10]}, {runs}, "
             f"{wall} {result.get('wall_s', 0) / 60:.0f} min on {hardware}; file "
             f"`{result.get('out', 'benchmarks/results/accuracy_<device>.json')}`. All methods run through the same "
             "model code on the jnp reference path with a bf16 KV cache; HyQuant uses the default config "
             "(channel_key, rho 5%, W 128).", ""]
    for key, fn in (("coverage", _md_coverage), ("operator", _md_operator), ("perplexity", _md_perplexity),
                    ("retrieval", _md_retrieval), ("greedy", _md_greedy)):
        if key in result:
            lines += fn(result[key]) + [""]
    lines += _md_targets(result.get("targets", {}))
    if result.get("reduced"):
        lines += ["", f"Reduced against the full specification (SPEC) to fit {hardware}: "
                  + "; ".join(result["reduced"]) + "."]
    return "\n".join(lines)


def _md_coverage(c):
    out = ["Attention-mass coverage (paper Table 1; mean over layers and heads, min layer in brackets):", "",
           "| context | top-1% | top-5% | top-5% + window 128 | per-KV-head top-5% + window | "
           "HyQuant VL set + window |",
           "|---|---|---|---|---|---|"]
    for n, cell in c["per_length"].items():
        m, lo = cell["mean"], cell["min_layer"]
        out.append(f"| {n} ({cell['windows']} windows) | " + " | ".join(
            f"{_pct(m[k])} ({_pct(lo[k])})" for k in ("top1", "top5", "top5_win", "kv_top5_win", "vti_win")) + " |")
    return out


def _md_operator(o):
    lengths = [str(x) for x in o["lengths"]]
    out = [f"Decode-operator error (paper Fig. 2): relative MSE of the attention output vs exact float32, mean over "
           f"30 layers; {o['queries']} decode queries x {o['windows']} windows per length (ratio to uniform 4-bit "
           "in brackets):", "", "| method | " + " | ".join(f"{n} tokens" for n in lengths) + " |",
           "|---|" + "---|" * len(lengths)]
    for name, cells in o["methods"].items():
        out.append(f"| {name} | " + " | ".join(
            f"{_sci(cells[n]['mean'])} ({o['ratio_to_uniform4'][name][n]:.3f})" for n in lengths) + " |")
    if "rho" in o:
        sl = [str(x) for x in o["sweep_lengths"]]
        out += ["", "HyQuant K4V4 ablations (mean relative MSE over layers):", "",
                "| sweep | setting | " + " | ".join(f"{n} tokens" for n in sl) + " |", "|---|---|" + "---|" * len(sl)]
        for key, label_of in (("rho", lambda v: f"rho {100 * v:.0f}%"), ("window", lambda v: f"W {v}")):
            for i, v in enumerate(o[key]["values"]):
                out.append(f"| {key} ({o[key]['fixed']}) | {label_of(v)} | "
                           + " | ".join(_sci(o[key]["mean"][n][i]) for n in sl) + " |")
        for key in ("scheme", "components"):
            for i, v in enumerate(o[key]["names"]):
                out.append(f"| {key} ({o[key]['fixed']}) | {v} | "
                           + " | ".join(_sci(o[key]["mean"][n][i]) for n in sl) + " |")
    pe = o.get("prefill")
    if pe:
        pl = [str(x) for x in pe["lengths"]]
        out += ["", "Prefill-operator error (all prompt queries, relative MSE vs exact float32): "
                + "; ".join(f"{m} " + ", ".join(f"{_sci(pe['methods'][m][n]['mean'])} @ {n}" for n in pl)
                            for m in pe["methods"]) + "."]
    return out


def _md_perplexity(p):
    out = [f"WikiText-2 perplexity: {p['prefix']}-token prefix through prefill, then {p['tokens']} tokens "
           f"teacher-forced through decode (scored), {len(p['windows'])} windows. Spread = std over windows; "
           "the change vs bf16 is paired per window:", "",
           "| method | perplexity | NLL (std over windows) | change vs bf16 (std of paired dNLL) | top-1 = bf16 |",
           "|---|---|---|---|---|"]
    for name, m in p["methods"].items():
        change = (f"{100 * m['ppl_change_vs_bf16']:+.2f}% ({m['delta_nll_std']:.4f})"
                  if "ppl_change_vs_bf16" in m else "-")
        agree = _pct(m["top1_agreement_with_bf16"]) if "top1_agreement_with_bf16" in m else "-"
        out.append(f"| {name} | {m['ppl']:.3f} | {m['mean_nll']:.4f} ({m['std_nll_windows']:.4f}) | {change} | "
                   f"{agree} |")
    return out


def _md_retrieval(r):
    lengths = [str(x) for x in r["lengths"]]

    def cell(m, task):
        vals = [m[task]["by_length"][n] for n in lengths]
        return " / ".join("-" if v is None else _pct(v) for v in vals)

    head = "/".join(f"{int(n) / 1024:g}K" for n in lengths)
    lo, hi = r.get("samples_per_cell", [r["samples"]] * 2)
    per_cell = f"{lo}" if lo == hi else f"{lo}-{hi}"
    stopped = "" if r.get("complete", True) else "; stopped early: partial"
    out = [f"Retrieval exact match (RULER-style string match; {per_cell} sample(s) per task x length x depth, "
           f"{len(r['depths'])} depths; '-' = not run at that length{stopped}):", "",
           "| method | " + " | ".join(f"{t} ({head})" for t in r["tasks"]) + " | all samples |",
           "|---|" + "---|" * (len(r["tasks"]) + 1)]
    for name, m in r["methods"].items():
        out.append(f"| {name} | " + " | ".join(cell(m, t) for t in r["tasks"])
                   + f" | {_pct(m['overall'])} of {m['samples']} |")
    return out


def _md_greedy(g):
    def first(m):
        return "/".join("none" if f is None else str(f) for f in m["first_difference"])

    row = ", ".join(f"{name} {_pct(m['agreement'])} (first difference at token {first(m)})"
                    for name, m in g["methods"].items() if name != "bf16")
    return [f"Greedy agreement with bf16 ({g['prompts']} essay-summary prompts of {min(g['prompt_tokens'])}-"
            f"{max(g['prompt_tokens'])} tokens, up to {g['tokens']} new tokens; share of positions with the same "
            f"token, which collapses once two generations part): {row}."]


def _md_targets(t):
    names = {"perplexity_within_1pct": ("HyQuant K4V4 perplexity within 1% of bf16", lambda v: f"{100 * v:+.2f}%"),
             "retrieval_within_2_points": ("HyQuant K4V4 retrieval within 2 points of bf16",
                                           lambda v: f"{v:+.1f} points"),
             "operator_mse_at_most_quarter_of_uniform4": ("HyQuant K4V4 operator MSE <= 1/4 of uniform 4-bit "
                                                          "(worst length)", lambda v: f"{v:.3f}x")}
    out = ["Targets:", ""]
    for key, (label, fmt) in names.items():
        if key in t:
            note = ""
            if key == "retrieval_within_2_points":
                note = f" ({t[key]['method']}, {t[key]['samples']} samples)"
            out.append(f"- {label}: {fmt(t[key]['value'])}{note} -> **{'met' if t[key]['met'] else 'NOT met'}**")
    return out
