"""The accuracy benchmark's run: sections in order, each written as it finishes (a rerun keeps the finished ones),
`--combine-retrieval`, `--summary-only`, and the plots."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

from benchmarks.accuracy.captures import Captures
from benchmarks.accuracy.coverage import coverage_section, heatmap_maps
from benchmarks.accuracy.generation import greedy_section
from benchmarks.accuracy.methods import describe
from benchmarks.accuracy.operator_error import operator_section, prefill_error_section
from benchmarks.accuracy.options import parse_args, reductions, sizes_from_args
from benchmarks.accuracy.perplexity import perplexity_section
from benchmarks.accuracy.retrieval import combine_retrieval, retrieval_section
from benchmarks.accuracy.settings import KNOWN_METHODS, MAIN_METHODS, MATMUL_PRECISION, ROOT, SECTIONS, SPEC, Sizes
from benchmarks.accuracy.summary import summary_markdown, targets


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
    from benchmarks.accuracy import plots

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

    from benchmarks.accuracy.plots import attention_heatmaps
    from benchmarks.accuracy.tasks import Haystack, require_dir, require_file, wikitext_tokens
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
