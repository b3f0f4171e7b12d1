"""The accuracy benchmark's command line (the description is the package's docstring) and the `Sizes` it asks for."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from benchmarks.accuracy.settings import (
    DEFAULT_ESSAYS,
    DEFAULT_WIKITEXT,
    FULL,
    KNOWN_METHODS,
    PREFILL_CHUNK,
    QUICK,
    SECTIONS,
    SPEC,
    Sizes,
)


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
    import benchmarks.accuracy

    p = argparse.ArgumentParser(prog="python -m benchmarks.accuracy", description=benchmarks.accuracy.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
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
