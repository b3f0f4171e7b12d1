"""hyquant_jax.serving.Engine on a tiny random model: each request's tokens equal `generate` on its prompt alone
(greedy and sampled, hybrid and bf16 caches), whatever arrives when, in how many slots, and whatever is
cancelled; the slot accounting holds after every step; bad requests are refused with clear errors.

Few programs are compiled (XLA:CPU compiles of the hybrid cache take seconds): every prompt pads to one size
(bucket 64) and has the same power-of-two lower bound (32), so each `generate` reference and each engine
compiles one prefill and one decode step.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hyquant_jax import HyQuantConfig
from hyquant_jax.generate import generate
from hyquant_jax.model_attention import make_attention
from hyquant_jax.sampling import SamplingConfig
from hyquant_jax.serving import Engine, QueueFull
from models import ModelConfig, init_model

CONFIG = ModelConfig("llama", vocab_size=96, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                     num_kv_heads=2, head_dim=32, max_position=1024)
# window 16 and block 16: prompts of 32+ tokens freeze pages and VL tokens, and 24 decoded tokens flush the ring
SMALL_HQ = HyQuantConfig(window=16, block_size=16, prefill_block=16, rho=0.1)
CONTEXT = 128
MAX_TOKENS = 24
PROMPT_LENGTHS = (32, 45, 63, 38, 57, 33)


@pytest.fixture(scope="module")
def model():
    return init_model(jax.random.PRNGKey(0), CONFIG, jnp.float32)


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(7)
    return [rng.integers(0, CONFIG.vocab_size, n).tolist() for n in PROMPT_LENGTHS]


def _alone(model, prompt, attention, sampling=SamplingConfig(), seed=0):
    """`generate` on one prompt, with the engine's capacity per sequence."""
    return generate(model, [prompt], attention=attention, max_new_tokens=MAX_TOKENS, eos_ids=(), max_len=CONTEXT,
                    sampling=sampling, seed=seed).sequences()[0]


@pytest.fixture(scope="module")
def hybrid():
    return make_attention("hyquant", SMALL_HQ)


@pytest.fixture(scope="module")
def hybrid_alone(model, prompts, hybrid):
    return [_alone(model, p, hybrid) for p in prompts]


def _engine(model, attention, slots, **kw):
    return Engine(model, attention, max_slots=slots, context=CONTEXT, eos_ids=(), **kw)


def _step_checked(engine):
    updates = engine.step()
    engine.check_invariants()
    return updates


# A request: (prompt index, max_tokens, arrival step, cancel step or None, index of the reference token to
# stop at or None).
REQUEST = st.tuples(st.integers(0, len(PROMPT_LENGTHS) - 1), st.integers(1, MAX_TOKENS), st.integers(0, 12),
                    st.none() | st.integers(0, 30), st.none() | st.integers(0, MAX_TOKENS - 1))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(slots=st.sampled_from([2, 3]), requests=st.lists(REQUEST, min_size=1, max_size=7))
def test_each_request_gets_the_tokens_of_its_prompt_alone(model, prompts, hybrid, hybrid_alone, slots, requests):
    engine = _engine(model, hybrid, slots)
    ids, streamed = {}, {}
    last_arrival = max(r[2] for r in requests)
    step = 0
    while step <= last_arrival or engine.busy:
        for n, (p, max_tokens, arrival, _, stop_at) in enumerate(requests):
            if arrival == step:
                stop = () if stop_at is None else (hybrid_alone[p][stop_at],)
                ids[n] = engine.add_request(prompts[p], max_tokens=max_tokens, stop=stop)
        for n, (*_, cancel, _) in enumerate(requests):
            if cancel == step and n in ids:
                engine.cancel(ids[n])
        for rid, update in _step_checked(engine).items():
            streamed.setdefault(rid, []).extend(update.tokens)
        step += 1
    assert engine.slots() == (None,) * slots and not engine.busy
    results = engine.run()
    assert sorted(results) == sorted(ids.values())
    for n, (p, max_tokens, arrival, cancel, stop_at) in enumerate(requests):
        res = results[ids[n]]
        want, reason = hybrid_alone[p][:max_tokens], "length"
        if stop_at is not None and hybrid_alone[p][stop_at] in want:
            want, reason = want[:want.index(hybrid_alone[p][stop_at]) + 1], "stop"
        assert res.prompt_tokens == prompts[p]
        assert res.tokens == streamed.get(res.id, [])
        if res.finish_reason == "cancelled":
            assert cancel is not None and res.tokens == want[:len(res.tokens)] and len(res.tokens) < len(want)
        else:
            assert (res.tokens, res.finish_reason) == (want, reason), (n, requests)


def test_bf16_cache_and_sampling_through_the_same_engine(model, prompts):
    """Greedy and sampled requests side by side in the bf16 cache: each equals `generate` alone with its seed."""
    bf16 = make_attention("bf16")
    hot = SamplingConfig(temperature=0.8, top_k=20, top_p=0.9)
    engine = _engine(model, bf16, 2, prefills_per_step=2)
    engine.compile()
    greedy = engine.add_request(prompts[0], max_tokens=MAX_TOKENS)
    sampled = engine.add_request(prompts[1], max_tokens=MAX_TOKENS, sampling=hot, seed=5)
    waiting = engine.add_request(prompts[2], max_tokens=5)
    assert engine.slots() == (None, None) and engine.waiting == 3
    _step_checked(engine)
    assert engine.slots() == (greedy, sampled) and engine.waiting == 1
    while engine.busy:
        _step_checked(engine)
    results = engine.run()
    assert results[greedy].tokens == _alone(model, prompts[0], bf16)
    assert results[sampled].tokens == _alone(model, prompts[1], bf16, hot, seed=5)
    assert results[sampled].tokens != results[greedy].tokens
    assert results[waiting].tokens == _alone(model, prompts[2], bf16)[:5]


def test_stream_cancel_and_queue_limit(model, prompts, hybrid, hybrid_alone):
    compiles = []
    engine = _engine(model, hybrid, 2, max_queue=1, on_compile=compiles.append)
    first = engine.add_request(prompts[0], max_tokens=MAX_TOKENS)
    second = engine.add_request(prompts[1], max_tokens=MAX_TOKENS)
    third = engine.add_request(prompts[2], max_tokens=4)  # waits while the two slots are taken
    with pytest.raises(QueueFull, match="all 2 slots are taken and 1 requests already wait"):
        engine.add_request(prompts[3], max_tokens=4)
    tokens = []
    for update in engine.stream(first):
        tokens += update.tokens
        engine.check_invariants()
        if len(tokens) >= 3 and engine.cancel(second):
            assert second not in engine.slots()
    assert tokens == hybrid_alone[0] and engine.pop_result(first).finish_reason == "length"
    cancelled = engine.pop_result(second)
    assert cancelled.finish_reason == "cancelled" and cancelled.tokens == hybrid_alone[1][:len(cancelled.tokens)]
    assert not engine.cancel(second) and engine.pop_result(second) is None
    assert engine.run()[third].tokens == hybrid_alone[2][:4]
    assert engine.slots() == (None, None) and not engine.busy
    assert compiles == ["compiling the prefill of prompts padded to 64 tokens (once)"]


def test_a_free_slot_never_reaches_another_slots_tokens(model, prompts, hybrid, hybrid_alone):
    """Whatever a free slot's rows hold (here NaN in every float array), the running request's tokens are those of
    its prompt alone: nothing in the step mixes rows."""
    engine = _engine(model, hybrid, 2)
    rid = engine.add_request(prompts[3], max_tokens=MAX_TOKENS)
    _step_checked(engine)
    assert engine.slots() == (rid, None)
    engine._states = jax.tree_util.tree_map(  # poison the free slot's rows
        lambda x: x.at[1].set(jnp.nan) if jnp.issubdtype(x.dtype, jnp.floating) else x.at[1].set(-7), engine._states)
    while engine.busy:
        _step_checked(engine)
    assert engine.pop_result(rid).tokens == hybrid_alone[3]


@pytest.mark.parametrize("prompt, max_tokens, match", [
    ([], 4, "at least one token"),
    ([1] * CONTEXT, 1, "at most 127"),
    ([1] * 100, 29, "exceeds the context of 128"),
    ([1] * 10, 0, "max_tokens must be an int >= 1"),
    ([1] * 10, 2.5, "max_tokens must be an int >= 1"),
    ([1, CONFIG.vocab_size], 4, r"must lie in \[0, 96\)"),
    ("text", 4, "needs an engine with a tokenizer"),
])
def test_bad_requests_are_refused(model, hybrid, prompt, max_tokens, match):
    engine = _engine(model, hybrid, 2)
    with pytest.raises(ValueError, match=match):
        engine.add_request(prompt, max_tokens=max_tokens)
    assert not engine.busy


def test_prompt_sizes(model, hybrid):
    engine = Engine(model, hybrid, context=1024, prefill_chunk=256, bucket=32)
    assert [engine.padded_size(n) for n in (1, 32, 33, 64, 65, 200, 256, 257, 700)] == [
        32, 32, 64, 64, 128, 256, 256, 512, 768]
    assert Engine(model, hybrid, context=96, bucket=64).padded_size(70) == 96
    assert Engine(model, hybrid).context == 1024 and Engine(model, hybrid, prefill_chunk=300).context == 900


@pytest.mark.parametrize("kw, match", [
    (dict(context=100, prefill_chunk=64), "must be a multiple of prefill_chunk=64"),
    (dict(context=2048), r"context must be an int in \[1, 1024\]"),
    (dict(max_slots=0), "max_slots must be an int >= 1"),
])
def test_bad_engine_settings_are_refused(model, hybrid, kw, match):
    with pytest.raises(ValueError, match=match):
        Engine(model, hybrid, **kw)


CHUNK = 32  # prompts longer than this are prefilled one chunk per step
LONG = 70  # padded to 96: three chunks


def test_a_long_prompt_is_prefilled_one_chunk_per_step(model, prompts, hybrid):
    """A prompt longer than prefill_chunk is prefilled one chunk per step while the running request gains a token
    in every step; both get the tokens of their prompts alone; cancelling it mid-prefill frees its slot."""
    long_prompt = np.random.default_rng(3).integers(0, CONFIG.vocab_size, LONG).tolist()
    want_long, want_short = (
        generate(model, [p], attention=hybrid, max_new_tokens=MAX_TOKENS, eos_ids=(), max_len=CONTEXT,
                 prefill_chunk=CHUNK).sequences()[0] for p in (long_prompt, prompts[0]))
    compiles = []
    engine = _engine(model, hybrid, 2, prefill_chunk=CHUNK, on_compile=compiles.append)
    short = engine.add_request(prompts[0], max_tokens=MAX_TOKENS)
    _step_checked(engine)
    long = engine.add_request(long_prompt, max_tokens=MAX_TOKENS)
    for _ in range(2):  # chunks 1 and 2 of 3: the long request holds its slot but does not decode yet
        updates = _step_checked(engine)
        assert engine.prefilling == long and engine.slots() == (short, long)
        assert list(updates) == [short] and len(updates[short].tokens) == 1
    updates = _step_checked(engine)  # the last chunk, then its first decode step
    assert engine.prefilling is None and len(updates[long].tokens) == 2 and len(updates[short].tokens) == 1
    results = engine.run()
    assert results[short].tokens == want_short and results[long].tokens == want_long
    assert compiles == [f"compiling the prefill of prompts padded to {CHUNK} tokens (once)",
                        "compiling the chunked prefill of prompts padded to 96 tokens (once)"]

    first = engine.add_request(long_prompt, max_tokens=4)
    second = engine.add_request(long_prompt, max_tokens=MAX_TOKENS)
    _step_checked(engine)
    assert engine.prefilling == first and engine.slots() == (first, None) and engine.waiting == 1
    assert engine.cancel(first) and engine.prefilling is None and engine.slots() == (None, None)
    engine.check_invariants()
    assert engine.pop_result(first).finish_reason == "cancelled"
    assert engine.run()[second].tokens == want_long
