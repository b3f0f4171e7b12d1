"""Print the README's result tables (markdown) from the committed benchmark JSON files.

  python benchmarks/report.py [--results benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load(results, name):
    path = os.path.join(results, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def decode_table(d) -> str:
    env = d["env"]
    probe = d["read_bandwidth"]["best"] if "read_bandwidth" in d else None  # the old scalar-sum probe is left out
    lines = [
        f"Decode attention, one layer, per call inside a jitted loop (ms); {env['device']}, jax {env['jax']}, "
        f"{env['date'][:10]}, `{env['command']}`; hybrid = K{d['config']['key_bits']}V{d['config']['value_bits']} "
        f"{d['config']['scheme']}, rho {d['config']['rho']}, W {d['config']['window']}.",
        "",
        "| case | hybrid | low-bit kernel | hybrid, Triton only | cuDNN bf16 | Pallas gqa bf16 | XLA bf16 | "
        "KIVI-4 (dequant+attend) | hybrid vs best bf16 | Triton only vs best bf16 | hybrid TB/s | "
        "hybrid bytes / bf16 bytes |" + (" hybrid / read probe |" if probe else ""),
        "|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if probe else ""),
    ]
    if probe:
        lines[0] += (f" Read probe (`benchmarks/read_bandwidth.py`, same process): {probe:.2f} TB/s; hybrid / read "
                     f"probe = the hybrid's TB/s (bytes it must read / time) over the probe's.")
    for r in d["cases"]:
        def ms(m):
            return f"{r[m]['loop_ms']:.4f}" if "loop_ms" in r.get(m, {}) else "n/a"

        def ratio(m):
            x = r.get(m, {}).get("speedup_vs_best_bf16")
            return "n/a" if x is None else f"{x:.2f}x"

        h = r["hybrid"]
        lines.append(
            f"| {r['case']} | {ms('hybrid')} | {r.get('low_bit_kernel', 'triton')} | {ms('hybrid_triton')} | "
            f"{ms('cudnn')} | {ms('pallas')} | {ms('xla')} | {ms('kivi4')} | {ratio('hybrid')} | "
            f"{ratio('hybrid_triton')} | {h.get('tb_per_s', float('nan')):.2f} | "
            f"{r['bytes']['hybrid'] / r['bytes']['bf16']:.3f} |"
            + (f" {100 * h.get('tb_per_s', float('nan')) / probe:.0f}% |" if probe else ""))
    for r in d["cases"]:  # other key schemes, timed in the same run (one case)
        best = min(r[m]["loop_ms"] for m in ("cudnn", "xla", "pallas") if "loop_ms" in r[m])
        for key in sorted(k for k in r if k.startswith("hybrid_") and k != "hybrid_triton" and isinstance(r[k], dict)
                          and "loop_ms" in r[k]):
            lines.append(f"\n{r['case']}, scheme {key[len('hybrid_'):]}: {r[key]['loop_ms']:.4f} ms, "
                         f"{best / r[key]['loop_ms']:.2f}x the best bf16 kernel.")
    return "\n".join(lines)


PREFILL_COLUMNS = [  # (header, method) of the prefill table; a method the run lacks prints n/a
    ("hybrid INT8 (Triton)", "hybrid_int8"), ("hybrid FP8 (Triton)", "hybrid_fp8"),
    ("uniform INT8 (Sage-style)", "uniform_int8"), ("hybrid INT8 (`mosaic`)", "hybrid_int8_mgpu_2wg_fast_pp"),
    ("`mosaic` kernel alone", "hybrid_int8_mgpu_kernel"), ("`mosaic` + VTI", "hybrid_e2e_mosaic"),
    ("cuDNN bf16", "cudnn_bf16"), ("Pallas mha bf16", "pallas_mha_bf16"),
]


def prefill_table(d) -> str:
    """The prefill benchmark's table: ms per call of each method, then the best hybrid's ratios (the Mosaic
    kernel where the run has it, else the Triton one), VTI share and MSE ratio."""
    results = d["results"]
    best = "hybrid_int8_mgpu_2wg_fast_pp" if any(method_ms(r, "hybrid_int8_mgpu_2wg_fast_pp") for r in
                                                 results.values()) else "hybrid_int8"
    label = "`mosaic`" if best != "hybrid_int8" else "hybrid"
    tuning = f", Triton tuning {d.get('tuning')}, mha tuning {d.get('mha_tuning')}" if d.get("tuning") else ""
    lines = [
        f"Causal prefill, B=1, Hq/Hkv {d['shape']['Hq']}/{d['shape']['Hkv']}, D {d['shape']['D']}, per call inside a "
        f"jitted loop (ms); {d['device']}, jax {d['jax']}, {d['date'][:10]}, `{d['command']}`{tuning}.",
        "",
        "| T | " + " | ".join(h for h, _ in PREFILL_COLUMNS) + f" | {label}/cuDNN | {label}/mha | VTI share | "
        f"MSE uniform / {label} |",
        "|---|" + "---|" * (len(PREFILL_COLUMNS) + 4),
    ]
    for t, r in results.items():
        s = d["summary"].get(t, {})
        cells = [f"{method_ms(r, m):.3f}" if method_ms(r, m) else "n/a" for _, m in PREFILL_COLUMNS]
        share = s.get("vti_share_of_mosaic_prefill" if best != "hybrid_int8" else "vti_share_of_prefill")
        ratios = [f"{s[k]:.2f}x" if k in s else "n/a" for k in (f"{best}_speedup_vs_cudnn", f"{best}_speedup_vs_mha")]
        mse = s.get(f"mse_ratio_uniform_over_{best}")
        lines.append(f"| {t} | " + " | ".join(cells + ratios) + f" | {f'{100 * share:.1f}%' if share else 'n/a'} | "
                     f"{f'{mse:.0f}x' if mse else 'n/a'} |")
    return "\n".join(lines)


def method_ms(r, method):
    """loop_ms of `method` in one length's results, or None."""
    return r.get(method, {}).get("loop_ms")


def _env_line(d) -> str:
    env = d["environment"]
    mesh = d.get("mesh")
    where = f"{env['device']} x{env.get('mesh_devices', 1)}" if mesh else env["device"]
    parts = ", ".join(d["combined_from"]) if d.get("combined_from") else ""
    return (f"{where}, jax {env['jax']}, {env['date'][:10]}, model {d.get('model_name', '?')} "
            f"({d['params'] / 1e9:.2f}B params, random bf16 weights)" + (f", merged from {parts}" if parts else "")
            + f"; first part's command: `{env['command']}`.")


def e2e_b1_table(d) -> str:
    """B=1 decode rows: step time against the byte floor and against bf16 at the same prefix."""
    rows = [r for r in d.get("b1", []) if "step_ms" in r]
    bf16 = {r["prefix"]: r for r in rows if r["method"] == "bf16"}
    lines = ["| method | prefix | ms/step | tokens/s | byte floor (ms) | floor / step | x bf16 |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        base = bf16.get(r["prefix"])
        ratio = f"{base['step_ms'] / r['step_ms']:.2f}x" if base else "-"
        lines.append(f"| {r['method']} | {r['prefix']} | {r['step_ms']:.2f} | {r['tokens_per_s']:.1f} | "
                     f"{r['floor_ms']:.2f} | {r['floor_over_step']:.2f} | {ratio} |")
    return "\n".join(lines)


def e2e_batch_table(d) -> str:
    """Batch sweep rows (tokens/s, peak memory, OOM) and the largest batch / best throughput per method."""
    rows = d.get("batch", [])
    lines = ["| method | batch | ms/step | tokens/s | peak GiB | floor / step |", "|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("oom"):
            lines.append(f"| {r['method']} | {r['batch']} | out of memory | | | |")
        elif "step_ms" in r:
            peak = (r.get("peak_bytes") or 0) / 2**30
            lines.append(f"| {r['method']} | {r['batch']} | {r['step_ms']:.2f} | {r['tokens_per_s']:.1f} | "
                         f"{peak:.1f} | {r['floor_over_step']:.2f} |")
    best = {}
    for r in rows:
        if "step_ms" in r:
            m = best.setdefault(r["method"], {"largest": 0, "tps": 0.0, "at": None, "oom": None})
            m["largest"] = max(m["largest"], r["batch"])
            if r["tokens_per_s"] > m["tps"]:
                m["tps"], m["at"] = r["tokens_per_s"], r["batch"]
        elif r.get("oom"):  # the smallest batch that ran out of memory
            m = best.setdefault(r["method"], {"largest": 0, "tps": 0.0, "at": None, "oom": None})
            m["oom"] = min(m["oom"] or r["batch"], r["batch"])
    lines.append("")
    for method, m in best.items():
        oom = f"out of memory at {m['oom']}" if m["oom"] else "no out-of-memory reached"
        lines.append(f"- {method}: largest batch run {m['largest']} ({oom}); best {m['tps']:.1f} tokens/s at "
                     f"B={m['at']}")
    return "\n".join(lines)


def e2e_prefill_table(d) -> str:
    """Whole-prompt prefill rows (seconds, tokens/s) against bf16 at the same prompt length."""
    rows = [r for r in d.get("prefill", []) if "seconds" in r]
    bf16 = {r["prefix"]: r for r in rows if r["method"] == "bf16"}
    lines = ["| method | prompt tokens | seconds | tokens/s | x bf16 |", "|---|---|---|---|---|"]
    for r in rows:
        base = bf16.get(r["prefix"])
        ratio = f"{base['seconds'] / r['seconds']:.2f}x" if base else "-"
        lines.append(f"| {r['method']} | {r['prefix']} | {r['seconds']:.3f} | {r['tokens_per_s']:.0f} | {ratio} |")
    return "\n".join(lines)


def generate_table(results) -> str:
    lines = ["| scheme | greedy tokens identical to bf16 | first difference at token |", "|---|---|---|"]
    for scheme in ("channel_key", "token_sym", "token_asym"):
        d = _load(results, f"generate_smollm2_cpu_{scheme}.json")
        if d:
            first = ", ".join(str(x) for x in d["first_difference"])
            lines.append(f"| {scheme} | {100 * d['agreement_with_bf16']:.1f}% | {first} |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--results", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = p.parse_args()
    for name in ("decode_kernel_h200.json", "decode_kernel_h200_v1.json"):
        d = _load(args.results, name)
        if d:
            print(f"{name}:\n\n{decode_table(d)}\n")
    for name in ("prefill_kernel_h200.json", "prefill_kernel_h200_32k.json"):
        d = _load(args.results, name)
        if d:
            print(f"{name}:\n\n{prefill_table(d)}\n")
    for name in ("e2e_after_queries_s46.json", "e2e_token_slot_s44.json", "e2e_blocks_per_sm_s44.json", "e2e_fused_qkv_s43.json", "e2e_query_prep_s43.json", "e2e_token_split_s42.json", "e2e_s42_b1.json", "e2e_bf16_attend_first_s42.json",
                 "e2e_mosaic_threshold_s42.json", "e2e_after_operand_s41.json",
                 "e2e_after_operand_reversed_s41.json", "e2e_merge_packed_s40.json"):  # gpu_e2e_variants.sh: one b1 table per source tree
        d = _load(args.results, name)
        for v in (d or {}).get("variants", []):
            if v.get("b1"):
                env = v["environment"]
                print(f"{name}, tree {v['tree']}: {env['device']}, jax {env['jax']}, {env['date'][:10]}\n")
                print(e2e_b1_table(v), "\n")
    for name in ("e2e_s46_b1.json", "e2e_s44_b1.json", "e2e_s44_batch_jit_init.json", "e2e_s44_batch_bf16_jit_init.json",
                 "e2e_s44_batch_hyquant.json", "e2e_s44_batch_bf16.json", "e2e_s43_b1.json", "e2e_s40_batch_bf16.json", "e2e_s40_batch_hyquant.json", "e2e_s39_b1.json",
                 "e2e_s39_stop_token.json", "e2e_h200_s37.json", "e2e_h200_s33.json",
                 "e2e_h200_s31.json", "e2e_h200_s29.json", "e2e_h200_s27.json", "e2e_h200_s26.json", "e2e_h200.json",
                 "e2e_h200_v1_kernel.json", "e2e_h200x2_qwen3_32b_tp2.json"):
        d = _load(args.results, name)
        if d:
            print(f"{name}: {_env_line(d)}\n")
            if d.get("b1"):
                print(e2e_b1_table(d), "\n")
            if d.get("batch"):
                print(f"Batch sweep at {d['batch'][0]['prefix']} cached tokens:\n")
                print(e2e_batch_table(d), "\n")
            if d.get("prefill"):
                print("Prefill (whole prompt, B=1, Freeze included for the quantized caches):\n")
                print(e2e_prefill_table(d), "\n")
    print(generate_table(args.results), "\n")
    for name in ("accuracy_smollm2.json", "accuracy_smollm2_retrieval_needle.json",
                 "accuracy_smollm2_retrieval_multikey_vartrack.json", "accuracy_smollm2_retrieval_multikey_4k.json",
                 "accuracy_smollm2_retrieval_vartrack_4k.json", "accuracy_smollm2_gpu.json",
                 "accuracy_smollm2_gpu_retrieval.json"):
        d = _load(args.results, name)
        if d:
            from benchmarks.accuracy import summary_markdown

            print(summary_markdown(d), "\n")


if __name__ == "__main__":
    main()
