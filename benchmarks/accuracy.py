"""Accuracy of HyQuant vs the paper's baselines on SmolLM2-135M: coverage, operator error, perplexity, retrieval.

  python -m benchmarks.accuracy [--quick | --spec] [--sections coverage,operator,perplexity,retrieval,greedy]
  hyquant eval accuracy [--quick]                       (the same script)
  python -m benchmarks.accuracy --summary-only benchmarks/results/accuracy_cpu.json
  python -m benchmarks.accuracy --combine-retrieval PART.json... --out ALL.json   (retrieval run in pieces)

Every method runs through the same model code (`models.Decoder`) and the
model-facing attention implementations, on the jnp reference path (XLA on any
device; float32 matmuls at full precision and float32 P.V, so a GPU run computes
what a CPU run does):

  bf16            exact attention, bf16 KV cache
  hyquant_k4v4    HyQuant (default HyQuantConfig: channel_key scheme, rho 5%, W 128); also _k4v2, _k2v4
  uniform4/8      every cached token per-token symmetric low-bit, no VL, no window
  kivi4/2         per-channel keys (32-token groups), per-token values, 128-token bf16 residual
  sparse_vl       vertical-only sparse: HyQuant's VL set + window kept, every other key dropped

Sections (results/accuracy_<device>.json, PNGs next to it):
  coverage    share of causal attention mass on the top-1% / top-5% key columns and top-5% + a 128-token
              local window per layer (paper Table 1), plus what HyQuant's own VL set + window covers;
              attention heatmaps with the chosen VL columns (paper Fig. 1)
  operator    relative MSE of each layer's decode attention output vs exact float32 attention on q/k/v
              captured from the model (paper Fig. 2 / B.5): the prompt is frozen into each method's cache,
              the next tokens are appended and attended one by one; rho / W / scheme / component sweeps
              (paper Tables 10, 11); the prefill operators at the shorter lengths (paper Fig. 5)
  perplexity  WikiText-2: a prefix through each method's prefill, then tokens teacher-forced through its
              decode path (where the cache compression acts); NLL and perplexity per window
  retrieval   needle (7-digit number), multi-key UUID pairs, variable tracking (RULER-style) at several
              lengths x depths; exact match (the answer string appears in the greedy output)
  greedy      share of greedy tokens identical to bf16 over long essay-summary prompts

Prefills are shared: bf16, the quantized baselines and hyquant_k4v4_exact_prefill prefill exactly (one run
serves all of them), the three HyQuant bit widths share one hybrid prefill; each method then runs its own
Freeze and decode.
--quick runs a reduced version in a few minutes (the CI test). The full default sizes are what 2 CPU cores
finish in about 42 min; the JSON lists every reduction against the full specification (SPEC). --spec runs
the specification's sizes (on one H200: `bash benchmarks/gpu.sh accuracy`, with --dtype float32 as on CPU).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _data_dir() -> Path:
    """Evaluation data: $HYQUANT_DATA, else ../shared/data beside the checkout, else /work/shared/data
    (where this workplace keeps it, so a clone elsewhere, e.g. in CI, still finds it)."""
    if os.environ.get("HYQUANT_DATA"):
        return Path(os.environ["HYQUANT_DATA"])
    for candidate in (ROOT.parent / "shared" / "data", Path("/work/shared/data")):
        if candidate.exists():
            return candidate
    return ROOT.parent / "shared" / "data"


DATA = _data_dir()
DEFAULT_WIKITEXT = DATA / "wikitext-2-raw" / "wiki.test.raw"
DEFAULT_ESSAYS = DATA / "paul_graham_essays"
SECTIONS = ("coverage", "operator", "perplexity", "retrieval", "greedy")
MAIN_METHODS = ("bf16", "hyquant_k4v4", "hyquant_k4v2", "hyquant_k2v4", "uniform4", "uniform8", "kivi4", "kivi2",
                "sparse_vl")
# HyQuant's decode cache after an exact prefill (+ VTI): what `generate` does for prompts longer than
# prefill_chunk; separates the hybrid prefill's share of the error from the cache's.
EXACT_PREFILL = "hyquant_k4v4_exact_prefill"
KNOWN_METHODS = MAIN_METHODS + (EXACT_PREFILL,)
RHOS = (0.0, 0.02, 0.05, 0.10)
WINDOWS = (0, 64, 128, 256)
SCHEMES = ("token_sym", "token_asym", "channel_key")
COMPONENTS = {"uniform (W 0, rho 0)": (0, 0.0), "window only (W 128)": (128, 0.0),
              "VL only (rho 5%)": (0, 0.05), "VL + window": (128, 0.05)}
PREFILL_METHODS = ("hyquant", "sage_int8", "sparse_vl")
# float32 matmuls in full float32 on every device: jax's default on GPUs is TF32 (10-bit mantissa), on CPU
# it is float32 already, so this makes a GPU run the computation a CPU run is.
MATMUL_PRECISION = "highest"
PREFILL_CHUNK = 512  # query rows per causal prefill chunk: hyquant_jax.eval.SharedPrefill's default


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How much of each section to run. FULL takes ~42 min on 2 CPU cores; SPEC is the full specification (--spec)."""

    coverage_lengths: tuple[int, ...] = (2048, 8192)
    coverage_windows: int = 2
    heatmap_length: int = 2048
    operator_lengths: tuple[int, ...] = (1024, 2048, 4096, 8192)
    operator_windows: int = 2
    operator_queries: int = 32
    sweep_lengths: tuple[int, ...] = (1024, 2048, 4096, 8192)
    prefill_error_lengths: tuple[int, ...] = (1024, 2048)
    ppl_prefix: int = 4096
    ppl_tokens: int = 512
    ppl_windows: int = 3
    ppl_methods: tuple[str, ...] = MAIN_METHODS + (EXACT_PREFILL,)
    retrieval_lengths: tuple[int, ...] = (2048, 4096, 8192)
    retrieval_depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    retrieval_samples: int = 1
    retrieval_tasks: tuple[str, ...] = ("needle", "multikey", "vartrack")
    retrieval_needle_only_from: int = 8192
    retrieval_methods: tuple[str, ...] = ("bf16", EXACT_PREFILL, "uniform4", "kivi4")
    greedy_prompts: int = 2
    greedy_length: int = 2048
    greedy_tokens: int = 256
    greedy_methods: tuple[str, ...] = MAIN_METHODS


FULL = Sizes()
SPEC = dataclasses.replace(FULL, retrieval_samples=10, retrieval_needle_only_from=0,
                           retrieval_methods=MAIN_METHODS[:-1], greedy_prompts=3, coverage_windows=3)
QUICK = Sizes(coverage_lengths=(1024,), coverage_windows=1, heatmap_length=1024, operator_lengths=(1024,),
              operator_windows=1, operator_queries=16, sweep_lengths=(1024,), prefill_error_lengths=(512,),
              ppl_prefix=768, ppl_tokens=48, ppl_windows=2, ppl_methods=("bf16", "hyquant_k4v4", "uniform4"),
              retrieval_lengths=(768,), retrieval_depths=(0.0, 1.0), retrieval_samples=1,
              retrieval_tasks=("needle",), retrieval_needle_only_from=0, retrieval_methods=("bf16", "hyquant_k4v4"),
              greedy_prompts=2, greedy_length=768, greedy_tokens=12, greedy_methods=("bf16", "hyquant_k4v4"))


# --------------------------------------------------------------------------- arguments


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


_SIZE_ARGS = {  # flag -> (Sizes field, parser, help)
    "--coverage-lengths": ("coverage_lengths", _ints, "context lengths of the coverage section"),
    "--coverage-windows": ("coverage_windows", int, "WikiText windows per coverage length"),
    "--operator-lengths": ("operator_lengths", _ints, "context lengths of the operator-error section"),
    "--operator-windows": ("operator_windows", int, "captured WikiText windows (of the longest operator length)"),
    "--operator-queries": ("operator_queries", int, "decode queries per window and length"),
    "--sweep-lengths": ("sweep_lengths", _ints, "lengths of the rho / W / scheme / component sweeps"),
    "--prefill-error-lengths": ("prefill_error_lengths", _ints, "lengths of the prefill-operator error"),
    "--ppl-prefix": ("ppl_prefix", int, "tokens of each perplexity window that go through prefill"),
    "--ppl-tokens": ("ppl_tokens", int, "tokens teacher-forced through decode and scored per window"),
    "--ppl-windows": ("ppl_windows", int, "WikiText windows of the perplexity section"),
    "--ppl-methods": ("ppl_methods", _names, "methods of the perplexity section"),
    "--retrieval-lengths": ("retrieval_lengths", _ints, "prompt lengths of the retrieval section"),
    "--retrieval-depths": ("retrieval_depths", _floats, "needle depths in [0, 1]"),
    "--retrieval-samples": ("retrieval_samples", int, "samples per task, length and depth"),
    "--retrieval-tasks": ("retrieval_tasks", _names, "retrieval tasks: needle, multikey, vartrack"),
    "--retrieval-needle-only-from": ("retrieval_needle_only_from", int,
                                     "prompt lengths >= this run the needle task only (0: all tasks everywhere)"),
    "--retrieval-methods": ("retrieval_methods", _names, "methods of the retrieval section"),
    "--greedy-prompts": ("greedy_prompts", int, "prompts of the greedy-agreement section"),
    "--greedy-length": ("greedy_length", int, "tokens per greedy-agreement prompt"),
    "--greedy-tokens": ("greedy_tokens", int, "greedy tokens generated per prompt"),
    "--greedy-methods": ("greedy_methods", _names, "methods of the greedy-agreement section"),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    profile = p.add_mutually_exclusive_group()
    profile.add_argument("--quick", action="store_true", help="reduced sizes (a few minutes; what CI runs)")
    profile.add_argument("--spec", action="store_true", help="the full specification (SPEC; sized for a GPU)")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma list of {', '.join(SECTIONS)}")
    p.add_argument("--model", default=None, help="HF folder or .gguf (default: SmolLM2-135M-Instruct Q4_1 GGUF)")
    p.add_argument("--wikitext", type=Path, default=DEFAULT_WIKITEXT, help="WikiText-2 raw test file")
    p.add_argument("--essays", type=Path, default=DEFAULT_ESSAYS, help="folder of Paul Graham essays (*.txt)")
    p.add_argument("--out", type=Path, default=None,
                   help="result JSON, or a folder for the canonical name; the PNGs go next to it with the same stem "
                        "(default: benchmarks/results/accuracy_<device>.json, accuracy_retrieval_<device>.json for "
                        "the retrieval section alone; a temporary folder with --quick)")
    p.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float32"),
                   help="weights and activations (auto: float32 on CPU, bfloat16 on GPU); KV caches are bf16")
    p.add_argument("--seed", type=int, default=0, help="seed of the retrieval samples")
    p.add_argument("--retrieval-batch", type=int, default=None,
                   help="prompts per retrieval batch (default: one per depth); larger batches cut the number of "
                        "steps on a GPU and do not change any output")
    p.add_argument("--retrieval-first-index", type=int, default=0,
                   help="run only the retrieval samples with this index or higher (to finish a run that stopped "
                        "early in another process; --combine-retrieval joins them)")
    p.add_argument("--prefill-chunk", type=int, default=PREFILL_CHUNK,
                   help="query rows per causal chunk of the retrieval prefills: fewer chunks compile faster on a "
                        "GPU and need more memory; results differ only by float summation order")
    p.add_argument("--merge", action="store_true",
                   help="keep the sections of an existing --out file that this run does not redo")
    p.add_argument("--summary-only", type=Path, default=None, metavar="JSON",
                   help="print the markdown summary of an existing result file and exit")
    p.add_argument("--combine-retrieval", type=Path, nargs="+", default=None, metavar="JSON",
                   help="combine the retrieval sections of several result files (e.g. one per GPU process, each "
                        "possibly stopped early) into --out, re-scored from their per-sample hits, and exit")
    p.add_argument("--rebuild", type=Path, default=None, metavar="JSON",
                   help="recompute targets, summary and plots (all but the heatmaps) of an existing result file")
    for flag, (_, kind, text) in _SIZE_ARGS.items():
        p.add_argument(flag, type=str, default=None, help=text + " (overrides the profile)")
    args = p.parse_args(argv)
    args.sections = _names(args.sections)
    bad = [s for s in args.sections if s not in SECTIONS]
    if bad:
        p.error(f"--sections: unknown {bad}; choose from {SECTIONS}")
    if args.retrieval_first_index < 0:
        p.error(f"--retrieval-first-index must be >= 0, got {args.retrieval_first_index}")
    if args.prefill_chunk < 1:
        p.error(f"--prefill-chunk must be >= 1, got {args.prefill_chunk}")
    if args.retrieval_batch is not None and args.retrieval_batch < 1:
        p.error(f"--retrieval-batch must be >= 1, got {args.retrieval_batch}")
    return args


def sizes_from_args(args) -> Sizes:
    """The QUICK, SPEC or FULL profile with any per-size flags applied (validated)."""
    sizes = QUICK if args.quick else SPEC if args.spec else FULL
    for flag, (field, kind, _) in _SIZE_ARGS.items():
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            try:
                sizes = dataclasses.replace(sizes, **{field: kind(value)})
            except ValueError as e:
                raise ValueError(f"{flag}: cannot parse {value!r} ({e})") from None
    for field in ("ppl_methods", "retrieval_methods", "greedy_methods"):
        unknown = [m for m in getattr(sizes, field) if m not in KNOWN_METHODS]
        if unknown:
            raise ValueError(f"--{field.replace('_', '-')}: unknown methods {unknown}; choose from {KNOWN_METHODS}")
    if "bf16" not in sizes.greedy_methods:
        raise ValueError("--greedy-methods must include bf16 (agreement is measured against it)")
    if any(not 0.0 <= d <= 1.0 for d in sizes.retrieval_depths):
        raise ValueError(f"--retrieval-depths must lie in [0, 1], got {sizes.retrieval_depths}")
    return sizes


def reductions(sizes: Sizes) -> list[str]:
    """Where these sizes fall short of the full specification (SPEC)."""
    out = []
    for field in dataclasses.fields(Sizes):
        have, want = getattr(sizes, field.name), getattr(SPEC, field.name)
        if have == want:
            continue
        if field.name == "retrieval_needle_only_from":  # 0 = every task at every length
            out.append(f"{field.name}: {have} (spec {want}: all tasks at every length)")
            continue
        if isinstance(want, int) and isinstance(have, int) and have > want:
            continue
        if isinstance(want, tuple) and set(want) <= set(have):
            continue
        out.append(f"{field.name}: {have} (spec {want})")
    return out


# --------------------------------------------------------------------------- methods


def make_method(name: str, cache_dtype, config=None):
    """The attention implementation of a method name (MAIN_METHODS), reference backend, bf16 cache.

    bf16 and the quantized baselines multiply float32 probabilities with float32 values on every
    device (their default off-GPU only), as the reference backend of HyQuant and sparse_vl does.
    """
    from hyquant_jax.config import HyQuantConfig
    from hyquant_jax.eval import VerticalSparseAttention
    from hyquant_jax.model_attention import HybridAttention, make_attention

    if name.startswith("hyquant_"):
        bits = name.split("_")[1]  # e.g. "k4v2"
        cfg = config or HyQuantConfig(key_bits=int(bits[1]), value_bits=int(bits[3]))
        return HybridAttention(cfg, backend="reference", cache_dtype=cache_dtype)
    if name == "sparse_vl":
        return VerticalSparseAttention(config or HyQuantConfig(), cache_dtype=cache_dtype)
    if name in MAIN_METHODS:
        return dataclasses.replace(make_attention(name, cache_dtype=cache_dtype), f32_probs=True)
    raise ValueError(f"unknown method {name!r}; choose from {KNOWN_METHODS}")


def describe(name: str) -> str:
    from hyquant_jax.config import HyQuantConfig

    d = HyQuantConfig()
    if name == EXACT_PREFILL:
        return ("HyQuant K4V4 decode cache after an exact prefill + VTI (generate's chunked-prefill path): "
                "isolates the cache's share of HyQuant's error")
    if name.startswith("hyquant_"):
        return (f"HyQuant {name[8:].upper()} {d.scheme}, rho {d.rho:.0%}, W {d.window}, block {d.block_size}, "
                f"INT8-QK hybrid prefill")
    return {"bf16": "exact attention, bf16 cache",
            "uniform4": "uniform 4-bit per-token symmetric, no VL, no window (exact prefill)",
            "uniform8": "uniform 8-bit per-token symmetric, no VL, no window (exact prefill)",
            "kivi4": "KIVI-style 4-bit: per-channel keys / 32 tokens, per-token values, 128-token bf16 residual",
            "kivi2": "KIVI-style 2-bit: per-channel keys / 32 tokens, per-token values, 128-token bf16 residual",
            "sparse_vl": f"vertical-only sparse: VL (rho {d.rho:.0%}) + window {d.window} kept, rest dropped"}[name]


def _progress(iterable=None, **kw):
    from tqdm import tqdm

    return tqdm(iterable, file=sys.stderr, dynamic_ncols=True, leave=False, **kw)


# --------------------------------------------------------------------------- captures


class Captures:
    """Per-layer q/k/v of exact forward passes over WikiText windows, by window length (memoized).

    Window i of length T starts at token i * stride (stride = tokens // 16),
    so windows of different lengths overlap only where they share a start.
    """

    def __init__(self, model, tokens):
        from models import split_model

        self.model, self.tokens = split_model(model), tokens
        self.store: dict[int, list] = {}

    def get(self, length: int, count: int) -> list[tuple]:
        """`count` windows of `length` tokens: a list of (q [L, Hq, T, D], k, v [L, Hkv, T, D]) float32."""
        import jax.numpy as jnp

        from hyquant_jax.eval import capture_qkv

        have = self.store.setdefault(length, [])
        stride = len(self.tokens) // 16
        if count > 16 or (count - 1) * stride + length > len(self.tokens):
            raise ValueError(f"cannot take {count} windows of {length} tokens from {len(self.tokens)} tokens")
        for i in _progress(range(len(have), count), desc=f"capture q/k/v {length}"):
            window = jnp.asarray(self.tokens[i * stride:i * stride + length][None])
            layers = capture_qkv(*self.model, window)
            have.append(tuple(jnp.concatenate([layer[j] for layer in layers]) for j in range(3)))
        return have[:count]

    def drop(self):
        self.store.clear()


def _stack(windows, length):
    """Windows of (q, k, v) [L, H, T, D] -> (q, k, v) [W * L, H, length, D] (the first `length` tokens)."""
    import jax.numpy as jnp

    return tuple(jnp.concatenate([w[j][:, :, :length] for w in windows]) for j in range(3))


# --------------------------------------------------------------------------- coverage


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
        for layer in _progress(range(model_cfg.num_layers), desc=f"coverage {length}"):
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


# --------------------------------------------------------------------------- operator error


def _per_layer(rel, layers: int) -> list[float]:
    """[W * L, H] relative MSE -> mean over windows and heads per layer."""
    return rel.reshape(-1, layers, rel.shape[-1]).mean(axis=(0, 2)).tolist()


class OperatorRunner:
    """Decode-operator error of attention implementations on captured states at one length at a time.

    `at(length)` stacks the windows' first `length` tokens (layers x windows
    as the batch) and computes the exact reference once; `cell(attention)`
    then runs `evaluation.decode_operator` on them.
    """

    def __init__(self, windows, layers: int, queries: int):
        self.windows, self.layers, self.queries = windows, layers, queries
        self.length, self.qkv, self.ref = None, None, None

    def at(self, length: int) -> OperatorRunner:
        from hyquant_jax.eval import decode_operator_reference

        if length != self.length:
            self.qkv = self.ref = None
            self.qkv = _stack(self.windows, length)
            self.ref = decode_operator_reference(*self.qkv, length - self.queries)
            self.length = length
        return self

    def cell(self, attention) -> dict:
        from hyquant_jax.eval import decode_operator, relative_mse

        out = decode_operator(attention, *self.qkv, self.length - self.queries)
        rel = relative_mse(out, self.ref)
        if not math.isfinite(float(rel.mean())):
            raise FloatingPointError(f"non-finite operator error for {attention} at {self.length} tokens")
        per = _per_layer(rel, self.layers)
        return {"per_layer": per, "mean": float(sum(per) / len(per)), "max_layer": float(max(per))}


def _hq(cache_dtype, **kw):
    from hyquant_jax.config import HyQuantConfig
    from hyquant_jax.model_attention import HybridAttention

    return HybridAttention(HyQuantConfig(**kw), backend="reference", cache_dtype=cache_dtype)


def sweep_configs(cache_dtype) -> dict:
    """{sweep: (metadata, [HybridAttention per setting])}: rho, W, scheme and B.5 components of HyQuant K4V4."""
    return {
        "rho": ({"values": list(RHOS), "fixed": "W 128, channel_key"}, [_hq(cache_dtype, rho=r) for r in RHOS]),
        "window": ({"values": list(WINDOWS), "fixed": "rho 5%, channel_key"},
                   [_hq(cache_dtype, window=w) for w in WINDOWS]),
        "scheme": ({"names": list(SCHEMES), "fixed": "W 128, rho 5%"}, [_hq(cache_dtype, scheme=s) for s in SCHEMES]),
        "components": ({"names": list(COMPONENTS), "fixed": "K4V4 channel_key"},
                       [_hq(cache_dtype, window=w, rho=r) for w, r in COMPONENTS.values()]),
    }


def operator_section(captures: Captures, sizes: Sizes, model_cfg, cache_dtype) -> dict:
    """Decode-operator error of every method at every operator length, and the sweeps at the sweep lengths."""
    lengths = sorted(set(sizes.operator_lengths) | set(sizes.sweep_lengths))
    windows = captures.get(max(lengths), sizes.operator_windows)
    run = OperatorRunner(windows, model_cfg.num_layers, sizes.operator_queries)
    methods = {name: make_method(name, cache_dtype) for name in MAIN_METHODS}
    sweeps = sweep_configs(cache_dtype)
    jobs = [(n, att) for n in lengths for att in
            ([*methods.values()] if n in sizes.operator_lengths else [])
            + ([a for _, atts in sweeps.values() for a in atts] if n in sizes.sweep_lengths else [])]
    cells = {}
    for n, att in _progress(jobs, desc="operator error"):
        if (n, att) not in cells:  # equal configs (e.g. the default in several sweeps) run once
            cells[(n, att)] = run.at(n).cell(att)
    result = {"lengths": list(sizes.operator_lengths), "queries": sizes.operator_queries, "windows": len(windows),
              "definition": "relative MSE = sum((out - ref)^2) / sum(ref^2) per layer and head over the last "
                            "`queries` tokens of each window, each decoded through the method's cache after the "
                            "rest was frozen into it; ref = exact float32 attention on the float32 q/k/v; "
                            "mean over heads and windows per layer, then over layers",
              "methods": {name: {str(n): cells[(n, att)] for n in sizes.operator_lengths}
                          for name, att in methods.items()}}
    result["ratio_to_uniform4"] = {
        name: {str(n): cell[str(n)]["mean"] / result["methods"]["uniform4"][str(n)]["mean"]
               for n in sizes.operator_lengths} for name, cell in result["methods"].items()}
    result["sweep_lengths"] = list(sizes.sweep_lengths)
    for key, (meta, atts) in sweeps.items():
        result[key] = dict(meta, mean={str(n): [cells[(n, a)]["mean"] for a in atts] for n in sizes.sweep_lengths},
                           per_layer={str(n): [cells[(n, a)]["per_layer"] for a in atts]
                                      for n in sizes.sweep_lengths})
    return result


def prefill_error_section(captures: Captures, sizes: Sizes, model_cfg) -> dict:
    """Relative MSE of the prefill attention operators vs exact float32 on captured prompts (paper Fig. 5)."""
    import jax.numpy as jnp
    import numpy as np

    from hyquant_jax.config import HyQuantConfig
    from hyquant_jax.eval import exact_causal_attention, hybrid_prefill, relative_mse, sparse_prefill_attention
    from hyquant_jax.reference import uniform_quantized_prefill_reference

    config = HyQuantConfig()
    fns = {"hyquant": lambda q, k, v, n: hybrid_prefill(q, k, v, n, config, query_chunk=256)[0],
           "sage_int8": lambda q, k, v, n: uniform_quantized_prefill_reference(q, k, v, n, "int8"),
           "sparse_vl": lambda q, k, v, n: sparse_prefill_attention(q, k, v, n, config, query_chunk=256)[0]}
    longest = max(sizes.operator_lengths + sizes.sweep_lengths)
    windows = captures.get(longest, sizes.operator_windows)
    result = {"lengths": list(sizes.prefill_error_lengths), "methods": {m: {} for m in fns},
              "definition": "relative MSE of the whole prompt's causal attention output (all queries) vs exact "
                            "float32; hyquant = INT8-QK hybrid prefill with VL + band exact; sage_int8 = every "
                            "key through per-token INT8 Q.K (SageAttention-style); sparse_vl = VL + band only"}
    for length in sizes.prefill_error_lengths:
        rels = {m: [] for m in fns}
        for w in _progress(windows, desc=f"prefill error {length}"):
            q, k, v = (x[:, :, :length] for x in w)
            lengths = jnp.full((q.shape[0],), length, jnp.int32)
            ref = exact_causal_attention(q, k, v, chunk=256)
            for name, fn in fns.items():
                rels[name].append(relative_mse(fn(q, k, v, lengths), ref))
        for name in fns:
            per = np.concatenate(rels[name]).reshape(-1, model_cfg.num_layers, model_cfg.num_heads)
            per = per.mean(axis=(0, 2)).tolist()
            result["methods"][name][str(length)] = {"per_layer": per, "mean": float(np.mean(per))}
    return result


# --------------------------------------------------------------------------- shared prefill + decode


def flavor_groups(names, cache_dtype, query_chunk: int = PREFILL_CHUNK) -> dict:
    """{SharedPrefill flavor: [(name, attention), ...]} so each prefill runs once per group.

    query_chunk: query rows per causal chunk of the prefill (only memory, compile
    time and float summation order depend on it).
    """
    from hyquant_jax.eval import prefill_flavor

    methods = [(name, make_method(name, cache_dtype)) for name in names]
    flavors = [dataclasses.replace(prefill_flavor(att, cache_dtype, exact=name == EXACT_PREFILL),
                                   query_chunk=query_chunk) for name, att in methods]
    # An exact prefill that also picks a VL set (EXACT_PREFILL's) serves the exact-prefill methods without
    # one too: their decode states ignore the VL set, and the attention output is the same.
    with_vl = next((f for f in flavors if f.flavor == "exact" and f.config is not None), None)
    groups: dict = {}
    for (name, att), flavor in zip(methods, flavors):
        if with_vl is not None and flavor.flavor == "exact" and flavor.config is None:
            flavor = with_vl
        groups.setdefault(flavor, []).append((name, att))
    return groups


def perplexity_section(model, wiki_tokens, sizes: Sizes, cache_dtype) -> dict:
    import jax.numpy as jnp
    import numpy as np

    from benchmarks._accuracy_tasks import window_starts
    from hyquant_jax.eval import decode_states, run_prefill, teacher_forced_nll
    from models import split_model

    model = split_model(model)
    span = sizes.ppl_prefix + sizes.ppl_tokens + 1
    starts = window_starts(len(wiki_tokens), span, sizes.ppl_windows)
    tokens = jnp.asarray(np.stack([wiki_tokens[s:s + span] for s in starts]))
    lengths = jnp.full((len(starts),), sizes.ppl_prefix, jnp.int32)
    nll, top1 = {}, {}
    for flavor, members in flavor_groups(sizes.ppl_methods, cache_dtype).items():
        _, kvs = run_prefill(*model, tokens[:, :sizes.ppl_prefix], lengths, prefill=flavor)
        for name, att in _progress(members, desc=f"perplexity ({flavor.flavor} prefill)"):
            states = decode_states(att, kvs, lengths, span)
            out, pred, _ = teacher_forced_nll(*model, states, tokens[:, sizes.ppl_prefix:], lengths, attention=att)
            nll[name], top1[name] = np.asarray(out, np.float64), np.asarray(pred)
        del kvs
    return perplexity_summary(nll, top1, starts, sizes)


def perplexity_summary(nll: dict, top1: dict, starts, sizes: Sizes) -> dict:
    """Per-method NLL / perplexity per window, pooled, and paired changes vs bf16."""
    import numpy as np

    result = {"prefix": sizes.ppl_prefix, "tokens": sizes.ppl_tokens, "windows": list(starts),
              "definition": "NLL of each window's `tokens` tokens after the prefix, each predicted by a decode "
                            "step whose input token was teacher-forced; ppl = exp(mean NLL) pooled over windows; "
                            "delta = paired per-window change vs bf16", "methods": {}}
    base = nll.get("bf16")
    for name, x in nll.items():
        per = x.mean(axis=1)
        cell = {"mean_nll": float(x.mean()), "nll_per_window": per.tolist(), "std_nll_windows": float(per.std()),
                "ppl": float(math.exp(x.mean())), "ppl_per_window": np.exp(per).tolist(),
                "finite": bool(np.isfinite(x).all())}
        if base is not None:
            d = per - base.mean(axis=1)
            cell.update(delta_nll=float(d.mean()), delta_nll_std=float(d.std()),
                        ppl_change_vs_bf16=float(math.exp(d.mean()) - 1.0),
                        top1_agreement_with_bf16=float((top1[name] == top1["bf16"]).mean()))
        result["methods"][name] = cell
    return result


def retrieval_tasks_at(sizes: Sizes, length: int) -> tuple[str, ...]:
    """Tasks run at a prompt length (only "needle" from retrieval_needle_only_from on, when that is > 0)."""
    if sizes.retrieval_needle_only_from and length >= sizes.retrieval_needle_only_from:
        return tuple(t for t in sizes.retrieval_tasks if t == "needle")
    return sizes.retrieval_tasks


def retrieval_samples(sizes: Sizes, haystack, tokenizer, seed: int, first_index: int = 0) -> list:
    """Every retrieval prompt of these sizes, interleaved so that each batch spans the tasks and depths.

    Order: by length, then sample index, then task and depth. A run stopped early
    (see retrieval_section's checkpoint) has then done about the same number of
    samples in every cell of a length. first_index: skip the samples with a lower
    index (to finish a stopped run in another process; `combine_retrieval`
    joins the two).
    """
    from benchmarks._accuracy_tasks import make_sample

    return [make_sample(task, length, depth, i, haystack, tokenizer, seed)
            for length in sizes.retrieval_lengths for i in range(first_index, sizes.retrieval_samples)
            for task in retrieval_tasks_at(sizes, length) for depth in sizes.retrieval_depths]


def retrieval_section(model, tokenizer, haystack, sizes: Sizes, cache_dtype, seed: int,
                      batch: int | None = None, checkpoint=None, first_index: int = 0,
                      query_chunk: int = PREFILL_CHUNK) -> dict:
    """Greedy retrieval of every method on every sample, scored (RULER string match).

    checkpoint: optional callable taking the partial section (complete False)
    after every batch, so that a run stopped early keeps what it finished.
    first_index, query_chunk: see `retrieval_samples`, `flavor_groups`.
    """
    from benchmarks._accuracy_tasks import score

    if not 0 <= first_index < sizes.retrieval_samples:
        raise ValueError(f"--retrieval-first-index must lie in [0, {sizes.retrieval_samples}), got {first_index}")
    t0 = time.perf_counter()
    samples = retrieval_samples(sizes, haystack, tokenizer, seed, first_index)

    def section(outputs: dict, complete: bool) -> dict:
        texts = {name: [None if ids is None else tokenizer.decode(ids) for ids in rows]
                 for name, rows in outputs.items()}
        hits = {name: [[s.task, s.length, s.depth, s.index, *score(s, text)]
                       for s, text in zip(samples, rows) if text is not None] for name, rows in texts.items()}
        done = [j for j in range(len(samples)) if all(rows[j] is not None for rows in texts.values())]
        shown = done[::max(1, len(done) // 6)]
        examples = {name: [{"task": samples[j].task, "length": samples[j].length, "depth": samples[j].depth,
                            "answers": samples[j].answers, "output": texts[name][j]} for j in shown]
                    for name in texts}
        prompt_tokens = {str(n): [min(len(s.prompt) for s in samples if s.length == n),
                                  max(len(s.prompt) for s in samples if s.length == n)]
                         for n in sizes.retrieval_lengths}
        out = retrieval_result(hits, sizes.retrieval_lengths, sizes.retrieval_depths, sizes.retrieval_tasks,
                               sizes.retrieval_samples, seed, prompt_tokens=prompt_tokens, examples=examples,
                               complete=complete)
        out.update(elapsed_s=time.perf_counter() - t0, first_index=first_index, prefill_query_chunk=query_chunk)
        return out

    on_batch = None if checkpoint is None else (lambda outputs: checkpoint(section(outputs, complete=False)))
    ids = generate_batches(model, tokenizer, samples, sizes.retrieval_methods, cache_dtype,
                           batch=batch or len(sizes.retrieval_depths), desc="retrieval", on_batch=on_batch,
                           query_chunk=query_chunk)
    return section(ids, complete=True)


RETRIEVAL_DEFINITION = ("a sample is correct when every answer string appears in the greedy output (RULER string "
                        "match); grid = share correct per length and depth (None: not run); overall = share correct "
                        "over all samples; hits = [task, length, depth, index, correct, share of answers found] per "
                        "sample")


def retrieval_result(hits: dict, lengths, depths, tasks, samples: int, seed: int, prompt_tokens=None,
                     examples=None, complete: bool = True) -> dict:
    """The retrieval section from per-sample hits {method: [[task, length, depth, index, correct, partial]]}."""
    lengths = sorted({int(n) for n in lengths})
    tasks_at = {str(n): [t for t in tasks if any(h[0] == t and h[1] == n for rows in hits.values() for h in rows)]
                for n in lengths}
    counts = [sum(1 for h in rows if (h[0], h[1], h[2]) == (t, n, d))
              for rows in hits.values() for n in lengths for t in tasks_at[str(n)] for d in depths]
    return {"lengths": lengths, "depths": list(depths), "tasks": list(tasks), "samples": samples, "seed": seed,
            "samples_per_cell": [min(counts), max(counts)] if counts else [0, 0], "tasks_at": tasks_at,
            "prompt_tokens": prompt_tokens or {}, "definition": RETRIEVAL_DEFINITION,
            "complete": complete, "samples_done": {name: len(rows) for name, rows in hits.items()},
            "methods": {name: score_hits(rows, lengths, depths, tasks) for name, rows in hits.items()},
            "hits": hits, "examples": examples or {}}


def score_hits(hits: list, lengths, depths, tasks) -> dict:
    """Per-task grids (length x depth), accuracies and the pooled share correct of one method's hits."""
    import numpy as np

    def mean(rows, part=4):
        return float(np.mean([h[part] for h in rows])) if rows else None

    out = {}
    for task in tasks:
        rows = [h for h in hits if h[0] == task]
        grid = {str(n): {str(d): mean([h for h in rows if h[1] == n and h[2] == d]) for d in depths}
                for n in lengths}
        out[task] = {"grid": grid, "accuracy": mean(rows), "partial": mean(rows, 5), "samples": len(rows),
                     "by_length": {str(n): mean([h for h in rows if h[1] == n]) for n in lengths}}
    out["overall"] = mean(hits)
    out["samples"] = len(hits)
    return out


def combine_retrieval(sections: list[dict]) -> dict:
    """One retrieval section from several (e.g. one per GPU process), re-scored from their per-sample hits.

    The sections must share depths and seed. A sample (task, length, depth,
    index) that two sections both ran counts once, with the score of the first;
    where the scores differ (possible when the runs used different prefill
    chunkings: float summation order can flip a greedy token) the section
    lists both under "differing_duplicates".
    """
    if not sections:
        raise ValueError("combine_retrieval: no sections given")
    for key in ("depths", "seed"):
        values = {json.dumps(sec.get(key)) for sec in sections}
        if len(values) > 1:
            raise ValueError(f"combine_retrieval: the sections differ in {key}: {sorted(values)}")
    if any("hits" not in sec for sec in sections):
        raise ValueError("combine_retrieval: a section has no per-sample 'hits' (written before they were kept)")
    merged: dict = {}
    differing, same = [], 0
    for sec in sections:
        for name, rows in sec["hits"].items():
            table = merged.setdefault(name, {})
            for h in rows:
                key = tuple(h[:4])
                if key not in table:
                    table[key] = h
                elif table[key] == h:
                    same += 1
                else:
                    differing.append({"method": name, "kept": table[key], "other": h})
    order = [m for m in KNOWN_METHODS if m in merged] + [m for m in merged if m not in KNOWN_METHODS]
    hits = {name: sorted(merged[name].values(), key=lambda h: (h[1], h[3], h[0], h[2])) for name in order}
    from benchmarks._accuracy_tasks import TASKS

    tasks = [t for t in TASKS if any(t in sec["tasks"] for sec in sections)]
    lengths = {n for sec in sections for n in sec["lengths"]}
    prompt_tokens = {n: span for sec in sections for n, span in sec.get("prompt_tokens", {}).items()}
    examples = {name: ex for sec in sections for name, ex in sec.get("examples", {}).items()}
    out = retrieval_result(hits, lengths, sections[0]["depths"], tasks, max(sec["samples"] for sec in sections),
                           sections[0]["seed"], prompt_tokens, examples)
    # complete when every cell has all its samples, even if they come from runs that each stopped early
    out.update(complete=out["samples_per_cell"][0] >= out["samples"], equal_duplicates=same,
               differing_duplicates=differing)
    return out


def generate_batches(model, tokenizer, samples, methods, cache_dtype, batch: int, desc: str,
                     on_batch=None, query_chunk: int = PREFILL_CHUNK) -> dict:
    """Greedy token ids of every sample for every method: {method: [list of ids per sample]}.

    Samples of one prompt length run in batches of `batch` in their given order
    (padded to that length; the last batch is filled with copies); each prefill
    flavor runs once per batch, then each method freezes its cache and decodes
    greedily through `hyquant_jax.generate.decode` (stopping at EOS).
    on_batch: optional callable, given the outputs so far (None for samples not
    run yet) after every batch.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np

    from hyquant_jax.eval import decode_states, run_prefill
    from hyquant_jax.generate import decode
    from hyquant_jax.sampling import SamplingConfig
    from models import split_model

    model_cfg = model.config
    model_def, weights = split_model(model)
    outputs = {m: [None] * len(samples) for m in methods}
    groups = flavor_groups(methods, cache_dtype, query_chunk)
    eos = tuple(tokenizer.eos_ids or model_cfg.eos_token_ids)
    pad = tokenizer.pad_id or 0
    order = sorted(range(len(samples)), key=lambda j: samples[j].length)  # stable: keeps the given order
    chunks = [order[i:i + batch] for i in range(0, len(order), batch)]
    by_length: dict[int, list] = {}
    for c in chunks:
        by_length.setdefault(samples[c[0]].length, []).append(c)
    for length, length_chunks in by_length.items():
        max_new = max(samples[j].max_new_tokens for c in length_chunks for j in c)
        for chunk in _progress(length_chunks, desc=f"{desc} {length}"):
            if any(samples[j].length != length for j in chunk):
                raise AssertionError("a batch mixes prompt lengths")
            rows = chunk + [chunk[-1]] * (batch - len(chunk))
            tokens = np.full((batch, length), pad, np.int32)
            for r, j in enumerate(rows):
                tokens[r, :len(samples[j].prompt)] = samples[j].prompt
            lengths = jnp.asarray([len(samples[j].prompt) for j in rows], jnp.int32)
            for flavor, members in groups.items():
                logits, kvs = run_prefill(model_def, weights, jnp.asarray(tokens), lengths, prefill=flavor)
                first = jnp.argmax(logits, axis=-1).astype(jnp.int32)
                for name, att in members:
                    states = decode_states(att, kvs, lengths, length + max_new)
                    _, out, count, *_ = decode(model_def, weights, states, first, lengths, jax.random.PRNGKey(0),
                                               attention=att, sampling=SamplingConfig(), max_new_tokens=max_new,
                                               eos_ids=eos, pad_id=pad)
                    out, count = np.asarray(out), np.asarray(count)
                    for r, j in enumerate(chunk):
                        outputs[name][j] = out[r, :count[r]].tolist()
                del kvs
            if on_batch is not None:
                on_batch(outputs)
    return outputs


def greedy_section(model, tokenizer, haystack, sizes: Sizes, cache_dtype) -> dict:
    from benchmarks._accuracy_tasks import Sample, greedy_prompts
    from hyquant_jax.cli.generate import agreement

    prompts = greedy_prompts(haystack, tokenizer, sizes.greedy_prompts, sizes.greedy_length)
    samples = [Sample("greedy", sizes.greedy_length, 0.0, i, p, [], sizes.greedy_tokens)
               for i, p in enumerate(prompts)]
    tokens = generate_batches(model, tokenizer, samples, sizes.greedy_methods, cache_dtype,
                              batch=len(samples), desc="greedy")
    result = {"prompts": len(prompts), "prompt_tokens": [len(p) for p in prompts], "tokens": sizes.greedy_tokens,
              "definition": "share of positions with the same greedy token as bf16 over the longer of the two "
                            "generations (stopping at EOS), pooled over prompts", "methods": {}}
    for name in sizes.greedy_methods:
        pairs = [agreement(a, b) for a, b in zip(tokens[name], tokens["bf16"])]
        total = sum(max(len(a), len(b)) for a, b in zip(tokens[name], tokens["bf16"]))
        share = sum(s * max(len(a), len(b)) for (s, _), a, b in zip(pairs, tokens[name], tokens["bf16"]))
        result["methods"][name] = {"agreement": share / max(total, 1), "first_difference": [f for _, f in pairs],
                                   "generated": [len(a) for a in tokens[name]]}
    result["sample_text"] = {name: tokenizer.decode(tokens[name][0][:80]) for name in ("bf16", "hyquant_k4v4")
                             if name in tokens}
    return result


# --------------------------------------------------------------------------- targets and summary


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
    lines = ["### Accuracy on SmolLM2-135M-Instruct (`benchmarks/accuracy.py`)", "",
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


# --------------------------------------------------------------------------- main


def _compute_dtype(name: str):
    import jax
    import jax.numpy as jnp

    if name == "auto":
        return jnp.bfloat16 if jax.default_backend() == "gpu" else jnp.float32
    return jnp.dtype(name)


def _write(path: Path, result: dict) -> None:
    from benchmarks.common import write_json

    write_json(str(path), result)


_SECTION_OF_FIELD = {"coverage": "coverage", "heatmap": "coverage", "operator": "operator", "sweep": "operator",
                     "prefill": "operator", "ppl": "perplexity", "retrieval": "retrieval", "greedy": "greedy"}


def section_of(field: str) -> str:
    """The section a Sizes field sizes (its name's prefix)."""
    return _SECTION_OF_FIELD[field.split("_")[0]]


def merge_previous(result: dict, previous: dict, redo) -> None:
    """Copy the sections (with timings, plots and the sizes they ran with) of a previous result not redone now."""
    kept = [name for name in SECTIONS if name in previous and name not in redo]
    for name in kept:
        result[name] = previous[name]
        result["timings_s"][name] = previous.get("timings_s", {}).get(name)
    for field, value in previous.get("sizes", {}).items():
        if section_of(field) in kept:
            result["sizes"][field] = value
    if kept:
        result["merged_from"] = {"sections": kept, "env": previous.get("env")}
        result["sections"] = [name for name in SECTIONS if name in kept or name in redo]
    sizes = Sizes(**{k: tuple(v) if isinstance(v, list) else v for k, v in result["sizes"].items()})
    result["reduced"] = [r for r in reductions(sizes) if section_of(r.split(":")[0]) in result["sections"]]


def _rel(path: Path) -> str:
    """path relative to the repository root when inside it (portable JSON)."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def json_plots(result: dict, stem: Path) -> None:
    """(Re)draw every plot that the result JSON holds the data of (all but the heatmaps)."""
    from benchmarks import _accuracy_plots as plots

    if "coverage" in result:
        result["plots"]["coverage"] = _rel(plots.coverage(result["coverage"], Path(f"{stem}_coverage.png")))
    if "operator" in result:
        result["plots"]["operator_mse"] = _rel(plots.operator_mse(result["operator"], list(MAIN_METHODS),
                                                                  Path(f"{stem}_operator_mse.png")))
        result["plots"]["sweeps"] = _rel(plots.sweeps(result["operator"], Path(f"{stem}_sweeps.png")))
    if "perplexity" in result:
        result["plots"]["perplexity"] = _rel(plots.perplexity(result["perplexity"], Path(f"{stem}_perplexity.png")))
    if "retrieval" in result:
        result["plots"]["retrieval"] = _rel(plots.retrieval_grids(result["retrieval"], Path(f"{stem}_needle.png")))


def combine_files(paths: list[Path], out: Path) -> dict:
    """`combine_retrieval` over result files; writes `out` (targets, summary, plots) and returns it."""
    from benchmarks.common import environment

    results = []
    for path in paths:
        if not path.is_file():
            raise ValueError(f"--combine-retrieval: file not found: {path}")
        data = json.loads(path.read_text())
        if "retrieval" not in data:
            raise ValueError(f"--combine-retrieval: {path} has no retrieval section")
        results.append(data)
    retrieval = combine_retrieval([r["retrieval"] for r in results])
    lo = retrieval["samples_per_cell"][0]
    sizes = dataclasses.replace(SPEC, retrieval_depths=tuple(retrieval["depths"]),
                                retrieval_lengths=tuple(retrieval["lengths"]), retrieval_samples=lo,
                                retrieval_tasks=tuple(retrieval["tasks"]), retrieval_needle_only_from=0,
                                retrieval_methods=tuple(retrieval["methods"]))
    env = dict(results[0]["env"])
    env["command"] = environment()["command"]
    folder = paths[0].parent
    if all(p.parent == folder for p in paths) and set(paths) == set(folder.glob("*.json")):
        env["command"] = f"python -m benchmarks.accuracy --combine-retrieval {_rel(folder)}/*.json --out {_rel(out)}"
    result = {"env": env, "out": _rel(out), "quick": False, "sections": ["retrieval"], "model": results[0]["model"],
              "data": results[0]["data"], "sizes": dataclasses.asdict(sizes), "spec": dataclasses.asdict(SPEC),
              "reduced": [r for r in reductions(sizes) if section_of(r.split(":")[0]) == "retrieval"],
              "methods": {m: describe(m) for m in retrieval["methods"] if m in KNOWN_METHODS},
              "combined_from": [{"file": _rel(p), "command": r["env"]["command"], "device": r["env"].get("device"),
                                 "date": r["env"].get("date"), "complete": r["retrieval"].get("complete", True),
                                 "elapsed_s": r["retrieval"].get("elapsed_s"),
                                 "samples_done": r["retrieval"].get("samples_done")}
                                for p, r in zip(paths, results)],
              "plots": {}, "timings_s": {}, "retrieval": retrieval}
    elapsed = [c["elapsed_s"] for c in result["combined_from"] if c["elapsed_s"] is not None]
    result["wall_s"] = max(elapsed) if elapsed else 0.0
    out.parent.mkdir(parents=True, exist_ok=True)
    finish(result, out)
    return result


def finish(result: dict, out: Path) -> None:
    """Targets, plots and the markdown summary from the sections present; write the JSON."""
    result["targets"] = targets(result)
    json_plots(result, out.with_suffix(""))
    result["plots"] = {k: _rel(Path(v)) for k, v in result["plots"].items()}
    result["summary_markdown"] = summary_markdown(result)
    _write(out, result)


def default_out(sections, quick: bool, folder: Path | None = None) -> Path:
    """The canonical result file of a run on this device, in `folder` (default: benchmarks/results, a temporary
    folder with --quick): accuracy_<device>.json, or accuracy_retrieval_<device>.json for the retrieval section
    alone."""
    from benchmarks.common import default_name, output_folder

    name = default_name("accuracy_retrieval" if list(sections) == ["retrieval"] else "accuracy")
    return Path(output_folder(None if folder is None else str(folder), smoke=quick)) / f"{name}.json"


def run(args, sizes: Sizes) -> dict:
    import jax
    import jax.numpy as jnp

    from benchmarks._accuracy_plots import attention_heatmaps
    from benchmarks._accuracy_tasks import Haystack, require_dir, require_file, wikitext_tokens
    from benchmarks.common import environment
    from models.checkpoint import load_model

    t_start = time.perf_counter()
    need_wiki = {"coverage", "operator", "perplexity"} & set(args.sections)
    need_essays = {"retrieval", "greedy"} & set(args.sections)
    if need_wiki:
        require_file(args.wikitext, "--wikitext")
    if need_essays:
        require_dir(args.essays, "--essays")
    cache_dtype = jnp.bfloat16
    model, tokenizer = load_model(args.model, _compute_dtype(args.dtype))
    model_cfg = model.config
    if args.out is None or args.out.is_dir():
        args.out = default_out(args.sections, args.quick, args.out)
    stem = args.out.with_suffix("")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {"env": environment(), "out": _rel(args.out), "quick": args.quick, "sections": list(args.sections),
              "model": {"name": Path(args.model).name if args.model else "SmolLM2-135M-Instruct.Q4_1.gguf",
                        "layers": model_cfg.num_layers, "q_heads": model_cfg.num_heads,
                        "kv_heads": model_cfg.num_kv_heads, "head_dim": model_cfg.head_dim,
                        "compute_dtype": jnp.dtype(_compute_dtype(args.dtype)).name, "kv_cache_dtype": "bfloat16",
                        "matmul_precision": str(jax.config.jax_default_matmul_precision)},
              "data": {"wikitext": str(args.wikitext), "essays": str(args.essays)},
              "sizes": dataclasses.asdict(sizes), "spec": dataclasses.asdict(SPEC),
              "reduced": [r for r in reductions(sizes) if section_of(r.split(":")[0]) in args.sections],
              "methods": {m: describe(m) for m in KNOWN_METHODS}, "plots": {}, "timings_s": {}}
    if args.merge and args.out.is_file():
        previous = json.loads(args.out.read_text())
        merge_previous(result, previous, args.sections)
        if "coverage" not in args.sections and "heatmaps" in previous.get("plots", {}):
            result["plots"]["heatmaps"] = previous["plots"]["heatmaps"]
    print(f"model {result['model']['name']}, {jax.devices()[0].device_kind}, sections {','.join(args.sections)}"
          f"{' (quick)' if args.quick else ''}", file=sys.stderr)

    def section(name, fn):
        t0 = time.perf_counter()
        result[name] = fn()
        result["timings_s"][name] = time.perf_counter() - t0
        print(f"[{name}] done in {result['timings_s'][name]:.0f} s", file=sys.stderr)
        _write(args.out, result)

    wiki = wikitext_tokens(args.wikitext, tokenizer) if need_wiki else None
    captures = Captures(model, wiki) if need_wiki else None
    if "coverage" in args.sections:
        def coverage():  # the heatmaps too, so that the JSON written after the section names their PNG
            out = coverage_section(captures, sizes, model_cfg)
            maps = heatmap_maps(captures, sizes, model_cfg)
            result["plots"]["heatmaps"] = _rel(attention_heatmaps(maps, sizes.heatmap_length,
                                                                  Path(f"{stem}_heatmaps.png")))
            return out

        section("coverage", coverage)
    if "operator" in args.sections:
        def operator():
            out = operator_section(captures, sizes, model_cfg, cache_dtype)
            out["prefill"] = prefill_error_section(captures, sizes, model_cfg)
            return out

        section("operator", operator)
    if captures is not None:
        captures.drop()
    if "perplexity" in args.sections:
        section("perplexity", lambda: perplexity_section(model, wiki, sizes, cache_dtype))
    haystack = Haystack.from_folder(args.essays, tokenizer) if need_essays else None
    if "retrieval" in args.sections:
        def checkpoint(partial):  # after every batch: a run stopped early keeps the samples it finished
            result["retrieval"] = partial
            _write(args.out, result)

        section("retrieval", lambda: retrieval_section(model, tokenizer, haystack, sizes, cache_dtype,
                                                       args.seed, args.retrieval_batch, checkpoint,
                                                       args.retrieval_first_index, args.prefill_chunk))
    if "greedy" in args.sections:
        section("greedy", lambda: greedy_section(model, tokenizer, haystack, sizes, cache_dtype))
    result["wall_s"] = time.perf_counter() - t_start + sum(
        v for k, v in result["timings_s"].items() if k in result.get("merged_from", {}).get("sections", []) and v)
    finish(result, args.out)
    return result


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        if args.summary_only is not None:
            print(summary_markdown(json.loads(args.summary_only.read_text())))
            return 0
        if args.combine_retrieval:
            result = combine_files(args.combine_retrieval, args.out or default_out(["retrieval"], False))
            print(result["summary_markdown"])
            return 0
        if args.rebuild is not None:
            result = json.loads(args.rebuild.read_text())
            result["out"] = _rel(args.rebuild)
            finish(result, args.rebuild)
            print(result["summary_markdown"])
            return 0
        sizes = sizes_from_args(args)
        import jax

        with jax.default_matmul_precision(MATMUL_PRECISION):
            result = run(args, sizes)
    except ValueError as e:
        print(f"accuracy: error: {e}", file=sys.stderr)
        return 2
    print(result["summary_markdown"])
    return 0


if __name__ == "__main__":
    from benchmarks.common import run_script

    run_script(main)
