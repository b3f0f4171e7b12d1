"""The results pages: `docs/results.md` and the README's headline table, from the canonical results files.

Each benchmark writes `benchmarks/results/<benchmark>_<device>.json` (+ a plot), overwritten by the next run of
the same command on that kind of device; this script reads only those files.

  python -m benchmarks.report              # rewrite docs/results.md
  python -m benchmarks.report --check      # exit 1 if docs/results.md or the README's headline is out of date
  python -m benchmarks.report --headline   # print the README's headline table
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
RESULTS_PAGE = os.path.join(ROOT, "docs", "results.md")
README = os.path.join(ROOT, "README.md")
# benchmark names, longest first where one is a prefix of another
BENCHMARKS = ("decode_kernel", "prefill_kernel", "chunked_prefill_attention", "e2e", "read_bandwidth",
              "accuracy_retrieval", "accuracy", "generate", "ab")


def result_files(results: str = RESULTS) -> dict[str, dict[str, str]]:
    """{benchmark: {device: path}} of the canonical files `<benchmark>_<device>.json`."""
    found: dict[str, dict[str, str]] = {}
    for path in sorted(glob.glob(os.path.join(results, "*.json"))):
        stem = os.path.basename(path)[:-5]
        for name in BENCHMARKS:
            if stem.startswith(name + "_"):
                found.setdefault(name, {})[stem[len(name) + 1:]] = path
                break
    return found


def _load(path: str) -> dict:
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
    parts = [c for c in d.get("combined_from") or [] if isinstance(c, dict)] or [env]
    commands = "; ".join(f"`{c['command']}`" for c in parts)
    if d.get("combined_from") and parts == [env]:  # older files name their parts' files only
        commands += f" and {len(d['combined_from']) - 1} more (parts: {', '.join(d['combined_from'])})"
    return (f"{where}, jax {env['jax']}, {env['date'][:10]}, model {d.get('model_name', '?')} "
            f"({d['params'] / 1e9:.2f}B params, random bf16 weights); one process per command: {commands}.")


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




def chunked_prefill_table(d) -> str:
    """Chunked prefill's attention over one layer's whole prompt, seconds per variant."""
    a, env = d["args"], d["environment"]
    lines = [f"{env['device']}, jax {env['jax']}, {env['date'][:10]}, `{env['command']}`: B {a['batch']}, "
             f"Hq/Hkv {a['heads']}/{a['kv_heads']}, D {a['head_dim']}, a {a['prompt']}-token prompt in "
             f"{a['chunk']}-token chunks; relative L2 difference of the fused kernel's last chunk "
             f"{d['triton_rel_diff']:.1e}.", "", "| variant | key block | key slots read | seconds | x blocks |",
             "|---|---|---|---|---|"]
    for r in d["rows"]:
        x = d["x_blocks"].get(r["variant"])
        lines.append(f"| {r['variant']} | {r['key_block']} | {r['slots_read']} | {r['seconds']:.4f} | "
                     f"{f'{x:.2f}' if x is not None else '1.00'} |")
    return "\n".join(lines)


def read_bandwidth_line(d) -> str:
    env, rb = d["env"], d["read_bandwidth"]
    forms = ", ".join(f"{k} {v:.2f}" for k, v in rb["tb_s"].items())
    return (f"{env['device']}, jax {env['jax']}, {env['date'][:10]}, `{env['command']}`: best {rb['best']:.2f} TB/s "
            f"({forms} TB/s; {rb['bytes'][next(iter(rb['bytes']))] / 2**30:.2f} GiB read per call).")


def generate_table(files: dict[str, str]) -> str:
    """Greedy agreement of `hyquant generate` with bf16, one file per key scheme (`generate_<scheme>_cpu.json`)."""
    lines = ["| scheme | greedy tokens identical to bf16 | first difference at token | command |", "|---|---|---|---|"]
    for name, path in sorted(files.items()):
        d = _load(path)
        first = ", ".join(str(x) for x in d["first_difference"])
        lines.append(f"| {d['config']['scheme']} | {100 * d['agreement_with_bf16']:.1f}% | {first} | "
                     f"`{d['environment']['command']}` ({d['environment']['device']}, jax {d['environment']['jax']}, "
                     f"{d['environment']['date'][:10]}) |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------- headline


def _device_label(env_device: str) -> str:
    return "H100" if "H100" in env_device else "H200" if "H200" in env_device else env_device


def _e2e_ratios(d) -> dict:
    """B=1 step-time ratios bf16 / hyquant per prefix, and the batch sweep's largest batch and best tokens/s."""
    b1 = {(r["method"], r["prefix"]): r["step_ms"] for r in d.get("b1", []) if "step_ms" in r}
    out = {"b1": {p: b1[("bf16", p)] / b1[("hyquant", p)] for (m, p) in b1 if m == "hyquant" and ("bf16", p) in b1}}
    best = {}
    for r in d.get("batch", []):
        if "step_ms" in r:
            m = best.setdefault(r["method"], {"largest": 0, "tps": 0.0})
            m["largest"], m["tps"] = max(m["largest"], r["batch"]), max(m["tps"], r["tokens_per_s"])
    if {"bf16", "hyquant"} <= set(best):
        out["largest"] = (best["hyquant"]["largest"], best["bf16"]["largest"])
        out["tps"] = best["hyquant"]["tps"] / best["bf16"]["tps"]
    return out


def _met(ok: bool) -> str:
    return "met" if ok else "**missed**"


def headline_rows(results: str = RESULTS) -> list[list[str]]:
    """The README's headline rows: [what, GPU, measured, goal, status, jax, date]."""
    files, rows = result_files(results), []
    bytes_row = False  # the cache's size is the same on every device: one row, from the first file with B1 32K
    for dev, path in files.get("decode_kernel", {}).items():
        d = _load(path)
        env, cases = d["env"], {r["case"].split(" ", 1)[1]: r for r in d["cases"]}
        c32 = cases.get("B1 32K")
        if c32 and not bytes_row:
            bytes_row = True
            ratio = c32["bytes"]["bf16"] / c32["bytes"]["hybrid"]
            rows.append(["KV cache bytes at 32K (K4V4, rho 5%, W 128)", "any", f"{ratio:.2f}x smaller than bf16",
                         ">= 3x smaller", _met(ratio >= 3.0), env["jax"], env["date"][:10]])
        got = [(k, cases[k]["hybrid"]["speedup_vs_best_bf16"]) for k in ("B1 32K", "B1 128K", "B16 32K") if k in cases]
        rows.append(["decode attention kernel vs the best bf16 kernel (cuDNN, Pallas, XLA)",
                     _device_label(env["device"]), " / ".join(f"{x:.2f}x at {k}" for k, x in got),
                     ">= 3x at long context",
                     _met(all(x >= 3.0 for _, x in got[1:])), env["jax"], env["date"][:10]])
    for dev, path in files.get("prefill_kernel", {}).items():
        d = _load(path)
        got = [(f"{int(t) // 1024}K", d["summary"][t]["hybrid_e2e_mosaic_speedup_vs_cudnn"]) for t in ("16384", "32768")
               if d["summary"].get(t, {}).get("hybrid_e2e_mosaic_speedup_vs_cudnn")]
        if got:
            rows.append(["prefill attention (VTI included) vs cuDNN bf16", _device_label(d["device"]),
                         " / ".join(f"{x:.2f}x at {k}" for k, x in got), ">= 1.5x from 16K",
                         _met(all(x >= 1.5 for _, x in got)), d["jax"], d["date"][:10]])
    for dev, path in sorted(files.get("e2e", {}).items()):
        d = _load(path)
        if d.get("mesh"):
            continue
        env, r = d["environment"], _e2e_ratios(d)
        b1 = r["b1"]
        if 32768 in b1 and 131072 in b1:
            rows.append(["end-to-end decode step at B=1 (Qwen3-8B shape), x bf16", _device_label(env["device"]),
                         f"{b1[32768]:.2f}x at 32K, {b1[131072]:.2f}x at 128K", ">= 1.15x / >= 1.5x",
                         f"{_met(b1[32768] >= 1.15)} / {_met(b1[131072] >= 1.5)}", env["jax"], env["date"][:10]])
        if "tps" in r:
            hq, bf = r["largest"]
            dates = [c["date"] for c in d.get("combined_from") or [] if isinstance(c, dict) and "batch" in c["command"]]
            rows.append(["32K decode throughput / largest batch, x bf16", _device_label(env["device"]),
                         f"{r['tps']:.2f}x / {hq / bf:.2f}x ({hq} vs {bf})", ">= 2x / >= 3x",
                         f"{_met(r['tps'] >= 2.0)} / {_met(hq / bf >= 3.0)}", env["jax"],
                         max(dates or [env["date"]])[:10]])
    acc, ret = files.get("accuracy", {}), files.get("accuracy_retrieval", {})
    for dev, path in acc.items():
        if dev == "cpu" and len(acc) > 1:
            continue
        d = _load(path)
        ppl = d["targets"]["perplexity_within_1pct"]["value"]
        text, ok = f"perplexity {100 * ppl:+.2f}%", ppl <= 0.01
        goal = "within 1%"
        if dev in ret:
            rt = _load(ret[dev])["targets"]["retrieval_within_2_points"]
            text += f", retrieval {rt['value']:+.2f} points ({rt['samples']} samples)"
            ok, goal = ok and rt["met"], "within 1% / 2 points"
        rows.append(["accuracy vs bf16, SmolLM2-135M (WikiText-2, RULER-style retrieval)",
                     _device_label(d["env"]["device"]), text, goal, _met(ok), d["env"]["jax"], d["env"]["date"][:10]])
    return rows


def headline_table(results: str = RESULTS) -> str:
    lines = ["| what | GPU | measured | goal | status | jax | date |", "|---|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(r) + " |" for r in headline_rows(results)]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------- A/B


def ab_record(base_dir: str, new_dir: str, base_label: str) -> dict:
    """One record of `bash benchmarks/gpu.sh ab BASE`: the decode kernel's and the e2e step's times of the tree at
    BASE and of this one, run one after the other in one call on one card (the files each tree's run wrote)."""
    def load_all(folder):
        return {os.path.basename(p)[:-5]: _load(p) for p in sorted(glob.glob(os.path.join(folder, "*.json")))}

    base, new = load_all(base_dir), load_all(new_dir)
    rows = []
    for name in sorted(set(base) & set(new)):
        b, n = base[name], new[name]
        if "cases" in b:  # decode_kernel
            bc = {r["case"]: r for r in b["cases"]}
            for r in n["cases"]:
                if r["case"] in bc and "loop_ms" in r["hybrid"] and "loop_ms" in bc[r["case"]]["hybrid"]:
                    rows.append({"benchmark": "decode_kernel", "what": f"hybrid {r['case']}",
                                 "base_ms": bc[r["case"]]["hybrid"]["loop_ms"], "new_ms": r["hybrid"]["loop_ms"]})
        for section in ("b1", "batch"):  # e2e
            bs = {(r["method"], r["prefix"], r["batch"]): r for r in b.get(section, []) if "step_ms" in r}
            for r in n.get(section, []):
                key = (r["method"], r["prefix"], r["batch"])
                if "step_ms" in r and key in bs:
                    rows.append({"benchmark": "e2e", "what": f"{r['method']} B{r['batch']} {r['prefix']}",
                                 "base_ms": bs[key]["step_ms"], "new_ms": r["step_ms"]})
    env = next((d.get("env") or d.get("environment") for d in new.values()), {}) or {}
    return {"env": env, "base": base_label, "rows": rows,
            "commands": {name: (d.get("env") or d.get("environment") or {}).get("command") for name, d in new.items()}}


def ab_table(d) -> str:
    env = d["env"]
    lines = [f"{env.get('device')}, jax {env.get('jax')}, {str(env.get('date'))[:10]}: this tree against "
             f"`{d['base']}`, one process per tree and benchmark, run back to back on one card (commands in the "
             "JSON).", "",
             "| benchmark | what | base ms | new ms | new / base |", "|---|---|---|---|---|"]
    for r in d["rows"]:
        lines.append(f"| {r['benchmark']} | {r['what']} | {r['base_ms']:.4f} | {r['new_ms']:.4f} | "
                     f"{r['new_ms'] / r['base_ms']:.3f} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------- the page


def results_page(results: str = RESULTS) -> str:
    """docs/results.md: every canonical results file as tables, with its device, jax version, date and command."""
    files = result_files(results)
    out = ["# Measured results", "",
           "Generated by `python -m benchmarks.report` from `benchmarks/results/<benchmark>_<device>.json`; do not "
           "edit by hand. Speed ratios compare methods measured in one process (kernels) or one call (end to end) on "
           "one card. `docs/design.md` explains the decisions these numbers made.", "", "## Summary", "",
           headline_table(results), ""]

    def section(title, how):
        out.extend([f"## {title}", "", how, ""])

    if "decode_kernel" in files:
        section("Decode attention kernel", "`python -m benchmarks.decode_kernel`: one layer, per call inside a jitted "
                "loop; the hybrid cache against cuDNN, JAX's Pallas `decode_attention.gqa` and XLA on the same inputs.")
        for dev, path in files["decode_kernel"].items():
            out += [decode_table(_load(path)), ""]
    if "prefill_kernel" in files:
        section("Prefill kernel", "`python -m benchmarks.prefill_kernel`: causal prefill of one layer, B=1.")
        for dev, path in files["prefill_kernel"].items():
            out += [prefill_table(_load(path)), ""]
    if "chunked_prefill_attention" in files:
        section("Chunked prefill attention", "`python -m benchmarks.chunked_prefill_attention`: one layer's attention "
                "over a long prompt prefilled in chunks.")
        for dev, path in files["chunked_prefill_attention"].items():
            out += [chunked_prefill_table(_load(path)), ""]
    if "e2e" in files:
        section("End to end", "`python -m benchmarks.e2e`: a Qwen3-shaped model with random bf16 weights, the same "
                "jitted decode loop for every method; one process per method and section.")
        for dev, path in files["e2e"].items():
            d = _load(path)
            out += [f"### {dev}", "", _env_line(d), ""]
            if d.get("b1"):
                out += ["Decode at B=1:", "", e2e_b1_table(d), ""]
            if d.get("batch"):
                out += [f"Batch sweep at {d['batch'][0]['prefix']} cached tokens:", "", e2e_batch_table(d), ""]
            if d.get("prefill"):
                out += ["Prefill (whole prompt, B=1, Freeze included for the quantized caches):", "",
                        e2e_prefill_table(d), ""]
    if "read_bandwidth" in files:
        section("Read bandwidth", "`python -m benchmarks.read_bandwidth`: the yardstick for byte floors.")
        out += ["- " + read_bandwidth_line(_load(p)) for p in files["read_bandwidth"].values()] + [""]
    if "generate" in files:
        section("Greedy agreement with bf16 by key scheme", "`hyquant generate --scheme S --json FILE` on the default "
                "model and prompt.")
        out += [generate_table(files["generate"]), ""]
    if "ab" in files:
        section("Against earlier code", "`bash benchmarks/gpu.sh ab BASE`: speed of this tree against an earlier "
                "checkout on one card. Single-layer kernel timings move by a few percent between processes (the "
                "bf16 baselines of the same two processes moved by up to 9% here); the end-to-end step of 36 "
                "layers is the steadier comparison.")
        for dev, path in files["ab"].items():
            out += [ab_table(_load(path)), ""]
    from benchmarks.accuracy.summary import summary_markdown

    for key in ("accuracy", "accuracy_retrieval"):
        for dev, path in files.get(key, {}).items():
            out += [summary_markdown(_load(path)), ""]
    return "\n".join(out).rstrip() + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default=RESULTS)
    p.add_argument("--check", action="store_true", help="exit 1 if docs/results.md or the README's headline table "
                                                        "differ from what the results files give")
    p.add_argument("--headline", action="store_true", help="print the README's headline table")
    p.add_argument("--ab", nargs=3, metavar=("BASE_DIR", "NEW_DIR", "BASE_LABEL"),
                   help="write results/ab_<device>.json from the two folders `gpu.sh ab` wrote, and exit")
    args = p.parse_args(argv)
    if args.ab:
        from benchmarks.common import slug, write_json

        record = ab_record(*args.ab)
        name = f"ab_{slug(record['env'].get('device') or 'unknown', record['env'].get('platform') or 'gpu')}"
        write_json(os.path.join(args.results, name + ".json"), record)
        print(ab_table(record))
        return 0
    if args.headline:
        print(headline_table(args.results))
        return 0
    page = results_page(args.results)
    if args.check:
        with open(RESULTS_PAGE) as f:
            stale = f.read() != page
        with open(README) as f:
            stale_readme = headline_table(args.results) not in f.read()
        for what, bad in (("docs/results.md", stale), ("README.md's headline table", stale_readme)):
            if bad:
                print(f"{what} is out of date: run `python -m benchmarks.report` (and paste `--headline` into the "
                      "README)", file=sys.stderr)
        return int(stale or stale_readme)
    os.makedirs(os.path.dirname(RESULTS_PAGE), exist_ok=True)
    with open(RESULTS_PAGE, "w") as f:
        f.write(page)
    print(f"wrote {os.path.relpath(RESULTS_PAGE, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
