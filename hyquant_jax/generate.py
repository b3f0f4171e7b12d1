"""Jitted text generation: chunked prefill, Freeze, `lax.while_loop` decode over donated caches.

`generate` wires a model (a `models.Decoder`), an attention implementation
(bf16, HyQuant, or a quantized baseline; see `hyquant_jax.model_attention`)
and its per-layer states. The jitted functions take the model as
`models.split_model(model)`: a static `ModelDef` and a dict of weights,
merged back into the module at trace time (split once, call many times):

1. `prefill` (one jit): the padded prompts run through the model in chunks of
   `prefill_chunk` tokens (one call when the prompt fits, else a `fori_loop`
   over chunks); each layer's state is then finished (`finish_prefill`:
   Freeze for the hybrid cache) and the first token is sampled from the
   logits at each prompt's last position.
2. `decode` (one jit, states donated): a `lax.while_loop` whose carry holds
   every layer's state. Each step writes one token per sequence into each
   layer's buffers with dynamic-update-slice / scatter, so XLA updates the
   donated buffers in place; nothing rewrites a whole cache per step. A
   sequence stops at one of `eos_ids` or after `max_new_tokens`; the loop
   ends when all have stopped. Loops that stop on data (stop tokens, the
   hybrid cache's runs between window flushes) run as device-side loops in
   one CUDA graph on the GPU (`hyquant_jax.compile_options`).

Capacities are static: `max_len` tokens per sequence, checked on the host.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Sequence
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hyquant_jax import sharding
from hyquant_jax.compile_options import (
    XLA_FLAGS,
    DeviceLoopJit,
    TopLevelJit,
    jit_with_options,
    prefill_compiler_options,
)
from hyquant_jax.sampling import SamplingConfig, check_seed, sample
from models.attention import DecodeContext, PrefillContext, begin_decode_step, steps_until_begin
from models.config import ModelConfig
from models.transformer import Decoder, ModelDef, check_model, split_model


@dataclasses.dataclass
class GenerateResult:
    """tokens: int32 [B, max_new_tokens], pad_id after a sequence stopped; lengths:
    int32 [B] tokens generated (an EOS included); cache_lengths: int32 [B] tokens
    cached at the end; states: the per-layer decode states (None unless kept);
    timings in seconds (compile separate; prefill/decode exclude compilation)."""

    tokens: np.ndarray
    lengths: np.ndarray
    cache_lengths: np.ndarray
    prompt_lengths: np.ndarray
    compile_seconds: float
    prefill_seconds: float
    decode_seconds: float
    decode_steps: int
    max_len: int
    states: Any = None

    def sequences(self) -> list[list[int]]:
        """Generated ids per sequence, without padding."""
        return [row[:n].tolist() for row, n in zip(self.tokens, self.lengths)]


def pad_prompts(prompts: Sequence[Sequence[int]], pad_id: int = 0, bucket: int = 64,
                chunk: int = 2048) -> tuple[np.ndarray, np.ndarray]:
    """Ragged prompts -> (tokens int32 [B, T], lengths int32 [B]), right-padded.

    T is the longest prompt rounded up to a multiple of `bucket`, or of
    `chunk` when that exceeds one chunk (so chunked prefill tiles it).
    """
    if not prompts:
        raise ValueError("prompts must hold at least one sequence")
    lengths = np.array([len(p) for p in prompts], np.int32)
    if lengths.min() < 1:
        raise ValueError(f"every prompt needs at least one token, got lengths {lengths.tolist()}")
    t = padded_length(int(lengths.max()), bucket, chunk)
    tokens = np.full((len(prompts), t), pad_id, np.int32)
    for i, p in enumerate(prompts):
        ids = np.asarray(p)
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"prompts[{i}] must be a flat sequence of integer token ids, got {ids.dtype} "
                             f"{list(ids.shape)}")
        tokens[i, :len(p)] = ids
    return tokens, lengths


def padded_length(longest: int, bucket: int, chunk: int) -> int:
    if bucket < 1 or chunk < 1:
        raise ValueError(f"bucket and prefill_chunk must be >= 1, got {bucket} and {chunk}")
    t = math.ceil(longest / bucket) * bucket
    return t if t <= chunk else math.ceil(longest / chunk) * chunk


def _layer_states(attention, config, batch, prompt_len, max_len, dtype, whole):
    return tuple(attention.prefill_state(config, batch, prompt_len, max_len, dtype, whole)
                 for _ in range(config.num_layers))


def _run_chunk(model, states, logits, tokens, offset, lengths, *, attention, max_len, min_length):
    """One chunk of a chunked prefill: tokens int32 [B, C] at positions offset .. offset + C - 1. Returns the
    states and the logits, those of rows whose last prompt token lies in this chunk replaced."""
    ctx = PrefillContext(offset, lengths, max_len, whole=False, min_length=min_length)
    new, states = model(tokens, ctx, states, attention=attention, output_index=lengths - 1 - offset)
    inside = (lengths - 1 >= offset) & (lengths - 1 < offset + tokens.shape[1])
    return states, jnp.where(inside[:, None], new, logits)


def _finish(states, lengths, *, attention, max_len, whole, min_length):
    ctx = PrefillContext(jnp.int32(0), lengths, max_len, whole=whole, min_length=min_length)
    return tuple(attention.finish_prefill(i, s, ctx) for i, s in enumerate(states))


@jit_with_options(prefill_compiler_options(XLA_FLAGS),
                  static_argnames=("model_def", "attention", "sampling", "chunk", "max_len", "min_length"))
def prefill(model_def: ModelDef, weights, tokens: jax.Array, lengths: jax.Array, key: jax.Array, *, attention,
            sampling: SamplingConfig, chunk: int, max_len: int, min_length: int = 0):
    """Prompts -> (first sampled token int32 [B], logits float32 [B, V], decode states).

    model_def, weights: the model, `models.split_model(model)`.
    tokens: int32 [B, T] right-padded (T <= chunk, or a multiple of chunk);
    lengths: int32 [B] in [1, T]; max_len: capacity of the decode states;
    min_length: a lower bound of `lengths` that the caller checked (`PrefillContext.min_length`).
    """
    model = model_def.merge(weights)
    config = model.config
    b, t = tokens.shape
    whole = t <= chunk
    states = _layer_states(attention, config, b, t, max_len, model.dtype, whole)
    if whole:
        ctx = PrefillContext(jnp.int32(0), lengths, max_len, whole=True, min_length=min_length)
        logits, states = model(tokens, ctx, states, attention=attention, output_index=lengths - 1)
    else:
        def body(c, carry):
            offset = (c * chunk).astype(jnp.int32)
            chunk_tokens = jax.lax.dynamic_slice_in_dim(tokens, offset, chunk, axis=1)
            return _run_chunk(model, *carry, chunk_tokens, offset, lengths, attention=attention, max_len=max_len,
                              min_length=min_length)

        logits0 = jnp.zeros((b, config.vocab_size), jnp.float32)
        states, logits = jax.lax.fori_loop(0, t // chunk, body, (states, logits0))
    states = _finish(states, lengths, attention=attention, max_len=max_len, whole=whole, min_length=min_length)
    first = sample(logits, key, sampling, positions=lengths)
    return first, logits, states


# A chunked prefill one chunk per call, so that a server decodes running requests between the chunks of a long
# prompt: `chunked_prefill_states`, then `prefill_chunk` for offsets 0, C, 2C, ... below T, then
# `finish_chunked_prefill`. The same states, logits and finished states as `prefill` of the same tokens.

def chunked_prefill_states(model: Decoder, attention, batch: int, prompt_len: int, max_len: int) -> tuple:
    """The empty per-layer states of a chunked prefill of `batch` prompts padded to `prompt_len` tokens."""
    return _layer_states(attention, model.config, batch, prompt_len, max_len, model.dtype, whole=False)


@jit_with_options(prefill_compiler_options(XLA_FLAGS),
                  static_argnames=("model_def", "attention", "max_len", "min_length"), donate_argnames=("states",))
def prefill_chunk(model_def: ModelDef, weights, states: tuple, logits: jax.Array, tokens: jax.Array,
                  offset: jax.Array, lengths: jax.Array, *, attention, max_len: int, min_length: int = 0):
    """One chunk of a chunked prefill -> (states, logits float32 [B, V]).

    states: from `chunked_prefill_states` or the previous chunk (donated); logits: float32 [B, V], zeros before
    the first chunk; tokens: int32 [B, C], the prompts' positions offset .. offset + C - 1; offset: int32 [];
    lengths: int32 [B] the prompt lengths; max_len, min_length: as `prefill`'s.
    """
    return _run_chunk(model_def.merge(weights), states, logits, tokens, offset, lengths, attention=attention,
                      max_len=max_len, min_length=min_length)


# Not donated: a hybrid cache's frozen states have other shapes than its staging states, so XLA could not reuse
# them (and would warn); the staging buffers are freed when the caller drops them.
@jit_with_options(prefill_compiler_options(XLA_FLAGS), static_argnames=("attention", "max_len", "min_length"))
def finish_chunked_prefill(states: tuple, lengths: jax.Array, *, attention, max_len: int,
                           min_length: int = 0) -> tuple:
    """The decode states of a chunked prefill whose every chunk ran (`finish_prefill` of each layer)."""
    return _finish(states, lengths, attention=attention, max_len=max_len, whole=False, min_length=min_length)


def _is_eos(tokens, eos_ids: tuple[int, ...]):
    hit = jnp.zeros(tokens.shape, bool)
    for e in eos_ids:
        hit = hit | (tokens == e)
    return hit


DECODE_JIT = dict(static_argnames=("model_def", "attention", "sampling", "max_new_tokens", "eos_ids", "pad_id",
                                   "layer_kernels"), donate_argnames=("states",))


@functools.partial(DeviceLoopJit, xla_flags=XLA_FLAGS, **DECODE_JIT)
def decode(model_def: ModelDef, weights, states: tuple, first: jax.Array, lengths: jax.Array, key: jax.Array, *,
           attention, sampling: SamplingConfig, max_new_tokens: int, eos_ids: tuple[int, ...], pad_id: int,
           layer_kernels: str | None = None, step_limit: jax.Array | None = None):
    """Decode loop (`lax.while_loop`, the per-layer states donated and updated in place).

    An attention with once-per-step work (`begin_decode_step`: the hybrid cache's ring-flush branch) that
    can say how many steps need none of it (`steps_until_begin`) runs it only then, with the steps in
    between in an inner loop without it: the same steps, states and tokens as calling it every step. (Under
    CONCURRENT scheduling, `compile_options.decode_compiler_options`, a branch in every step made the step
    slower: docs/design.md, "Device loops and command buffers".)

    model_def, weights: the model, `models.split_model(model)`.
    first: int32 [B] the token sampled after the prompt (generated token 0);
    lengths: int32 [B] tokens already cached (prompt lengths).
    layer_kernels: how each step's norms and RoPE run (`models.transformer.layer_kernels`; None: the
    attention's choice, "auto" by default: the Pallas kernels on a GPU where the shapes fit).
    step_limit: int32 [], at most this many decode steps (None: max_new_tokens - 1, as many as the tokens
    buffer holds); a traced value, so one compiled loop serves every limit (the streamed decode's last call).
    Returns (states, tokens int32 [B, max_new_tokens], generated counts int32 [B], cache lengths int32 [B],
    steps taken int32 []).

    The states come first so that each state array keeps its buffer from call to call: jit gives each output,
    in order, the buffer of the first unused donated input of the same shape and dtype. With the int32 [B]
    counts ahead of them, the counts took the first int32 [B] counter of the hybrid cache, that counter the
    next one's buffer, and so on, so every such counter moved on every call; on the GPU each moved buffer
    makes XLA re-record the commands of the loop's CUDA graph that use it before the call runs.
    """
    model = model_def.merge(weights)
    b = first.shape[0]
    out = jnp.full((b, max_new_tokens), pad_id, jnp.int32).at[:, 0].set(first)
    active = ~_is_eos(first, eos_ids)
    carry = (jnp.int32(1), out, first, lengths.astype(jnp.int32), active, jnp.ones((b,), jnp.int32), states)
    end = max_new_tokens if step_limit is None else jnp.minimum(step_limit + 1, max_new_tokens)

    def cond(c):
        step, *_, active, _, _ = c
        return (step < end) & jnp.any(active)

    def advance(c, states, ctx):
        """One decode step on states the step's `begin_decode_step` work (if any) was done on."""
        step, out, last, positions, active, count, _ = c
        logits, states = model(last[:, None], ctx, states, attention=attention, kernels=layer_kernels)
        token = sample(logits[:, 0], key, sampling, positions=positions + 1)
        token = jnp.where(active, token, pad_id)
        out = jax.lax.dynamic_update_slice_in_dim(out, token[:, None], step, axis=1)
        step_on = active.astype(jnp.int32)
        return (step + 1, out, token, positions + step_on, active & ~_is_eos(token, eos_ids), count + step_on,
                states)

    def body(c):
        states, ctx = begin_decode_step(attention, c[6], DecodeContext(c[3], c[4]))
        return advance(c, states, ctx)

    def run_of_steps(c):
        # The once-per-step work (the hybrid cache's ring-flush branch) only before the steps that need it:
        # here once, then an inner loop over the steps that need none, without the branch.
        states, ctx = begin_decode_step(attention, c[6], DecodeContext(c[3], c[4]))
        stop = jnp.minimum(c[0] + steps_until_begin(attention, states, ctx), end)

        def prepared_step(c):
            return advance(c, c[6], DecodeContext(c[3], c[4], prepared=True))

        return jax.lax.while_loop(lambda c: (c[0] < stop) & jnp.any(c[4]), prepared_step, c[:6] + (states,))

    # Whether the implementation can say so (the count traced here is unused and compiled away).
    skips = steps_until_begin(attention, states, DecodeContext(lengths, active)) is not None
    step, out, _, positions, _, count, states = jax.lax.while_loop(cond, run_of_steps if skips else body, carry)
    return states, out, count, positions, step - 1


_decode_loop = decode.__wrapped__  # the traced function, for the other jits of it below


def _decode_in_place(model_def: ModelDef, weights, states: tuple, first: jax.Array, lengths: jax.Array,
                     key: jax.Array, previous: tuple, **static):
    """`decode` for callers that call it again and again (a server decoding in chunks, the benchmarks): every
    output takes the buffer of a donated input, so chained calls keep every buffer in place.

        states, tokens, counts, lengths, steps = decode_in_place(model_def, weights, states, first, lengths, key,
                                                                 (tokens, steps), **static)
        first = last_tokens(tokens, counts)

    Arguments and results are `decode`'s, plus previous = the previous call's (tokens int32 [B, max_new_tokens],
    steps int32 []) (zeros of those shapes before a first call), of which only the buffers are used. states,
    first, lengths and previous are donated (deleted by the call): the states come back in their own buffers,
    the tokens and step count in previous', the counts in first's and the cache lengths in lengths'.
    `last_tokens` then puts the next call's first tokens into the counts' buffer.

    Why: on the GPU, XLA runs the decode as CUDA graphs and, before a call runs, re-records the commands of a
    graph whose buffers moved (with the hybrid cache's device-side loops, commands inside the loop bodies).
    `decode` gives its outputs new buffers on every call (the caller still holds the previous ones) and reads
    first and lengths wherever the caller made them. It measured no faster than `decode`, whose states keep
    their buffers already (docs/design.md, "Buffer donation").
    """
    tokens, steps = previous  # only their buffers are used: they receive this call's tokens and step count
    want = ((first.shape[0], static["max_new_tokens"]), ())
    if (tokens.shape, steps.shape) != want or tokens.dtype != jnp.int32 or steps.dtype != jnp.int32:
        raise ValueError(f"previous must be (tokens int32 {list(want[0])}, steps int32 []) of the previous call "
                         f"(zeros before a first call), got ({tokens.dtype} {list(tokens.shape)}, "
                         f"{steps.dtype} {list(steps.shape)})")
    return _decode_loop(model_def, weights, states, first, lengths, key, **static)


decode_in_place = DeviceLoopJit(
    _decode_in_place, XLA_FLAGS, static_argnames=DECODE_JIT["static_argnames"],
    donate_argnames=("states", "first", "lengths", "previous"), keep_unused=True)  # jit drops unused inputs


@partial(jax.jit, donate_argnames=("counts",))
def last_tokens(tokens: jax.Array, counts: jax.Array) -> jax.Array:
    """Each sequence's last generated token, tokens[b, counts[b] - 1] (counts >= 1, as `decode` returns them),
    int32 [B] in the buffer of `counts` (donated): the next `decode_in_place` call's `first` takes it again."""
    return jnp.take_along_axis(tokens, jnp.maximum(counts - 1, 0)[:, None], axis=1)[:, 0]


def decode_with_options(compiler_options: dict[str, str]):
    """`decode` compiled with these XLA options instead of `compile_options.decode_compiler_options`'
    (benchmarks compare options in one process with it)."""
    return TopLevelJit(_decode_loop, compiler_options, **DECODE_JIT)


def check_capacity(lengths: np.ndarray, padded_len: int, max_new_tokens: int, max_len: int | None,
                   config: ModelConfig) -> int:
    """Host-side capacity check; returns the decode-state capacity in tokens per sequence."""
    longest = int(np.max(lengths))
    need = longest + max_new_tokens
    if need > config.max_position:
        raise ValueError(f"prompt ({longest} tokens) + max_new_tokens ({max_new_tokens}) = {need} exceeds the "
                         f"model's max_position={config.max_position}")
    if config.sliding_window is not None and need > config.sliding_window:
        raise ValueError(f"{need} tokens exceed the model's sliding_window={config.sliding_window} "
                         "(sliding-window attention is not implemented)")
    if max_len is None:
        return max(padded_len, need)
    if max_len < max(padded_len, need):
        raise ValueError(f"max_len={max_len} is too small: the padded prompt needs {padded_len} and prompt + "
                         f"max_new_tokens needs {need} tokens per sequence")
    return max_len


def shortest_prompt_bound(lengths: np.ndarray) -> int:
    """The largest power of two <= the shortest prompt (0 for an empty batch): a static lower bound of the
    prompt lengths, so that the hybrid cache is sized for such prompts (`freeze(min_length=...)`, 4% smaller
    at a 32K prompt) while distinct bounds, and so recompilations, stay few."""
    shortest = int(np.min(lengths)) if np.size(lengths) else 0
    return 1 << (shortest.bit_length() - 1) if shortest > 0 else 0


def generate(model: Decoder, prompts: Sequence[Sequence[int]], *, attention,
             max_new_tokens: int, sampling: SamplingConfig = SamplingConfig(), eos_ids: Sequence[int] | None = None,
             pad_id: int = 0, seed: int = 0, prefill_chunk: int = 2048, bucket: int = 64,
             max_len: int | None = None, keep_states: bool = False, mesh=None, on_tokens=None,
             stream_chunk: int = 16) -> GenerateResult:
    """Generate continuations of a ragged batch of token-id prompts.

    model: a `models.Decoder` (`models.load_model` or `models.init_model`); its config is `model.config`.
    prompts: B lists of token ids (lengths may differ; padding never leaks:
      a sequence's greedy tokens equal those of the prompt run alone).
    attention: a `models.attention.Attention` implementation, e.g.
      `models.BF16Attention()` or `hyquant_jax.make_attention("hyquant")`.
    max_new_tokens: tokens to generate per sequence at most (>= 1).
    sampling: greedy by default; eos_ids: stop tokens (None: config.eos_token_ids).
    prefill_chunk: prompts longer than this are prefilled in chunks of this size.
    max_len: decode-state capacity per sequence (None: just enough). The hybrid cache is sized for
      prompts at least as long as `shortest_prompt_bound` of these.
    keep_states: return the final per-layer states (e.g. to count cache bytes).
    seed: the sampling key's seed, an integer in 0 .. 2**32 - 1.
    mesh: optional ("data", "model") `jax.sharding.Mesh` (`hyquant_jax.sharding.make_mesh`) or its shape
      as a string ("data=1,model=2"): the weights are split Megatron-style over "model", the batch over
      "data", and each layer's attention runs per shard under `shard_map` (`hyquant_jax.sharding`). Raises
      ValueError when the KV heads do not divide the model axis or the batch does not divide the data axis.
    on_tokens: streaming: called as on_tokens(new) with new[b] the token ids sequence b generated since the
      last call, as they are decoded. The decode then runs in calls of `stream_chunk` steps (one compiled
      loop, called again on the states it returns); the tokens are the same as without streaming (sampled
      tokens too: each draws with a key of its position, `sampling.sample`), and so are the steps, cached
      tokens, cache bytes and capacity: the last call runs only the steps left (`decode`'s step_limit).
    """
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    for name, value in (("prefill_chunk", prefill_chunk), ("bucket", bucket)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an int >= 1 (tokens), got {value!r}")
    seed = check_seed(seed)
    mesh = sharding.as_mesh(mesh)
    if on_tokens is not None and not callable(on_tokens):
        raise ValueError(f"on_tokens must be None or a callable taking a list of token-id lists, got {on_tokens!r}")
    if not isinstance(stream_chunk, int) or stream_chunk < 2:
        raise ValueError(f"stream_chunk must be an int >= 2 (decode steps per streamed call), got {stream_chunk!r}")
    missing = [m for m in ("prefill_state", "prefill", "finish_prefill", "decode") if not hasattr(attention, m)]
    if missing:
        raise ValueError(f"attention must be an attention implementation (e.g. models.BF16Attention() or "
                         f"hyquant_jax.make_attention('hyquant')), got {attention!r} without {missing}")
    check_model(model)
    config = model.config
    if not isinstance(pad_id, (int, np.integer)) or not 0 <= pad_id < config.vocab_size:
        raise ValueError(f"pad_id must be a token id in [0, {config.vocab_size}), got {pad_id!r}")
    eos = tuple(int(e) for e in (config.eos_token_ids if eos_ids is None else eos_ids))
    tokens, lengths = pad_prompts(prompts, pad_id, bucket, prefill_chunk)
    cap = check_capacity(lengths, tokens.shape[1], max_new_tokens, max_len, config)
    if int(tokens.max()) >= config.vocab_size or int(tokens.min()) < 0:
        raise ValueError(f"prompt token ids must lie in [0, {config.vocab_size}), got "
                         f"[{int(tokens.min())}, {int(tokens.max())}]")
    key = jax.random.PRNGKey(seed)
    put, host, replicate = jnp.asarray, np.asarray, jnp.asarray
    if mesh is not None:
        model, attention = sharding.prepare(model, attention, mesh, batch=len(prompts))
        put, host = partial(sharding.put_batch, mesh=mesh), sharding.to_host
        replicate = partial(sharding.put_replicated, mesh=mesh)
        key = replicate(key)
    model_def, weights = split_model(model)
    static = dict(attention=attention, sampling=sampling)
    tokens_j, lengths_j = put(tokens), put(lengths)

    t0 = time.perf_counter()
    prefill_fn = prefill.lower(model_def, weights, tokens_j, lengths_j, key, chunk=prefill_chunk, max_len=cap,
                               min_length=shortest_prompt_bound(lengths), **static).compile()
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    first, _, states = prefill_fn(weights, tokens_j, lengths_j, key)
    first.block_until_ready()
    prefill_s = time.perf_counter() - t0

    dec = dict(max_new_tokens=stream_chunk if on_tokens else max_new_tokens, eos_ids=eos, pad_id=pad_id, **static)
    if on_tokens is not None:
        dec["step_limit"] = replicate(np.int32(stream_chunk - 1))
    t0 = time.perf_counter()
    decode_fn = decode.lower(model_def, weights, states, first, lengths_j, key, **dec).compile()
    compile_s += time.perf_counter() - t0
    t0 = time.perf_counter()
    if on_tokens is None:
        states, out, count, positions, steps = decode_fn(weights, states, first, lengths_j, key)
        out, count, positions, steps = host(out), host(count), host(positions), int(steps)
    else:
        states, out, count, positions, steps = _streamed(decode_fn, weights, states, first, lengths_j, key,
                                                         max_new_tokens, pad_id, eos, on_tokens, put, host, replicate)
    decode_s = time.perf_counter() - t0
    return GenerateResult(tokens=out, lengths=count, cache_lengths=positions,
                          prompt_lengths=lengths, compile_seconds=compile_s, prefill_seconds=prefill_s,
                          decode_seconds=decode_s, decode_steps=steps, max_len=cap,
                          states=states if keep_states else None)


def _streamed(decode_fn, weights, states, first, lengths, key, max_new_tokens: int, pad_id: int, eos_ids: tuple,
              on_tokens, put, host, replicate):
    """`generate`'s decode as calls of one compiled `decode` loop of stream_chunk tokens, each continuing from
    the states, last tokens and cache lengths of the one before; on_tokens gets each call's new tokens. Each
    call's step_limit is the steps still to run (at most stream_chunk - 1), so the calls take max_new_tokens - 1
    steps in all, as one `decode` call does. Returns `decode`'s results."""
    b = first.shape[0]
    out = np.full((b, max_new_tokens), pad_id, np.int32)
    count = np.zeros(b, np.int32)
    steps, done = 0, np.zeros(b, bool)
    while not done.all():
        left = max_new_tokens - 1 - steps
        states, chunk, n, lengths, taken = decode_fn(weights, states, first, lengths, key,
                                                     step_limit=replicate(np.int32(left)))
        chunk, n, taken = host(chunk), host(n), int(taken)
        skip = 0 if steps == 0 else 1  # a call's first token is the last one of the call before
        steps += taken
        new = []
        for i in range(b):
            ids = [] if done[i] else chunk[i, skip:n[i]].tolist()
            out[i, count[i]:count[i] + len(ids)] = ids
            count[i] += len(ids)
            done[i] |= count[i] >= max_new_tokens or (len(ids) > 0 and ids[-1] in eos_ids)
            new.append(ids)
        done |= taken < min(left, chunk.shape[1] - 1)  # the loop stopped early: every sequence has stopped
        on_tokens(new)
        first = put(np.take_along_axis(chunk, np.maximum(n - 1, 0)[:, None], axis=1)[:, 0])
    return states, out, count, host(lengths), steps


def kv_cache_bytes(attention, states: tuple, cache_lengths) -> np.ndarray:
    """Host-side: bytes per sequence (int64 [B]) that all layers' decode states use."""
    return sum(np.asarray(attention.used_bytes(s, cache_lengths), np.int64) for s in states)
