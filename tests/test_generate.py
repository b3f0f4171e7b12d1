"""hyquant_jax.generate on tiny random models: determinism, ragged batches, EOS, chunked prefill,
HyQuant == bf16 when nothing is quantized, baselines, sampling filters, donation, errors."""

import dataclasses
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hyquant_jax import HyQuantConfig
from hyquant_jax.cache import capacities
from hyquant_jax.generate import (
    chunked_prefill_states,
    decode,
    decode_in_place,
    finish_chunked_prefill,
    generate,
    kv_cache_bytes,
    last_tokens,
    pad_prompts,
    prefill,
    prefill_chunk,
    shortest_prompt_bound,
)
from hyquant_jax.model_attention import HybridAttention, make_attention
from hyquant_jax.sampling import SamplingConfig, sample
from models import BF16Attention, ModelConfig, init_model, split_model

CONFIG = ModelConfig("llama", vocab_size=96, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                     num_kv_heads=2, head_dim=32, max_position=1024)
SMALL_HQ = HyQuantConfig(window=16, block_size=16, prefill_block=16, rho=0.1)
PROMPT_LENGTHS = (37, 70, 5)


@pytest.fixture(scope="module")
def model():
    return init_model(jax.random.PRNGKey(0), CONFIG, jnp.float32)


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(1)
    return [rng.integers(0, CONFIG.vocab_size, n).tolist() for n in PROMPT_LENGTHS]


def _run(model, prompts, attention, n=24, **kw):
    return generate(model, prompts, attention=attention, max_new_tokens=n, eos_ids=kw.pop("eos_ids", ()), **kw)


def test_greedy_and_sampling_are_deterministic(model, prompts):
    attn = make_attention("hyquant", SMALL_HQ)
    a, b = _run(model, prompts, attn), _run(model, prompts, attn)
    assert np.array_equal(a.tokens, b.tokens) and a.tokens.shape == (3, 24)
    hot = SamplingConfig(temperature=0.8, top_k=20, top_p=0.9)
    s1 = _run(model, prompts, BF16Attention(), sampling=hot, seed=3)
    s2 = _run(model, prompts, BF16Attention(), sampling=hot, seed=3)
    assert np.array_equal(s1.tokens, s2.tokens)
    assert s1.tokens.min() >= 0 and s1.tokens.max() < CONFIG.vocab_size


@pytest.mark.parametrize("kind", ["bf16", "hyquant", "kivi4"])
def test_ragged_batch_equals_single_prompts(model, prompts, kind):
    attn = make_attention(kind, SMALL_HQ)
    batch = _run(model, prompts, attn)
    for i, p in enumerate(prompts):
        alone = _run(model, [p], attn)
        assert batch.sequences()[i] == alone.sequences()[0], (kind, i)


def test_eos_stops_each_sequence(model, prompts):
    free = _run(model, prompts, BF16Attention())
    seq = free.sequences()[0]
    stop = next(i for i in range(1, len(seq)) if seq[i] not in seq[:i])
    eos = seq[stop]
    res = _run(model, prompts, BF16Attention(), eos_ids=(eos,), pad_id=CONFIG.vocab_size - 1)
    for i, row in enumerate(free.sequences()):
        want = row[:row.index(eos) + 1] if eos in row else row
        assert res.sequences()[i] == want
        assert np.all(res.tokens[i, len(want):] == CONFIG.vocab_size - 1)
    assert res.lengths[0] == stop + 1
    assert np.array_equal(res.cache_lengths, res.prompt_lengths + res.lengths - 1)


def test_eos_as_first_token_and_single_new_token(model, prompts):
    first = _run(model, prompts, BF16Attention(), n=1)
    assert first.tokens.shape == (3, 1) and np.all(first.lengths == 1) and first.decode_steps == 0
    res = _run(model, prompts, BF16Attention(), eos_ids=(int(first.tokens[1, 0]),))
    assert res.lengths[1] == 1


@pytest.mark.parametrize("hq", [
    HyQuantConfig(window=128, block_size=64, prefill_block=64),  # W >= prompt + generated: all in the window
    dataclasses.replace(SMALL_HQ, rho=1.0),  # every prefix and flushed token is VL (full precision)
], ids=["window_covers_all", "rho_1"])
def test_hyquant_equals_bf16_when_nothing_is_quantized(model, prompts, hq):
    ref = _run(model, prompts, BF16Attention())
    res = _run(model, prompts, HybridAttention(hq, backend="reference"), keep_states=True)
    assert np.array_equal(res.tokens, ref.tokens)
    cache = res.states[0]
    assert int(cache.page_count.sum()) == 0  # no token went to the low-bit region


@pytest.mark.parametrize("kind", ["bf16", "hyquant_exact_prefill", "kivi4", "bf16_triton", "hyquant_triton"])
def test_chunked_prefill_matches_whole_prompt(model, prompts, kind):
    """Chunks of 32 give the whole prompt's tokens and caches, with each chunk's attention through XLA or
    (`_triton`, `chunk_impl="triton"`) the fused kernel in interpret mode."""
    hq = dataclasses.replace(SMALL_HQ, prefill_qk="bf16")  # hybrid prefill then equals exact attention
    impl = "triton" if kind.endswith("_triton") else "xla"
    if kind.startswith("hyquant"):
        attn = HybridAttention(hq, chunk_impl=impl)
    else:
        attn = BF16Attention(chunk_impl=impl) if kind.startswith("bf16") else make_attention(kind)
    whole = _run(model, prompts, attn, prefill_chunk=2048, keep_states=True)
    chunked = _run(model, prompts, attn, prefill_chunk=32, bucket=32, max_len=whole.max_len, keep_states=True)
    assert np.array_equal(chunked.tokens, whole.tokens)
    if not kind.startswith("bf16"):
        for a, b in zip(jax.tree_util.tree_leaves(whole.states[1]), jax.tree_util.tree_leaves(chunked.states[1])):
            np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=1e-6)


@pytest.mark.parametrize("kind", ["bf16", "hyquant"])
def test_prefill_one_chunk_per_call_equals_prefill(model, prompts, kind):
    """`prefill_chunk` call by call, then `finish_chunked_prefill`: the logits and decode states of `prefill`'s
    chunked loop over the same tokens (what a server interleaves with decode steps)."""
    attention = make_attention(kind, SMALL_HQ if kind == "hyquant" else None)
    model_def, weights = split_model(model)
    tokens, lengths = pad_prompts(prompts, 0, 32, 32)
    tokens, lengths = jnp.asarray(tokens), jnp.asarray(lengths)
    t, max_len = tokens.shape[1], tokens.shape[1] + 32
    _, want_logits, want = prefill(model_def, weights, tokens, lengths, jax.random.PRNGKey(0), attention=attention,
                                   sampling=SamplingConfig(), chunk=32, max_len=max_len)
    states = chunked_prefill_states(model, attention, len(prompts), t, max_len)
    logits = jnp.zeros((len(prompts), CONFIG.vocab_size), jnp.float32)
    for offset in range(0, t, 32):
        states, logits = prefill_chunk(model_def, weights, states, logits, tokens[:, offset:offset + 32],
                                       jnp.int32(offset), lengths, attention=attention, max_len=max_len)
    got = finish_chunked_prefill(states, lengths, attention=attention, max_len=max_len)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(want_logits), rtol=1e-5, atol=1e-5)
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=2e-2)


def test_quantized_baselines(model, prompts):
    ref = _run(model, [prompts[0]], BF16Attention(), n=8)
    short = _run(model, [prompts[0]], make_attention("kivi4"), n=8)  # 37 + 8 tokens fit the bf16 residual
    assert np.array_equal(short.tokens, ref.tokens)
    long = [prompts[1] * 3, prompts[0]]  # 210 tokens: beyond KIVI's 128-token residual
    for kind in ("uniform4", "kivi2"):
        res = _run(model, long, make_attention(kind), n=8, keep_states=True)
        assert res.tokens.shape == (2, 8) and res.tokens.max() < CONFIG.vocab_size
        assert int(res.states[0].page_count[0].sum()) > 0


def test_kv_cache_bytes(model, prompts):
    long = [prompts[1] * 4]  # 280 tokens: most of them leave the 16-token window
    for kind, attn in (("bf16", BF16Attention(cache_dtype=jnp.bfloat16)),
                       ("hyquant", HybridAttention(SMALL_HQ, cache_dtype=jnp.bfloat16))):
        res = _run(model, long, attn, n=4, keep_states=True)
        used = kv_cache_bytes(attn, res.states, res.cache_lengths)
        bf16 = res.cache_lengths * CONFIG.kv_bytes_per_token(2)
        if kind == "bf16":
            assert used.tolist() == bf16.tolist()
        else:
            assert used[0] < 0.6 * bf16[0]


def test_shortest_prompt_bound():
    assert [shortest_prompt_bound(np.array(x)) for x in ([1], [5, 9], [32768, 40000], [1100, 1030], [])] == [
        1, 4, 32768, 1024, 0]


def test_generate_sizes_the_cache_for_the_shortest_prompt(monkeypatch):
    """The hybrid cache is sized for prompts >= shortest_prompt_bound: here the VL region needs 64 slots
    instead of the 128 that a short prompt decoding to max_len could fill; the tokens do not change."""
    cfg = dataclasses.replace(CONFIG, max_position=2048)
    hq = HyQuantConfig(window=16, block_size=16, prefill_block=16, rho=0.02)
    rng = np.random.default_rng(2)
    long = [rng.integers(0, cfg.vocab_size, n).tolist() for n in (1100, 1030)]
    attn = make_attention("hyquant", hq)
    model = init_model(jax.random.PRNGKey(0), cfg, jnp.float32)

    def run():
        return generate(model, long, attention=attn, max_new_tokens=4, eos_ids=(), keep_states=True)

    bounded = run()
    assert bounded.states[0].vl_capacity == capacities(bounded.max_len, hq, 1024)[1] == 64
    monkeypatch.setattr(importlib.import_module("hyquant_jax.generate"), "shortest_prompt_bound", lambda lengths: 0)
    unbounded = run()
    assert unbounded.states[0].vl_capacity == capacities(bounded.max_len, hq)[1] == 128
    assert np.array_equal(bounded.tokens, unbounded.tokens)


@pytest.mark.parametrize("kind,sampling,chunk", [("hyquant", SamplingConfig(), 5),
                                                 ("bf16", SamplingConfig(temperature=0.9, top_k=30), 7),
                                                 ("hyquant", SamplingConfig(temperature=0.7), 16)])
def test_streaming_gives_the_tokens_of_one_call(model, prompts, kind, sampling, chunk):
    """generate(on_tokens=...) decodes in calls of `chunk` steps and hands over each call's new tokens: their
    concatenation is each sequence's result, the same tokens as one call (sampled ones too: a token's key is
    its position's), also when sequences stop at a stop token in different calls."""
    attn = make_attention(kind, SMALL_HQ)
    whole = _run(model, prompts, attn, n=23, sampling=sampling, seed=4)
    eos = (int(whole.tokens[0, 9]),)  # a token sequence 0 generates: at least one sequence stops early
    whole = _run(model, prompts, attn, n=23, sampling=sampling, seed=4, eos_ids=eos)
    seen = [[] for _ in prompts]
    calls = []

    def on_tokens(new):
        calls.append([len(x) for x in new])
        for s, x in zip(seen, new):
            s += x

    streamed = _run(model, prompts, attn, n=23, sampling=sampling, seed=4, eos_ids=eos, on_tokens=on_tokens,
                    stream_chunk=chunk)
    assert seen == whole.sequences() == streamed.sequences()
    np.testing.assert_array_equal(streamed.tokens, whole.tokens)
    np.testing.assert_array_equal(streamed.lengths, whole.lengths)
    np.testing.assert_array_equal(streamed.cache_lengths, whole.cache_lengths)
    assert streamed.decode_steps == whole.decode_steps
    assert len(calls) >= 2 and all(n <= chunk for c in calls for n in c)
    assert min(len(s) for s in seen) < 23  # the stop token ended a sequence


@pytest.mark.parametrize("kind", ["hyquant", "bf16"])
def test_streaming_runs_the_requested_steps_at_the_context_limit(kind):
    """A prompt that fills the context but max_new_tokens (prompt + n == max_position) streams as it runs without
    streaming: the same tokens, steps (n - 1), cached tokens (prompt + n - 1), capacity and cache bytes, with n
    not a multiple of the chunk's steps, so that the last call is a shorter one."""
    n, chunk, limit = 20, 8, 256
    model = init_model(jax.random.PRNGKey(0), dataclasses.replace(CONFIG, max_position=limit), jnp.float32)
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, CONFIG.vocab_size, limit - n).tolist(), rng.integers(0, CONFIG.vocab_size, 90).tolist()]
    attn = make_attention(kind, SMALL_HQ if kind == "hyquant" else None)
    whole = _run(model, prompts, attn, n=n, keep_states=True)
    calls = []
    streamed = _run(model, prompts, attn, n=n, keep_states=True, on_tokens=calls.append, stream_chunk=chunk)
    np.testing.assert_array_equal(streamed.tokens, whole.tokens)
    assert streamed.decode_steps == whole.decode_steps == n - 1
    np.testing.assert_array_equal(streamed.cache_lengths, whole.cache_lengths)
    np.testing.assert_array_equal(whole.cache_lengths, [len(p) + n - 1 for p in prompts])
    assert streamed.max_len == whole.max_len == limit
    np.testing.assert_array_equal(kv_cache_bytes(attn, streamed.states, streamed.cache_lengths),
                                  kv_cache_bytes(attn, whole.states, whole.cache_lengths))
    assert [sum(len(c[i]) for c in calls) for i in range(2)] == [n, n] and len(calls) == 3  # 8 + 7 + 5 tokens


def test_streaming_argument_errors(model, prompts):
    with pytest.raises(ValueError, match="on_tokens must be None or a callable"):
        _run(model, prompts, BF16Attention(), on_tokens=[])
    with pytest.raises(ValueError, match="stream_chunk must be an int >= 2"):
        _run(model, prompts, BF16Attention(), on_tokens=print, stream_chunk=1)


def test_sampled_tokens_do_not_depend_on_the_batch(model, prompts):
    """Each sampled token draws with a key of its position, so a sequence samples the same tokens alone as in
    a batch (as greedy tokens do)."""
    hot = SamplingConfig(temperature=1.0)
    batch = _run(model, prompts, BF16Attention(), n=12, sampling=hot, seed=2)
    for i, p in enumerate(prompts):
        alone = _run(model, [p], BF16Attention(), n=12, sampling=hot, seed=2)
        assert alone.sequences()[0] == batch.sequences()[i]


def test_sampling_filters():
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]] * 512))
    keys = jax.random.PRNGKey(0)
    assert set(np.asarray(sample(logits, keys, SamplingConfig(1.0, top_k=2))).tolist()) == {0, 1}
    assert set(np.asarray(sample(logits, keys, SamplingConfig(1.0, top_p=0.7))).tolist()) == {0, 1}
    assert set(np.asarray(sample(logits, keys, SamplingConfig(1.0, top_p=0.01))).tolist()) == {0}
    assert set(np.asarray(sample(logits, keys, SamplingConfig(1.0))).tolist()) == {0, 1, 2, 3}
    assert np.all(np.asarray(sample(logits, keys, SamplingConfig())) == 0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(top_p=0.0)


@pytest.mark.parametrize("field,value", [("temperature", float("nan")), ("temperature", float("inf")),
                                         ("temperature", -0.5), ("temperature", True), ("top_k", -1),
                                         ("top_k", 2.0), ("top_p", float("nan")), ("top_p", 1.5)])
def test_sampling_config_refuses_bad_values(field, value):
    """NaN compares false with everything, so it must be refused explicitly (it used to give empty text)."""
    with pytest.raises(ValueError, match=f"SamplingConfig.{field} must be"):
        SamplingConfig(**{field: value})


def test_top_k_one_is_greedy(model, prompts):
    greedy = _run(model, prompts, BF16Attention(), n=8)
    top1 = _run(model, prompts, BF16Attention(), n=8, sampling=SamplingConfig(0.7, top_k=1), seed=5)
    assert np.array_equal(greedy.tokens, top1.tokens)


def test_decode_donates_the_cache(model, prompts):
    """The per-layer states passed to decode are donated (consumed and updated in place)."""
    tokens, lengths = pad_prompts(prompts)
    static = dict(attention=BF16Attention(), sampling=SamplingConfig())
    key = jax.random.PRNGKey(0)
    model_def, weights = split_model(model)
    first, _, states = prefill(model_def, weights, jnp.asarray(tokens), jnp.asarray(lengths), key, chunk=2048,
                               max_len=128, **static)
    leaves = jax.tree_util.tree_leaves(states)
    decode(model_def, weights, states, first, jnp.asarray(lengths), key, max_new_tokens=4, eos_ids=(), pad_id=0,
           **static)
    assert all(x.is_deleted() for x in leaves)
    assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(weights))  # the weights are kept


@pytest.mark.parametrize("kind", ["bf16", "hyquant", "kivi4", "uniform4"])
def test_decode_updates_each_state_in_its_own_buffer(model, prompts, kind):
    """Calling decode on the states it returned keeps every state array at the address it came in (the
    serving pattern: e2e.py's timed calls). jit gives each output, in output order, the buffer of the first
    unused donated input of its shape and dtype; when the int32 [B] counts came before the states, the
    quantized caches' int32 [B] counters moved to each other's buffers on every call (bf16's state has no
    such arrays), and on the GPU every moved buffer re-records the loop graph's commands that use it."""
    attn = make_attention(kind, SMALL_HQ)
    static = dict(attention=attn, sampling=SamplingConfig())
    tokens, lengths = pad_prompts(prompts)
    key = jax.random.PRNGKey(0)
    model_def, weights = split_model(model)
    first, _, states = prefill(model_def, weights, jnp.asarray(tokens), jnp.asarray(lengths), key, chunk=2048,
                               max_len=tokens.shape[1] + 40, **static)
    positions = jnp.asarray(lengths)
    addresses = None
    for _ in range(3):
        states, out, _, positions, _ = decode(model_def, weights, states, first, positions, key, max_new_tokens=9,
                                              eos_ids=(), pad_id=0, **static)
        first = out[:, -1]
        now = [x.unsafe_buffer_pointer() for x in jax.tree_util.tree_leaves(states)]
        assert addresses is None or now == addresses, kind
        addresses = now
    assert any(x.dtype == jnp.int32 and x.shape == (len(prompts),) for x in jax.tree_util.tree_leaves(states)) \
        or kind == "bf16"  # the quantized caches hold the int32 [B] counters this is about


def _host_copy(tree):
    """NumPy values of device copies: on the CPU an array read to the host keeps a view of its buffer, which
    then cannot be donated (the donating call copies it instead)."""
    return jax.tree_util.tree_map(lambda x: np.asarray(jnp.copy(x)), tree)


@pytest.mark.parametrize("kind", ["bf16", "hyquant"])
def test_decode_in_place_keeps_every_buffer_and_equals_decode(model, prompts, kind):
    """Chained `decode_in_place` calls (with `last_tokens` between them) give `decode`'s tokens, counts, cache
    lengths, steps and states, and from the second call on every input and output array of a call sits where
    the previous call's did: the states, first, lengths, tokens, counts and steps (plain `decode` gives its
    outputs new buffers while the caller holds the previous ones)."""
    attn = make_attention(kind, SMALL_HQ)
    static = dict(attention=attn, sampling=SamplingConfig(), max_new_tokens=9, eos_ids=(), pad_id=0)
    tokens, lengths = pad_prompts(prompts)
    key = jax.random.PRNGKey(0)
    model_def, weights = split_model(model)

    def start():
        first, _, states = prefill(model_def, weights, jnp.asarray(tokens), jnp.asarray(lengths), key, chunk=2048,
                                   max_len=tokens.shape[1] + 40, attention=attn, sampling=SamplingConfig())
        return states, first, jnp.asarray(lengths)

    states, first, positions = start()
    want = []
    for _ in range(3):
        states, out, count, positions, steps = decode(model_def, weights, states, first, positions, key, **static)
        first = out[:, -1]
        want.append(_host_copy((out, count, positions, steps, states)))

    states, first, positions = start()
    b = len(prompts)
    out, steps = jnp.zeros((b, 9), jnp.int32), jnp.zeros((), jnp.int32)
    addresses = []
    for call in range(3):
        if call:
            first = last_tokens(out, count)
        states, out, count, positions, steps = decode_in_place(model_def, weights, states, first, positions, key,
                                                               (out, steps), **static)
        got = _host_copy((out, count, positions, steps, states))
        for w, g in zip(jax.tree_util.tree_leaves(want[call]), jax.tree_util.tree_leaves(got)):
            np.testing.assert_array_equal(g, w)
        addresses.append([x.unsafe_buffer_pointer() for x in jax.tree_util.tree_leaves(
            (states, out, count, positions, steps))])
    assert addresses[1] == addresses[2], [i for i, (a, b) in enumerate(zip(*addresses[1:])) if a != b]
    assert first.is_deleted()  # donated: the counts took its buffer
    first = last_tokens(out, count)
    with pytest.raises(ValueError, match=r"previous must be \(tokens int32 \[3, 9\], steps int32 \[\]\)"):
        decode_in_place(model_def, weights, states, first, positions, key, (out[:, :8], steps), **static)


@dataclasses.dataclass(frozen=True)
class _FlushEveryStep(HybridAttention):
    """HybridAttention as a decode loop without `steps_until_begin` sees it: the flush branch every step."""

    steps_until_begin = None


@dataclasses.dataclass(frozen=True)
class _KiviFlushEveryStep(type(make_attention("kivi4"))):
    steps_until_begin = None


@pytest.mark.parametrize("kind", ["hyquant", "kivi4"])
def test_runs_of_steps_equal_a_flush_check_every_step(model, prompts, kind):
    """decode's inner loop between ring flushes gives the same tokens, counts, steps and final states, bit
    for bit, as the flush branch before every step: ragged prompts (rings at different phases), several
    flushes per sequence (16-slot blocks, 40 steps), and a sequence that stops at EOS mid-run."""
    if kind == "hyquant":
        runs, every = HybridAttention(SMALL_HQ, backend="reference"), _FlushEveryStep(SMALL_HQ, backend="reference")
    else:  # KIVI's ring holds 128-160 tokens: prompts long enough to flush during decode
        runs = make_attention("kivi4")
        every = _KiviFlushEveryStep(runs.config, runs.cache_dtype, runs.name, runs.f32_probs)
        prompts = [prompts[1] * 2, prompts[0] * 3, prompts[1] + prompts[2]]
    tokens, lengths = pad_prompts(prompts)
    key = jax.random.PRNGKey(3)
    model_def, weights = split_model(model)
    free = _run(model, prompts, runs, n=40)
    eos = (int(free.tokens[0, 21]),)  # the first sequence stops there (or earlier), the others may go on
    for eos_ids in ((), eos):
        results = []
        for attn in (runs, every):
            static = dict(attention=attn, sampling=SamplingConfig())
            first, _, states = prefill(model_def, weights, jnp.asarray(tokens), jnp.asarray(lengths), key,
                                       chunk=2048, max_len=tokens.shape[1] + 48, **static)
            results.append(decode(model_def, weights, states, first, jnp.asarray(lengths), key, max_new_tokens=40,
                                  eos_ids=eos_ids, pad_id=0, **static))
        (states, out, count, pos, steps), (states2, out2, count2, pos2, steps2) = results
        assert np.array_equal(out, out2) and np.array_equal(count, count2) and np.array_equal(pos, pos2)
        assert int(steps) == int(steps2)
        assert int(states[0].num_pages.max()) > 0  # blocks were flushed during decode
        for a, b in zip(jax.tree_util.tree_leaves(states), jax.tree_util.tree_leaves(states2)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert int(count[0]) < 40  # the EOS run stopped the first sequence early


def test_prefill_and_decode_run_inside_a_callers_jit(model, prompts):
    """JAX takes XLA compiler options on top-level jits only: inside a caller's jit, prefill and decode run as
    plain nested jits (no error) and give the tokens they give at the top level."""
    static = dict(attention=HybridAttention(SMALL_HQ, backend="reference"), sampling=SamplingConfig())
    tokens, lengths = pad_prompts(prompts)
    model_def, weights = split_model(model)

    def both(weights, tokens, lengths, key):
        first, _, states = prefill(model_def, weights, tokens, lengths, key, chunk=2048,
                                   max_len=tokens.shape[1] + 24, **static)
        _, out, count, *_ = decode(model_def, weights, states, first, lengths, key, max_new_tokens=20, eos_ids=(),
                                   pad_id=0, **static)
        return out, count

    args = (weights, jnp.asarray(tokens), jnp.asarray(lengths), jax.random.PRNGKey(3))
    for a, b in zip(jax.jit(both)(*args), both(*args)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_generate_errors(model, prompts):
    attn = BF16Attention()
    with pytest.raises(ValueError, match="max_new_tokens"):
        _run(model, prompts, attn, n=0)
    with pytest.raises(ValueError, match="max_len=50 is too small"):
        _run(model, prompts, attn, max_len=50)
    with pytest.raises(ValueError, match="token ids"):
        _run(model, [[0, CONFIG.vocab_size]], attn)
    with pytest.raises(ValueError, match="at least one token"):
        _run(model, [[1, 2], []], attn)
    with pytest.raises(ValueError, match=r"prompts\[1\] must be a flat sequence of integer token ids, got float64"):
        _run(model, [[1, 2], [1.5, 2]], attn)
    with pytest.raises(ValueError,
                       match=r"prompts\[0\] must be a flat sequence of integer token ids, got int\d+ \[1, 2\]"):
        _run(model, [[[1, 2]]], attn)
    with pytest.raises(ValueError, match="max_position"):
        _run(model, prompts, attn, n=1000)
    with pytest.raises(ValueError, match=r"attention must be an attention implementation .* got 'hyquant'"):
        _run(model, prompts, "hyquant")
    with pytest.raises(ValueError, match=r"pad_id must be a token id in \[0, 96\), got -1"):
        _run(model, prompts, attn, pad_id=-1)
    narrow = init_model(jax.random.PRNGKey(0), dataclasses.replace(CONFIG, hidden_size=32))
    narrow.config = CONFIG  # weights made for another config
    with pytest.raises(ValueError, match=r"model.embed has shape \(96, 32\), config needs \(96, 64\)"):
        _run(narrow, prompts, attn)
    model_def, weights = split_model(model)
    ints = model_def.merge({**weights, "final_norm": weights["final_norm"].astype(jnp.int32)})
    with pytest.raises(ValueError, match=r"model.final_norm must be floating-point, got int32"):
        _run(ints, prompts, attn)
    with pytest.raises(ValueError, match="model must be a models.Decoder"):
        generate(weights, prompts, attention=attn, max_new_tokens=2)
    with pytest.raises(ValueError, match="init_model: dtype must be floating-point"):
        init_model(jax.random.PRNGKey(0), CONFIG, jnp.int8)
    with pytest.raises(ValueError, match="backend"):
        HybridAttention(SMALL_HQ, backend="cuda")


def test_prefill_compiler_options():
    """prefill's command-buffer kinds are valid XLA enum names (XLA rejects unknown ones at compile time,
    also on CPU) and leave CUSTOM_CALL out; an XLA_FLAGS setting of the same option wins."""
    from hyquant_jax.compile_options import prefill_compiler_options

    options = prefill_compiler_options("")
    kinds = options["xla_gpu_enable_command_buffer"].split(",")
    assert "CUSTOM_CALL" not in kinds and "FUSION" in kinds
    x = jnp.arange(4.0)
    np.testing.assert_array_equal(jax.jit(lambda a: a * 2, compiler_options=options)(x), x * 2)
    with pytest.raises(Exception, match="not a valid enum value"):
        jax.jit(lambda a: a * 3, compiler_options={"xla_gpu_enable_command_buffer": "FUSION,NOT_A_KIND"})(x)
    assert prefill_compiler_options("--xla_gpu_enable_command_buffer= --xla_dump_to=/tmp") == {}


def test_decode_compiler_options():
    """decode's scheduling mode is a valid XLA enum value (checked at compile time, also on CPU); an
    XLA_FLAGS setting of the same option wins."""
    from hyquant_jax.compile_options import decode_compiler_options

    options = decode_compiler_options("--xla_dump_to=/tmp")
    assert options == {"xla_gpu_command_buffer_scheduling_mode": "CONCURRENT"}
    x = jnp.arange(4.0)
    np.testing.assert_array_equal(jax.jit(lambda a: a * 2, compiler_options=options)(x), x * 2)
    with pytest.raises(Exception, match="not a valid enum value"):
        jax.jit(lambda a: a * 3, compiler_options={"xla_gpu_command_buffer_scheduling_mode": "CONCURRENTLY"})(x)
    assert decode_compiler_options("--xla_gpu_command_buffer_scheduling_mode=LHS") == {}
    device = decode_compiler_options("", device_loops=True)
    assert device["xla_gpu_enable_command_buffer"].split(",")[-1] == "WHILE"
    np.testing.assert_array_equal(jax.jit(lambda a: a * 2, compiler_options=device)(x), x * 2)
    assert "xla_gpu_enable_command_buffer" not in decode_compiler_options(
        "--xla_gpu_enable_command_buffer=FUSION", device_loops=True)


def test_decode_loops_run_on_the_device_when_they_stop_on_data():
    """Host-driven loops where XLA knows the trip count (no stop tokens, one flat loop), device-side ones
    otherwise (stop tokens; the hybrid cache's inner loop between flushes), also through a sharding wrapper."""
    import types

    from hyquant_jax.compile_options import uses_device_loops

    hybrid = make_attention("hyquant", SMALL_HQ)
    assert not uses_device_loops(BF16Attention(), ())
    assert uses_device_loops(BF16Attention(), (2,))
    assert uses_device_loops(hybrid, ())
    assert uses_device_loops(types.SimpleNamespace(inner=hybrid), ())
    assert not uses_device_loops(types.SimpleNamespace(inner=BF16Attention()), ())


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["bf16", "hyquant"])
def test_gpu_decode_loops_on_the_device_match_the_host_loops(monkeypatch, kind):
    """`decode` with WHILE among its command-buffer kinds (the loops run as device-side loops in the CUDA graph)
    gives the same tokens, lengths and caches as with the loops driven from the host (one condition read-back a
    step), bit for bit: greedy, a ragged batch, a stop token that ends one sequence early, more steps than a
    window flush period; hyquant through the Triton and Mosaic kernels (the Mosaic threshold lowered)."""
    import pallas_kernels.decode_mgpu as decode_mgpu
    from hyquant_jax import compile_options, decode_launch

    module = importlib.import_module("hyquant_jax.generate")  # the package exports a function of that name
    config = dataclasses.replace(CONFIG, architecture="qwen3", qk_norm=True, vocab_size=512, hidden_size=1024,
                                 intermediate_size=1024, num_heads=32, num_kv_heads=8, head_dim=128)
    model = init_model(jax.random.PRNGKey(5), config, jnp.bfloat16)
    rng = np.random.default_rng(6)
    prompts = [rng.integers(0, config.vocab_size, n).tolist() for n in (411, 333)]
    attn = BF16Attention() if kind == "bf16" else make_attention("hyquant", HyQuantConfig(), backend="triton")
    mosaic_calls = []
    monkeypatch.setattr(decode_launch, "MOSAIC_MIN_PAGES", 1)
    real = decode_mgpu.low_bit_splits
    monkeypatch.setattr(decode_mgpu, "low_bit_splits", lambda *a, **k: mosaic_calls.append(1) or real(*a, **k))
    base = compile_options.decode_compiler_options("")

    def run(kinds, eos=()):
        options = {**base, "xla_gpu_enable_command_buffer": ",".join(kinds)}
        monkeypatch.setattr(module, "decode", module.decode_with_options(options))
        return module.generate(model, prompts, attention=attn, max_new_tokens=100, eos_ids=eos, keep_states=True)

    host = compile_options.XLA_COMMAND_BUFFER_KINDS
    device = host + ("WHILE",)
    free = run(host)
    seq = free.sequences()[0]
    firsts = [i for i in range(1, len(seq)) if seq[i] not in seq[:i]]  # a token's first place: stops there
    stop = next((i for i in firsts if i >= 40), firsts[-1] if firsts else len(seq) - 1)  # past a flush if it can
    for eos in ((), (seq[stop],) if firsts else (config.vocab_size,)):
        a, b = run(host, eos), run(device, eos)
        np.testing.assert_array_equal(a.tokens, b.tokens)
        np.testing.assert_array_equal(a.lengths, b.lengths)
        for x, y in zip(jax.tree_util.tree_leaves(a.states), jax.tree_util.tree_leaves(b.states)):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert a.lengths[0] == stop + 1 and a.lengths[1] <= 100
    assert kind == "bf16" or mosaic_calls  # the hybrid decode traced the Mosaic kernel
