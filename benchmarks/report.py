"""Print the README's result tables (markdown) from the committed benchmark JSON files.

  python benchmarks/report.py [--results benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import os


def _load(results, name):
    path = os.path.join(results, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def decode_table(d) -> str:
    env = d["env"]
    lines = [
        f"Decode attention, one layer, per call inside a jitted loop (ms); {env['device']}, jax {env['jax']}, "
        f"{env['date'][:10]}, `{env['command']}`; hybrid = K{d['config']['key_bits']}V{d['config']['value_bits']} "
        f"{d['config']['scheme']}, rho {d['config']['rho']}, W {d['config']['window']}.",
        "",
        "| case | hybrid | cuDNN bf16 | Pallas gqa bf16 | XLA bf16 | KIVI-4 (dequant+attend) | hybrid vs best bf16 | "
        "hybrid TB/s | hybrid bytes / bf16 bytes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in d["cases"]:
        def ms(m):
            return f"{r[m]['loop_ms']:.4f}" if "loop_ms" in r[m] else "n/a"
        h = r["hybrid"]
        lines.append(
            f"| {r['case']} | {ms('hybrid')} | {ms('cudnn')} | {ms('pallas')} | {ms('xla')} | {ms('kivi4')} | "
            f"{h.get('speedup_vs_best_bf16', float('nan')):.2f}x | {h.get('tb_per_s', float('nan')):.2f} | "
            f"{r['bytes']['hybrid'] / r['bytes']['bf16']:.3f} |")
    return "\n".join(lines)


def prefill_table(d) -> str:
    lines = [
        f"Causal prefill, B=1, Hq/Hkv {d['shape']['Hq']}/{d['shape']['Hkv']}, D {d['shape']['D']}, per call inside a "
        f"jitted loop (ms); {d['device']}, jax {d['jax']}, {d['date'][:10]}, `{d['command']}`.",
        "",
        "| T | hybrid INT8 | hybrid FP8 | uniform INT8 (Sage-style) | cuDNN bf16 | Pallas mha bf16 | "
        "hybrid/cuDNN | hybrid/mha | VTI share | MSE uniform / hybrid |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t, r in d["results"].items():
        s = d["summary"][t]
        lines.append(
            f"| {t} | {r['hybrid_int8']['loop_ms']:.3f} | {r['hybrid_fp8']['loop_ms']:.3f} | "
            f"{r['uniform_int8']['loop_ms']:.3f} | {r['cudnn_bf16']['loop_ms']:.3f} | "
            f"{r['pallas_mha_bf16']['loop_ms']:.3f} | {s['hybrid_int8_speedup_vs_cudnn']:.2f}x | "
            f"{s['hybrid_int8_speedup_vs_mha']:.2f}x | {100 * s['vti_share_of_prefill']:.1f}% | "
            f"{s['mse_ratio_uniform_over_hybrid_int8']:.0f}x |")
    return "\n".join(lines)


def e2e_table(d) -> str:
    rows = [r for r in d.get("b1", d.get("results", [])) if isinstance(r, dict) and "step_ms" in r]
    lines = [
        "| method | prefix | ms/step | tokens/s | byte floor (ms) | floor / step |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['method']} | {r['prefix']} | {r['step_ms']:.2f} | {r['tokens_per_s']:.1f} | "
                     f"{r['floor_ms']:.2f} | {r['floor_over_step']:.2f} |")
    return "\n".join(lines)


def generate_table(results) -> str:
    lines = ["| scheme | greedy tokens identical to bf16 | first difference at token |", "|---|---|---|"]
    for scheme in ("channel_key", "token_sym", "token_asym"):
        d = _load(results, f"generate_smollm2_cpu_{scheme}.json")
        if d:
            first = ", ".join(str(x) for x in d["first_difference"])
            lines.append(f"| {scheme} | {100 * d['agreement_with_bf16']:.1f}% | {first} |")
    return "\n".join(lines)


def _find_rows(obj):
    """Rows with step_ms anywhere in an e2e JSON (its layout groups them by section)."""
    if isinstance(obj, dict):
        if "step_ms" in obj:
            return [obj]
        return [r for v in obj.values() for r in _find_rows(v)]
    if isinstance(obj, list):
        return [r for v in obj for r in _find_rows(v)]
    return []


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--results", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = p.parse_args()
    d = _load(args.results, "decode_kernel_h200.json")
    if d:
        print(decode_table(d), "\n")
    d = _load(args.results, "prefill_kernel_h200.json")
    if d:
        print(prefill_table(d), "\n")
    d = _load(args.results, "e2e_h200_partial.json")
    if d:
        print(e2e_table({"b1": _find_rows(d)}), "\n")
    print(generate_table(args.results))


if __name__ == "__main__":
    main()
