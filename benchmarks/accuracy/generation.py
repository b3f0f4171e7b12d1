"""Greedy generation in batches from each method's cache, and the greedy-agreement section built on it."""

from __future__ import annotations

from benchmarks.accuracy.methods import progress
from benchmarks.accuracy.perplexity import flavor_groups
from benchmarks.accuracy.settings import PREFILL_CHUNK, Sizes


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
        for chunk in progress(length_chunks, desc=f"{desc} {length}"):
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
    from benchmarks.accuracy.tasks import Sample, greedy_prompts
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
