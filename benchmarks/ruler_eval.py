"""RULER-style accuracy of every KV-cache method on a long-context model: exact match, answer log-likelihood,
top-1 and KL divergence from bf16, bytes per cached token, paired bootstrap intervals.

  python -m benchmarks.ruler_eval --model qwen2.5-coder-0.5b --pilot --lengths 4096 --samples 20 --out DIR
  python -m benchmarks.ruler_eval --model qwen2.5-coder-0.5b --cells DIR/pilot.json --samples 100 --out DIR
  python -m benchmarks.ruler_eval --model qwen2.5-coder-0.5b --out DIR --summary-only

Every prompt (`benchmarks._ruler_tasks`) is prefilled once, exactly (bf16 KV, the compute dtype's attention,
VTI picking HyQuant's VL set from the tail queries: what `generate`'s chunked prefill does); each method then
freezes its own cache from the shared prompt keys/values (`hyquant_jax.eval.decode_states`) and

* generates greedily from the prefill's first token (the task's budget; scored by the task's string match),
* teacher-forces the gold answer through its decode path: log-likelihood of each answer token, whether it is
  the argmax, and KL(bf16 || method) of the next-token distributions.

The first answer token comes from the shared prefill's logits, so it is the same for every method (KL 0): a
cache acts from the second answer token on.

Methods (all on the jnp reference path, bf16 cache): bf16; fp8 (e4m3 K/V, per-token scale); uniform8/4/2
(per-token symmetric, no window); kivi4/2 (per-channel keys, 128-token residual); hyquant_kXvY (default
HyQuantConfig: channel_key, rho 5%, W 128). Equal-byte controls, sized at each prompt length to the bytes per
token of a HyQuant setting: kivi<B>_eq_kXvY (KIVI with its residual window grown) and hyquant_kXvY_rho0_eq_kXvY
(HyQuant without VL tokens, its window grown): whether the VL choice, not the extra bf16 tokens, does the work.

Results: one JSON line per (prompt, method) appended to DIR/records.jsonl (a rerun skips what is there); the
summary (per length and method, with intervals against bf16 and of HyQuant K4V4 against every other method) in
--summary (default benchmarks/results/accuracy_<model>_<device>.json). --pilot runs bf16 only and writes
DIR/pilot.json: the bf16 score of each (task, length) cell and the cells in the 40-95% band that a full run
takes with --cells.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import re
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks import _ruler_tasks as ruler
from benchmarks._ruler_stats import paired_bootstrap

HYQUANT_BITS = ("k4v4", "k4v2", "k2v4", "k2v2")
METHODS = ("bf16", "fp8", "uniform8", "uniform4", "uniform2", "kivi4", "kivi2",
           *(f"hyquant_{b}" for b in HYQUANT_BITS), "kivi4_eq_k4v4", "hyquant_k4v4_rho0_eq_k4v4")
REFERENCE, HEADLINE = "bf16", "hyquant_k4v4"
_HYQUANT = re.compile(r"hyquant_k([248])v([248])$")
_KIVI_EQ = re.compile(r"kivi([248])_eq_k([248])v([248])$")
_WINDOW_EQ = re.compile(r"hyquant_k([248])v([248])_rho0_eq_k([248])v([248])$")
RECORDS, PILOT = "records.jsonl", "pilot.json"
GEN_BUCKET = 32  # greedy budgets and teacher-forced lengths are padded to a multiple of this (fewer compiles)
METRICS = ("score", "exact", "logprob", "top1", "kl")


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def check_method(name: str) -> str:
    """name if it is a method this script knows (METHODS, or any bits in the equal-byte patterns), else ValueError."""
    known = (name in ("bf16", "fp8", "uniform8", "uniform4", "uniform2", "kivi4", "kivi2")
             or any(p.match(name) for p in (_HYQUANT, _KIVI_EQ, _WINDOW_EQ)))
    if not known:
        raise ValueError(f"--methods: unknown method {name!r}; choose from {', '.join(METHODS)} (or other bits in "
                         "kivi<B>_eq_k<X>v<Y>, hyquant_k<X>v<Y>_rho0_eq_k<X>v<Y>)")
    return name


# --------------------------------------------------------------------------- methods


def _hyquant(key_bits: int, value_bits: int, **kw):
    from hyquant_jax.config import HyQuantConfig

    return HyQuantConfig(key_bits=key_bits, value_bits=value_bits, **kw)


@functools.cache
def layer_bytes(config, length: int, kv_heads: int, head_dim: int) -> int:
    """Used bytes (`HybridKVCache.used_bytes`) of one layer's cache frozen from a `length`-token prompt with
    as many VL tokens as VTI picks there."""
    import jax
    import jax.numpy as jnp

    from hyquant_jax.cache import freeze
    from hyquant_jax.vti import max_vl_count

    k, v = (jax.random.normal(key, (1, kv_heads, length, head_dim), jnp.bfloat16)
            for key in jax.random.split(jax.random.PRNGKey(0)))
    count = max_vl_count(length, config)
    vl = (jnp.broadcast_to(jnp.arange(count, dtype=jnp.int32), (1, kv_heads, count)), jnp.array([count], jnp.int32))
    cache = freeze(k, v, jnp.array([length], jnp.int32), None, config, length, vl=vl)
    return int(cache.used_bytes(config)[0])


def equal_byte_config(control, target, length: int, kv_heads: int, head_dim: int):
    """`control` with the window (a multiple of its block size, below `length`) whose cache bytes at `length`
    come closest to `target`'s. A window step moves a whole block from the low-bit pages to the bf16 ring, so
    the bytes are affine in the window: two sizes give the slope."""
    goal = layer_bytes(target, length, kv_heads, head_dim)
    step = max(control.block_size, control.prefill_block)
    base = layer_bytes(control, length, kv_heads, head_dim)
    slope = layer_bytes(dataclasses.replace(control, window=control.window + step), length, kv_heads,
                        head_dim) - base
    steps = round((goal - base) / slope) if slope > 0 else 0
    window = min(max(control.window + steps * step, 0), (length - 1) // step * step)
    return dataclasses.replace(control, window=window)


def make_method(name: str, length: int, model_cfg, cache_dtype):
    """The attention implementation of a method at a prompt length (the equal-byte controls depend on it)."""
    from hyquant_jax.model_attention import (
        FP8CacheAttention,
        HybridAttention,
        QuantizedCacheAttention,
        kivi_config,
        make_attention,
    )
    from models.attention import BF16Attention

    check_method(name)
    if name == "bf16":
        return BF16Attention(cache_dtype=cache_dtype, f32_probs=True)
    if name == "fp8":
        return FP8CacheAttention(cache_dtype, f32_probs=True)
    if m := _HYQUANT.match(name):
        return HybridAttention(_hyquant(int(m[1]), int(m[2])), backend="reference", cache_dtype=cache_dtype)
    heads, dim = model_cfg.num_kv_heads, model_cfg.head_dim
    if m := _KIVI_EQ.match(name):
        config = equal_byte_config(kivi_config(int(m[1])), _hyquant(int(m[2]), int(m[3])), length, heads, dim)
        return QuantizedCacheAttention(config, cache_dtype, name=name, f32_probs=True)
    if m := _WINDOW_EQ.match(name):
        control = _hyquant(int(m[1]), int(m[2]), rho=0.0)
        config = equal_byte_config(control, _hyquant(int(m[3]), int(m[4])), length, heads, dim)
        return HybridAttention(config, backend="reference", cache_dtype=cache_dtype)
    return dataclasses.replace(make_attention(name, cache_dtype=cache_dtype), f32_probs=True)


def describe(attention) -> str:
    config = getattr(attention, "config", None)
    if config is None:
        return type(attention).__name__
    return (f"{type(attention).__name__} K{config.key_bits}V{config.value_bits} {config.scheme}, window "
            f"{config.window}, block {config.block_size}, rho {config.rho:g}")


def shared_prefill(cache_dtype):
    """The one prefill every method shares: exact attention, HyQuant's default VL set chosen from the tail."""
    from hyquant_jax.eval import prefill_flavor
    from hyquant_jax.model_attention import HybridAttention

    return prefill_flavor(HybridAttention(_hyquant(4, 4), backend="reference"), cache_dtype, exact=True)


def method_states(attention, kvs: tuple, lengths, max_len: int, prefill) -> tuple:
    """The method's decode states frozen from the shared prompt K/V. A HyQuant config without VL tokens (rho 0)
    gets none; any other must pick its VL set as the shared prefill did."""
    from hyquant_jax.eval import decode_states
    from hyquant_jax.model_attention import HybridAttention, empty_vl

    if isinstance(attention, HybridAttention):
        config = attention.config
        if config.rho == 0:
            kvs = tuple(dataclasses.replace(kv, vl_idx=empty_vl(*kv.k.shape[:2])[0],
                                            vl_count=empty_vl(*kv.k.shape[:2])[1]) for kv in kvs)
        elif (config.rho, config.window, config.prefill_block) != (prefill.config.rho, prefill.config.window,
                                                                   prefill.config.prefill_block):
            raise ValueError(f"{describe(attention)} picks another VL set than the shared prefill")
    return decode_states(attention, kvs, lengths, max_len)


# --------------------------------------------------------------------------- one prompt


def gold_continuation(sample: ruler.RulerSample) -> str:
    """The answer as the model should continue the prompt's answer prefix."""
    if sample.task == "copy_span":
        return " " + sample.answers[0]
    return " " + ", ".join(sample.answers) + "."


def _bucket(n: int) -> int:
    return -(-n // GEN_BUCKET) * GEN_BUCKET


def sample_key(sample: ruler.RulerSample) -> str:
    """The haystack of a prompt: the bootstrap's unit (one question per haystack for now)."""
    return f"{sample.task}/{sample.length}/{sample.index}"


def evaluate_sample(model_def, weights, tokenizer, eos: tuple[int, ...], sample: ruler.RulerSample, methods,
                    attentions: dict, prefill, max_new_cap: int | None = None) -> list[dict]:
    """Records of `methods` on one prompt (see the module docstring). attentions: {method: attention} for
    `methods` and bf16, whose teacher forcing runs whenever a method needs its distributions for the KL, even
    when bf16 itself is not in `methods`. max_new_cap: a cap on the task's greedy budget."""
    import jax
    import jax.numpy as jnp

    from hyquant_jax.eval import greedy_and_forced, run_prefill

    n = len(sample.prompt)
    gold = tokenizer.encode(gold_continuation(sample), special=False)
    budget = sample.max_new_tokens if max_new_cap is None else min(max_new_cap, sample.max_new_tokens)
    steps = _bucket(max(budget - 1, len(gold) - 1, 1))  # greedy: `first` + steps tokens; forced: gold[:-1]
    tokens = np.full((1, sample.length), tokenizer.pad_id or 0, np.int32)
    tokens[0, :n] = sample.prompt
    lengths = jnp.array([n], jnp.int32)
    t0 = time.perf_counter()
    logits, kvs = run_prefill(model_def, weights, jnp.asarray(tokens), lengths, prefill=prefill)
    first_logp = np.asarray(jax.nn.log_softmax(logits[0].astype(jnp.float32)))
    prefill_s = time.perf_counter() - t0
    first = jnp.argmax(logits[0]).astype(jnp.int32)
    forced = np.full((steps,), gold[-1], np.int32)
    forced[:len(gold) - 1] = gold[:-1]

    def run(att):
        """(greedy ids cut at EOS and the budget, log-probs [len(gold), V] at the gold tokens' positions,
        (used, allocated) bytes of the frozen cache: `used_bytes` at the prompt's length, the arrays' nbytes)."""
        states = method_states(att, kvs, lengths, sample.length + steps + 1, prefill)
        used = sum(int(att.used_bytes(s, np.array([n]))[0]) for s in states)
        allocated = sum(x.nbytes for x in jax.tree_util.tree_leaves(states))
        greedy, logp = greedy_and_forced(model_def, weights, states, first, jnp.asarray(forced), lengths[0],
                                         attention=att)
        ids = np.asarray(greedy)[:budget].tolist()
        ids = ids[:next((i for i, t in enumerate(ids) if t in eos), len(ids))]
        return ids, np.concatenate([first_logp[None], np.asarray(logp[:len(gold) - 1])]), (used, allocated)

    order = sorted(methods, key=lambda m: m != REFERENCE)
    reference = run(attentions[REFERENCE])[1] if REFERENCE not in order else None
    records = []
    for name in order:
        att = attentions[name]
        t0 = time.perf_counter()
        ids, rows, (used, allocated) = run(att)
        decode_s = time.perf_counter() - t0
        if name == REFERENCE:
            reference = rows
        text = tokenizer.decode(ids)
        score = ruler.score(sample, text)
        kl = np.sum(np.exp(reference) * (reference - rows), axis=-1)
        records.append({
            "key": sample_key(sample), "task": sample.task, "length": sample.length, "index": sample.index,
            "method": name, "config": describe(att), "prompt_tokens": n, "answer_tokens": len(gold),
            "score": score, "exact": float(score == 1.0), "output": text,
            "answer_logprob": rows[np.arange(len(gold)), gold].tolist(),
            "answer_top1": (rows.argmax(axis=-1) == np.asarray(gold)).tolist(),
            "answer_kl": np.maximum(kl, 0.0).tolist(), "bytes_per_token": used / n,
            "allocated_bytes_per_token": allocated / n,
            "decode_steps": steps, "prefill_s": prefill_s, "decode_s": decode_s})
    return records


# --------------------------------------------------------------------------- records


def read_records(path: Path) -> list[dict]:
    """Every complete JSON line of a records file (a line cut short by a killed run is skipped)."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def append_records(path: Path, records: list[dict]) -> None:
    with open(path, "a") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        f.flush()


def sample_metrics(record: dict) -> dict:
    """A record's per-prompt metrics: score, exact, mean answer log-prob, share of answer tokens at the argmax,
    mean KL over the answer tokens from the second on (the first is the shared prefill's; 0 with one token)."""
    kl = record["answer_kl"][1:]
    return {"score": record["score"], "exact": record["exact"], "logprob": float(np.mean(record["answer_logprob"])),
            "top1": float(np.mean(record["answer_top1"])), "kl": float(np.mean(kl)) if kl else 0.0}


def _interval(records_a: dict, records_b: dict, metric: str) -> dict | None:
    """Paired bootstrap of metric(a) - metric(b) over the prompts both ran ({key: record} each); b is a itself
    for an interval of metric(a) alone (the KL, already a difference from bf16)."""
    keys = sorted(set(records_a) & set(records_b))
    if not keys:
        return None
    a = [sample_metrics(records_a[k])[metric] for k in keys]
    b = [0.0] * len(keys) if records_b is records_a else [sample_metrics(records_b[k])[metric] for k in keys]
    return paired_bootstrap(a, b, groups=keys)


def summarize(records: list[dict]) -> dict:
    """Per prompt length and method: means of the metrics, bytes per token, per-task scores, and paired 95%
    intervals of method - bf16 and of hyquant_k4v4 - method (over the prompts both ran)."""
    by: dict = {}
    for r in records:
        by.setdefault(r["length"], {}).setdefault(r["method"], {})[r["key"]] = r
    out = {}
    for length, methods in sorted(by.items()):
        cell = {}
        for name, rows in methods.items():
            metrics = [sample_metrics(r) for r in rows.values()]
            entry = {"samples": len(rows), "config": next(iter(rows.values()))["config"],
                     **{m: float(np.mean([x[m] for x in metrics])) for m in METRICS},
                     "bytes_per_token": float(np.mean([r["bytes_per_token"] for r in rows.values()])),
                     "by_task": {t: float(np.mean([r["score"] for r in rows.values() if r["task"] == t]))
                                 for t in sorted({r["task"] for r in rows.values()})},
                     "decode_s_median": float(np.median([r["decode_s"] for r in rows.values()]))}
            if REFERENCE in methods and name != REFERENCE:
                entry["minus_bf16"] = {m: _interval(rows, methods[REFERENCE], m) for m in METRICS if m != "kl"}
                entry["kl_interval"] = _interval(rows, rows, "kl")
            if HEADLINE in methods and name != HEADLINE:
                entry["hyquant_k4v4_minus"] = {m: _interval(methods[HEADLINE], rows, m) for m in METRICS}
            cell[name] = entry
        out[str(length)] = cell
    return out


def pilot_cells(records: list[dict], low: float = 0.40, high: float = 0.95) -> dict:
    """bf16's mean score per (task, length) and the cells `_ruler_tasks.select_cells` keeps."""
    scores: dict = {}
    for r in records:
        if r["method"] == REFERENCE:
            scores.setdefault((r["task"], r["length"]), []).append(r["score"])
    keep = ruler.select_cells(scores, low, high)
    return {"band": [low, high],
            "cells": [{"task": t, "length": n, "samples": len(v), "bf16_score": float(np.mean(v))}
                      for (t, n), v in sorted(scores.items())],
            "selected": [[t, n] for t, n in keep]}


# --------------------------------------------------------------------------- command line


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="registered name, HF folder or .gguf (default: the default model)")
    p.add_argument("--lengths", default="4096", help="comma list of prompt lengths in tokens")
    p.add_argument("--samples", type=int, default=20, help="prompts per (task, length) cell")
    p.add_argument("--tasks", default=",".join(ruler.TASKS), help=f"comma list of {', '.join(ruler.TASKS)}")
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma list (default: {', '.join(METHODS)})")
    p.add_argument("--cells", type=Path, default=None,
                   help="a pilot.json: run only its selected (task, length) cells (instead of --tasks x --lengths)")
    p.add_argument("--out", type=Path, required=True, help="folder of records.jsonl (appended) and pilot.json")
    p.add_argument("--summary", type=Path, default=None,
                   help="summary JSON (default: benchmarks/results/accuracy_<model>_<device>.json)")
    p.add_argument("--pilot", action="store_true", help="bf16 only; write pilot.json with the cells to keep")
    p.add_argument("--summary-only", action="store_true", help="write the summary of the records in --out and exit")
    p.add_argument("--essays", type=Path, default=None, help="folder of essays (*.txt) (default: the data folder's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompts")
    p.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float32"),
                   help="weights and activations (auto: float32 on CPU, bfloat16 on GPU); the KV cache is bf16")
    p.add_argument("--max-new-tokens", type=int, default=None, help="cap on every task's greedy budget")
    args = p.parse_args(argv)
    try:
        args.lengths = tuple(int(x) for x in _names(args.lengths))
    except ValueError:
        p.error(f"--lengths must be a comma list of integers, got {args.lengths!r}")
    if not args.lengths or min(args.lengths) < 64:
        p.error(f"--lengths must hold lengths >= 64 tokens, got {args.lengths}")
    args.tasks = _names(args.tasks)
    if bad := [t for t in args.tasks if t not in ruler.TASKS]:
        p.error(f"--tasks: unknown {bad}; choose from {ruler.TASKS}")
    try:
        args.methods = (REFERENCE,) if args.pilot else tuple(check_method(m) for m in _names(args.methods))
    except ValueError as e:
        p.error(str(e))
    if args.samples < 1:
        p.error(f"--samples must be >= 1, got {args.samples}")
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        p.error(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.cells is not None and not args.cells.is_file():
        p.error(f"--cells: file not found: {args.cells}")
    return args


def model_slug(model) -> str:
    name = Path(str(model)).stem if model else "smollm2-135m"
    return re.sub(r"[^a-z0-9.]+", "-", name.lower()).strip("-")


def write_summary(args, records: list[dict]) -> Path:
    from benchmarks.common import default_name, environment, write_json

    path = args.summary or Path(__file__).resolve().parent / "results" / (
        default_name(f"accuracy_{model_slug(args.model)}") + ".json")
    write_json(str(path), {"env": environment(), "model": str(args.model), "records": str(args.out / RECORDS),
                           "prompts": len({r["key"] for r in records}),
                           "metrics": {"score": "share of gold strings found (copy_span: of the passage's words)",
                                       "exact": "score == 1", "logprob": "mean log-prob of the gold answer tokens "
                                       "(teacher-forced)", "top1": "share of gold answer tokens at the argmax",
                                       "kl": "mean KL(bf16 || method) over answer tokens 2.."},
                           "intervals": "paired percentile bootstrap over haystacks, 95%, 2000 resamples",
                           "lengths": summarize(records)})
    return path


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    records_path = args.out / RECORDS
    if args.summary_only:
        print(f"summary: {write_summary(args, read_records(records_path))}")
        return 0
    import jax
    import jax.numpy as jnp

    from benchmarks.accuracy.settings import DEFAULT_ESSAYS
    from models import split_model
    from models.checkpoint import load_model

    dtype = (jnp.bfloat16 if jax.default_backend() == "gpu" else jnp.float32) if args.dtype == "auto" else args.dtype
    with jax.default_matmul_precision("highest"):
        model, tokenizer = load_model(args.model, dtype)
        model_def, weights = split_model(model)
        corpus = ruler.Corpus.from_folder(args.essays or DEFAULT_ESSAYS, tokenizer)
        cells = ([tuple(c) for c in json.loads(args.cells.read_text())["selected"]] if args.cells
                 else [(t, n) for t in args.tasks for n in args.lengths])
        done = {(r["key"], r["method"]) for r in read_records(records_path)}
        cache_dtype, prefill = jnp.bfloat16, shared_prefill(jnp.bfloat16)
        eos = tuple(tokenizer.eos_ids or model.config.eos_token_ids)
        attentions = {}
        for index in range(args.samples):  # sample-major: a run stopped early has covered every cell alike
            for task, length in cells:
                sample = ruler.make_sample(task, length, index, corpus, tokenizer, args.seed)
                todo = [m for m in args.methods if (sample_key(sample), m) not in done]
                if not todo:
                    continue
                for name in {*todo, REFERENCE}:
                    if (name, length) not in attentions:
                        attentions[(name, length)] = make_method(name, length, model.config, cache_dtype)
                t0 = time.perf_counter()
                records = evaluate_sample(model_def, weights, tokenizer, eos, sample, todo,
                                          {m: attentions[(m, length)] for m in {*todo, REFERENCE}}, prefill,
                                          args.max_new_tokens)
                append_records(records_path, records)
                print(f"{sample_key(sample)}: prefill {records[0]['prefill_s']:.1f} s; "
                      + ", ".join(f"{r['method']} {r['score']:.2f} ({r['decode_s']:.1f} s)"
                                  for r in records) + f"; {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    records = read_records(records_path)
    if args.pilot:
        from benchmarks.common import write_json

        write_json(str(args.out / PILOT), pilot_cells(records))
        print(f"pilot: {args.out / PILOT}")
    else:
        print(f"summary: {write_summary(args, records)}")
    return 0


if __name__ == "__main__":
    from benchmarks.common import run_script

    run_script(main)
