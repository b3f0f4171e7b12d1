"""The operator section: each method's decode-operator error on the captured states, the rho / window / scheme
sweeps and the prefill error."""

from __future__ import annotations

import math

from benchmarks.accuracy.captures import Captures, stack
from benchmarks.accuracy.methods import make_method, progress
from benchmarks.accuracy.settings import COMPONENTS, MAIN_METHODS, RHOS, SCHEMES, WINDOWS, Sizes


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
            self.qkv = stack(self.windows, length)
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
    for n, att in progress(jobs, desc="operator error"):
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
        for w in progress(windows, desc=f"prefill error {length}"):
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
