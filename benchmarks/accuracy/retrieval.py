"""The retrieval section: RULER-style needle, multi-key and variable-tracking tasks, scored per length and depth,
and the merge of retrieval runs made in pieces."""

from __future__ import annotations

import json
import time

from benchmarks.accuracy.generation import generate_batches
from benchmarks.accuracy.settings import KNOWN_METHODS, PREFILL_CHUNK, Sizes


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
    from benchmarks.accuracy.tasks import make_sample

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
    from benchmarks.accuracy.tasks import score

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
    from benchmarks.accuracy.tasks import TASKS

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
