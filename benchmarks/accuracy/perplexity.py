"""The perplexity section: WikiText-2 teacher-forced perplexity after each method's prefill."""

from __future__ import annotations

import dataclasses
import math

from benchmarks.accuracy.methods import make_method, progress
from benchmarks.accuracy.settings import EXACT_PREFILL, PREFILL_CHUNK, Sizes


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

    from benchmarks.accuracy.tasks import window_starts
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
        for name, att in progress(members, desc=f"perplexity ({flavor.flavor} prefill)"):
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
