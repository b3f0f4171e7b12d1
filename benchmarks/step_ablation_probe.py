"""Where hyquant's B = 1 decode step spends its wall time: the step timed with parts of each layer's attention
taken out, one at a time, next to bf16 with its attention taken out the same way (issue 5: at 32K the hybrid
kernels take less kernel time than bf16's attention, yet the step is no faster; benchmarks/NOTES.md, session 31).

Variants (all in one process, e2e.py's model, states and timing; `--variants` picks and orders them):
  bf16              the baseline as it runs
  bf16_write_only   bf16 writes the step's k, v into its cache, attention output = q (no attention)
  bf16_static       no cache write, attention output = q
  hyquant           the hybrid step as it runs (append, Mosaic + Triton kernels, merge, ring scores)
  no_ring_scores    without the ring-score update (no ring logits out of the Triton kernel, no
                    `accumulate_ring_scores`); the window flush still promotes by the (now stale) scores
  no_merge          the kernels run, but the output is the sum of each launch's first split (no merge; an
                    output left unused would let XLA drop the launch)
  no_mosaic         the Mosaic low-bit launch left out (the merge takes the Triton splits only)
  no_triton         the Triton VL/ring launch left out (the merge takes the Mosaic splits only); at short
                    prefixes where the Triton kernel also scans the low-bit pages, no attention kernel runs
  append_only       append + ring flushes only, attention output = q
  static            no append, no flush work beyond the (never taken) checks, attention output = q
  static_flat       static in one flat loop: an empty begin every step, no nested loops, no branch
  bf16_static_nested        bf16_static run by the nested loops the hybrid cache gets (64 steps a run)
  bf16_static_nested_carry  that, with 15 small arrays per layer carried untouched (as many loop buffers as
                            the hybrid cache's)

A variant name may carry modifiers, e.g. `hyquant@host@stop` (without @host or @device, `generate.decode`
picks the loops as it does for users: `generate.uses_device_loops`):
  @host    `generate.decode` compiled with XLA's command-buffer kinds (jax 0.11.2): loops of unknown trip
           count run from the host, one condition read-back and host wait per step
  @device  the same plus WHILE: such loops become device-side loops in the CUDA graph
  @stop    decode with a stop token that never occurs (e2e.py --stop-token), as `generate` decodes

Measurements only: the ablated outputs are meaningless, the work per step is what is timed. On the GPU box, from
the repository root:
  PYTHONPATH=. python benchmarks/step_ablation_probe.py --out $OUT --prefixes 32768 --steps 64 --reps 3
CPU check that the script runs (variants that need the GPU kernels are skipped there):
  python benchmarks/step_ablation_probe.py --smoke --out /tmp/ablation
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import e2e  # noqa: E402
from benchmarks.common import environment  # noqa: E402
from hyquant_jax.model_attention import HybridAttention  # noqa: E402
from models.attention import BF16Attention, KVBuffer, write_tokens  # noqa: E402

HYBRID_PARTS = ("ring_scores", "merge", "mosaic", "triton", "attention", "append")
HYBRID_VARIANTS = {
    "hyquant": (),
    "no_ring_scores": ("ring_scores",),
    "no_merge": ("merge",),
    "no_mosaic": ("mosaic",),
    "no_triton": ("triton",),
    "append_only": ("attention", "ring_scores"),
    "static": ("append", "attention", "ring_scores"),
}
KERNEL_VARIANTS = ("no_merge", "no_mosaic", "no_triton")  # call the GPU kernels' pieces directly
BF16_VARIANTS = ("bf16", "bf16_write_only", "bf16_static", "bf16_static_nested", "bf16_static_nested_carry")
STRUCTURE_VARIANTS = ("static_flat",)
DEFAULT_VARIANTS = BF16_VARIANTS + tuple(HYBRID_VARIANTS) + STRUCTURE_VARIANTS
MODIFIERS = ("host", "device", "stop")


def split_variant(name: str) -> tuple[str, frozenset]:
    """'hyquant@host@stop' -> ('hyquant', {'host', 'stop'}); SystemExit naming the bad part otherwise."""
    base, *mods = name.split("@")
    if base not in DEFAULT_VARIANTS:
        raise SystemExit(f"--variants: unknown variant {base!r}; choose from {DEFAULT_VARIANTS}")
    bad = sorted(set(mods) - set(MODIFIERS))
    if bad:
        raise SystemExit(f"--variants: unknown modifier(s) {bad} in {name!r}; choose from {MODIFIERS}")
    if {"host", "device"} <= set(mods):
        raise SystemExit(f"--variants: {name!r} has both @host and @device")
    return base, frozenset(mods)


@dataclasses.dataclass(frozen=True)
class AblatedBF16(BF16Attention):
    """bf16 attention whose decode returns q as the attention output; `write`: still store k, v."""

    write: bool = True

    def decode(self, layer, q, k, v, state: KVBuffer, ctx):
        import jax.numpy as jnp

        if self.write:
            s = state.k.shape[2]
            pos = jnp.minimum(ctx.positions, s - 1)
            state = KVBuffer(*write_tokens((state.k, state.v), (k, v), pos))
        return q, state


@dataclasses.dataclass(frozen=True)
class NestedBF16(AblatedBF16):
    """AblatedBF16 run by `generate.decode`'s nested loops (an empty begin, then 64 steps without it), as the
    hybrid cache is; `extra_leaves`: small int32 [1, 8] arrays carried untouched next to each layer's
    buffer, as many as the hybrid cache's 17 leaves minus bf16's 2 (so the loop carries as many buffers)."""

    extra_leaves: int = 0

    def begin_decode_step(self, states, ctx):
        return states

    def steps_until_begin(self, states, ctx):
        import jax.numpy as jnp

        return jnp.int32(64)

    def used_bytes(self, state, lengths=None):
        return super().used_bytes(state[0] if self.extra_leaves else state, lengths)

    def decode(self, layer, q, k, v, state, ctx):
        if not self.extra_leaves:
            return super().decode(layer, q, k, v, state, ctx)
        out, buf = super().decode(layer, q, k, v, state[0], ctx)
        return out, (buf, state[1])


@dataclasses.dataclass(frozen=True)
class FlatHybrid(HybridAttention):
    """Marker base: one loop with an empty begin every step (no nested loops, no branch)."""

    steps_until_begin = None

    def begin_decode_step(self, states, ctx):
        return states


@dataclasses.dataclass(frozen=True)
class AblatedHybrid(HybridAttention):
    """HybridAttention with the parts named in `skip` (a sorted tuple from HYBRID_PARTS) left out of decode."""

    skip: tuple = ()

    def __post_init__(self):
        super().__post_init__()
        unknown = set(self.skip) - set(HYBRID_PARTS)
        if unknown:
            raise ValueError(f"AblatedHybrid.skip: unknown parts {sorted(unknown)}; choose from {HYBRID_PARTS}")

    def decode(self, layer, q, k, v, cache, ctx):
        from hyquant_jax.cache import accumulate_ring_scores, append

        dt = cache.dtype
        if "append" not in self.skip:
            cache = append(cache, k.astype(dt), v.astype(dt), self.config, active=ctx.active,
                           flush=not ctx.prepared, backend=self.backend)
        if "attention" in self.skip:
            return q, cache
        out, lse, ring = _ablated_attention(q, cache, self.config, self.skip, self.backend)
        if "ring_scores" not in self.skip:
            cache = accumulate_ring_scores(cache, q, lse, self.config, ring_logits=ring)
        return out, cache


@dataclasses.dataclass(frozen=True)
class FlatAblatedHybrid(FlatHybrid, AblatedHybrid):
    """AblatedHybrid in one flat loop (see FlatHybrid); with skip=("append", ...) no ring ever fills."""


def _with_extra_leaves(states_fn):
    """e2e._states, then each layer's state paired with `extra_leaves` small arrays for NestedBF16."""

    def states(attention, *args, **kwargs):
        import jax.numpy as jnp

        built = states_fn(attention, *args, **kwargs)
        n = getattr(attention, "extra_leaves", 0)
        if not n:
            return built
        return tuple((s, tuple(jnp.zeros((1, 8), jnp.int32) + i for i in range(n))) for s in built)

    return states


def _ablated_attention(q, cache, config, skip, backend):
    """`decode_kernel.decode_attention` with its launches and merge left out as `skip` says.

    Returns (out [B, Hq, D], lse [B, Hq], ring logits [B, Hq, R] or None)."""
    import jax.numpy as jnp

    from hyquant_jax.attention import decode_attention
    from hyquant_jax.decode_kernel import _mosaic_low_bit, decode_plan, triton_splits
    from pallas_kernels.decode import merge_splits

    scores = "ring_scores" not in skip and config.flush_vl_count > 0
    if not set(skip) & {"merge", "mosaic", "triton"}:
        out, lse, *ring = decode_attention(q, cache, config, backend=backend, ring_logits=scores)
        return out, lse, (ring[0] if ring else None)
    b, hq, d = q.shape
    scale = 1.0 / math.sqrt(d)
    lay, warps, stages, mosaic = decode_plan(cache, config, hq, ring_logits=scores)
    parts, ring = [], None
    if mosaic is not None and "mosaic" not in skip:
        parts.append(_mosaic_low_bit(q, cache, scale, *mosaic))
    if "triton" not in skip:
        o, m, l, ring = triton_splits(q, cache, lay, scale, warps, stages, False)
        parts.append((o, m, l))
        if ring is not None:
            ring = ring[:, :, :lay.group].reshape(b, hq, lay.ring_size)
    if not parts:
        return q, jnp.zeros((b, hq), jnp.float32), ring
    if "merge" in skip:  # the first split of each launch, summed: every launch's output stays in use
        o = sum(x[0][:, :, 0, :lay.group] for x in parts)
        m = sum(x[1][:, :, 0, :lay.group] for x in parts)
        return o.reshape(b, hq, d).astype(q.dtype), m.reshape(b, hq), ring
    o, m, l = (jnp.concatenate(xs, axis=2) for xs in zip(*parts))
    out, lse = merge_splits(o, m, l, lay.group)
    return out.astype(q.dtype), lse, ring


def attention_for(name: str, hybrid: HybridAttention):
    """The attention of variant `name` (see the module docstring)."""
    if name == "bf16":
        return BF16Attention()
    if name == "bf16_static_nested":
        return NestedBF16(write=False)
    if name == "bf16_static_nested_carry":
        return NestedBF16(write=False, extra_leaves=15)
    if name in BF16_VARIANTS:
        return AblatedBF16(write=name == "bf16_write_only")
    if name == "static_flat":
        return FlatAblatedHybrid(hybrid.config, hybrid.backend, hybrid.prefill_backend, hybrid.cache_dtype,
                                 skip=tuple(sorted(HYBRID_VARIANTS["static"])))
    if name == "hyquant":
        return hybrid
    if name not in HYBRID_VARIANTS:
        raise ValueError(f"unknown variant {name!r}; choose from {DEFAULT_VARIANTS}")
    return AblatedHybrid(hybrid.config, hybrid.backend, hybrid.prefill_backend, hybrid.cache_dtype,
                         skip=tuple(sorted(HYBRID_VARIANTS[name])))


def main(argv=None) -> None:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                     help=f"comma list, run in this order; from {DEFAULT_VARIANTS}")
    own, rest = pre.parse_known_args(argv)
    names = own.variants.split(",")
    for n in names:
        split_variant(n)
    args = e2e.parse_args(rest)
    e2e._states = _with_extra_leaves(e2e._states)
    if args.name == "e2e_h200":
        args.name = "step_ablation"

    import copy

    import jax
    import jax.numpy as jnp

    from models import init_params

    generate = sys.modules["hyquant_jax.generate"]  # the module (the package exports a function of that name)

    config = e2e._model(args)
    params = jax.block_until_ready(init_params(jax.random.PRNGKey(0), config, jnp.bfloat16))
    hybrid, _ = e2e._attention(args, "hyquant")
    on_gpu = jax.devices()[0].platform == "gpu"
    env = environment()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{args.name}.json")
    rows = []
    default_decode = generate.decode
    forced = {mode: generate.decode_with_options(generate.decode_compiler_options("", device_loops=mode == "device"))
              for mode in ("host", "device")}
    for prefix in e2e._ints(args.prefixes):
        for name in names:
            base, mods = split_variant(name)
            if base in KERNEL_VARIANTS and not on_gpu:
                print(f"{name}: skipped (needs the GPU kernels)", flush=True)
                continue
            row_args = copy.copy(args)
            row_args.stop_token = args.stop_token or "stop" in mods
            mode = next((m for m in ("host", "device") if m in mods), None)
            if mode and args.in_place:
                raise SystemExit(f"{name}: @host / @device force `generate.decode`; --in-place times decode_in_place")
            generate.decode = forced[mode] if mode else default_decode  # e2e reads it per call
            try:
                row = e2e._guarded(lambda: e2e._decode_config(row_args, params, config, attention_for(base, hybrid),
                                                              name, prefix, 1), method=name, prefix=prefix, batch=1)
            finally:
                generate.decode = default_decode
            rows.append(row)
            print(f"{prefix:>7} {name:>16} {row.get('step_ms', float('nan')):8.3f} ms "
                  f"{row.get('loop_seconds', '')} {row.get('error', '')[:80]}", flush=True)
            with open(path, "w") as f:  # after every row: a run stopped by a time limit keeps what it measured
                json.dump({"environment": env, "argv": sys.argv[1:], "rows": rows}, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
