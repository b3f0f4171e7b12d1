"""models/: config parsing, RoPE, the Flax modules (init, split / merge under jit), and forward consistency
(chunked prefill, decode) on tiny random models."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from models import (
    BF16Attention,
    DecodeContext,
    Decoder,
    ModelConfig,
    PrefillContext,
    abstract_model,
    from_hf_config,
    init_model,
    split_model,
)
from models.config import rope_inv_freq
from models.layers import apply_rope, rope_cos_sin
from models.transformer import _project_qkv, check_model, fuse_qkv, layer_kernels, split_qkv

TINY = ModelConfig("llama", vocab_size=97, hidden_size=48, intermediate_size=96, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=16, rope_theta=10000.0, max_position=512)
VARIANTS = {
    "llama_tied": dataclasses.replace(TINY, tie_embeddings=True),
    "qwen2_bias": dataclasses.replace(TINY, architecture="qwen2", qkv_bias=True),
    "qwen3_qknorm": dataclasses.replace(TINY, architecture="qwen3", qk_norm=True, head_dim=24),
    "llama3_rope": dataclasses.replace(TINY, rope_type="llama3", rope_factor=8.0, rope_original_max_position=64),
    "qwen2_yarn": dataclasses.replace(TINY, architecture="qwen2", qkv_bias=True, rope_type="yarn", rope_factor=4.0,
                                      rope_original_max_position=64, rope_attention_factor=1.1386),
}


def _states(config, batch, max_len, attn=BF16Attention(), whole=True, prompt_len=None):
    return tuple(attn.prefill_state(config, batch, prompt_len or max_len, max_len, jnp.float32, whole)
                 for _ in range(config.num_layers))


def _full_logits(model, tokens):
    b, t = tokens.shape
    ctx = PrefillContext(jnp.int32(0), jnp.full((b,), t, jnp.int32), t, whole=True)
    logits, _ = model(tokens, ctx, _states(model.config, b, t), attention=BF16Attention())
    chex.assert_shape(logits, (b, t, model.config.vocab_size))
    return logits


def test_from_hf_config_families():
    base = {"model_type": "llama", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
            "rope_theta": 5e5, "tie_word_embeddings": True, "max_position_embeddings": 2048, "eos_token_id": [1, 2],
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 1024}}
    c = from_hf_config(base)
    assert (c.head_dim, c.num_kv_heads, c.tie_embeddings, c.rope_type, c.eos_token_ids) == (16, 2, True, "llama3",
                                                                                            (1, 2))
    q2 = from_hf_config({**base, "model_type": "qwen2", "rope_scaling": None, "use_sliding_window": False,
                         "sliding_window": 4096})
    assert q2.qkv_bias and not q2.qk_norm and q2.sliding_window is None
    q3 = from_hf_config({**base, "model_type": "qwen3", "head_dim": 32, "rope_scaling": None})
    assert q3.qk_norm and q3.head_dim == 32 and not q3.qkv_bias
    m = from_hf_config({**base, "model_type": "mistral", "sliding_window": 4096, "rope_scaling": None})
    assert m.sliding_window == 4096
    # transformers 5's form: rope_theta and the scaling inside "rope_parameters"
    v5 = {k: v for k, v in base.items() if k not in ("rope_theta", "rope_scaling")}
    v5["rope_parameters"] = {**base["rope_scaling"], "rope_theta": 5e5}
    assert from_hf_config(v5) == c
    plain = from_hf_config({**v5, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}})
    assert (plain.rope_type, plain.rope_theta) == ("default", 1e6)


@pytest.mark.parametrize("patch, words", [
    ({"model_type": "gpt_neox"}, "model_type"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 4.0}}, "rope_scaling"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "truncate": False}}, "truncate"),
    ({"mlp_bias": True}, "mlp_bias"),
])
def test_from_hf_config_errors(patch, words):
    base = {"model_type": "llama", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4}
    with pytest.raises(ValueError, match=words):
        from_hf_config({**base, **patch})


def test_model_config_validation():
    with pytest.raises(ValueError, match="num_kv_heads"):
        dataclasses.replace(TINY, num_kv_heads=3)
    with pytest.raises(ValueError, match="architecture"):
        dataclasses.replace(TINY, architecture="gpt2")


def test_llama3_rope_frequencies():
    """High frequencies unscaled, low ones divided by factor, a smooth band between (Llama 3.1)."""
    c = dataclasses.replace(TINY, head_dim=64, rope_theta=5e5, rope_type="llama3", rope_factor=8.0,
                            rope_original_max_position=8192)
    base = rope_inv_freq(dataclasses.replace(c, rope_type="default"))
    scaled = rope_inv_freq(c)
    wavelen = 2 * np.pi / base
    np.testing.assert_allclose(scaled[wavelen < 8192 / 4], base[wavelen < 8192 / 4])
    np.testing.assert_allclose(scaled[wavelen > 8192], base[wavelen > 8192] / 8)
    mid = (wavelen >= 8192 / 4) & (wavelen <= 8192)
    assert np.all((scaled[mid] <= base[mid]) & (scaled[mid] >= base[mid] / 8))


def test_yarn_rope_frequencies_and_temperature():
    """YaRN (Qwen2.5's long-context setting): dimensions that turn more than beta_fast times over the original
    context keep their frequency, those that turn fewer than beta_slow times are divided by the factor, a
    monotone ramp between; cos and sin carry 0.1 ln(factor) + 1."""
    hf = {"model_type": "qwen2", "vocab_size": 100, "hidden_size": 1024, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2, "rope_theta": 1e6,
          "max_position_embeddings": 32768,
          "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}
    c = from_hf_config(hf)
    assert (c.rope_type, c.rope_factor, c.rope_original_max_position) == ("yarn", 4.0, 32768)
    assert c.max_position == 131072  # what YaRN's factor 4 opens up (max_position_embeddings stays 32768)
    assert c.rope_attention_factor == pytest.approx(0.1 * np.log(4.0) + 1)
    base = rope_inv_freq(dataclasses.replace(c, rope_type="default"))
    ratio = rope_inv_freq(c) / base
    turns = 32768 * base / (2 * np.pi)
    assert np.all(ratio[turns > 32 * 1.2] == 1.0) and np.allclose(ratio[turns < 1 / 1.2], 0.25)
    assert np.all(np.diff(ratio) <= 1e-12) and 0.25 < ratio[(turns < 32) & (turns > 1)].mean() < 1
    cos, sin = rope_cos_sin(jnp.array([[0, 5]]), c)
    np.testing.assert_allclose(np.asarray(cos)[0, 0, 0], c.rope_attention_factor, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(cos) ** 2 + np.asarray(sin) ** 2, c.rope_attention_factor ** 2, rtol=1e-5)
    # an explicit attention_factor, and DeepSeek's mscale pair
    explicit = from_hf_config({**hf, "rope_scaling": {**hf["rope_scaling"], "attention_factor": 1.5}})
    assert explicit.rope_attention_factor == 1.5
    pair = from_hf_config({**hf, "rope_scaling": {**hf["rope_scaling"], "mscale": 1.0, "mscale_all_dim": 1.0}})
    assert pair.rope_attention_factor == 1.0
    with pytest.raises(ValueError, match="rope_factor must be >= 1 for YaRN"):
        dataclasses.replace(c, rope_factor=0.5)


@settings(max_examples=20, deadline=None)
@given(m=st.integers(0, 400), n=st.integers(0, 400), shift=st.integers(1, 100))
def test_rope_depends_on_relative_position(m, n, shift):
    key = jax.random.PRNGKey(m * 1000 + n)
    q, k = jax.random.normal(key, (2, 1, 1, 1, TINY.head_dim))

    def dot(pm, pn):
        cq, sq = rope_cos_sin(jnp.array([[pm]]), TINY)
        ck, sk = rope_cos_sin(jnp.array([[pn]]), TINY)
        return float(jnp.sum(apply_rope(q, cq, sq) * apply_rope(k, ck, sk)))

    assert dot(m, n) == pytest.approx(dot(m + shift, n + shift), rel=1e-4, abs=1e-4)


@pytest.mark.parametrize("attend_first", [False, True])
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_decode_steps_match_full_forward(name, attend_first):
    """Prefill T-3 tokens then decode 3 one by one == one causal forward over T tokens (the step's token
    written before the attention, or attended as one more key and written after it)."""
    config = VARIANTS[name]
    model = init_model(jax.random.PRNGKey(1), config, jnp.float32)
    check_model(model)
    t = 13
    tokens = jax.random.randint(jax.random.PRNGKey(2), (2, t), 0, config.vocab_size)
    full = _full_logits(model, tokens)

    attn = BF16Attention(attend_first=attend_first)
    p = t - 3
    ctx = PrefillContext(jnp.int32(0), jnp.full((2,), p, jnp.int32), t, whole=True)
    states = _states(config, 2, t)
    logits, states = model(tokens[:, :p], ctx, states, attention=attn)
    np.testing.assert_allclose(logits, full[:, :p], rtol=1e-4, atol=1e-4)
    for i in range(p, t):
        dctx = DecodeContext(jnp.full((2,), i, jnp.int32), jnp.ones((2,), bool))
        step, states = model(tokens[:, i:i + 1], dctx, states, attention=attn)
        np.testing.assert_allclose(step[:, 0], full[:, i], rtol=1e-4, atol=1e-4)


def test_attend_first_decode_equals_write_first():
    """BF16Attention(attend_first=True): the same cache bit for bit and the same output as writing the token
    first, for ragged positions (one at the last slot, where the position is clipped) in a bf16 cache."""
    from models.attention import KVBuffer

    rng = jax.random.split(jax.random.PRNGKey(3), 5)
    b, hq, hkv, s, d = 3, 8, 2, 40, 32
    cache = KVBuffer(*(jax.random.normal(r, (b, hkv, s, d), jnp.bfloat16) for r in rng[:2]))
    q = jax.random.normal(rng[2], (b, hq, d), jnp.bfloat16)
    k, v = (jax.random.normal(r, (b, hkv, d), jnp.bfloat16) for r in rng[3:])
    ctx = DecodeContext(jnp.asarray([0, 17, 45], jnp.int32), jnp.ones((b,), bool))
    want, want_state = BF16Attention(f32_probs=False).decode(0, q, k, v, cache, ctx)
    got, got_state = BF16Attention(f32_probs=False, attend_first=True).decode(0, q, k, v, cache, ctx)
    for x, y in zip(jax.tree_util.tree_leaves(got_state), jax.tree_util.tree_leaves(want_state)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=2e-2, atol=2e-2)
    err = np.linalg.norm(np.asarray(got, np.float32) - np.asarray(want, np.float32))
    assert err < 1e-2 * np.linalg.norm(np.asarray(want, np.float32))


# Powers of two in hidden size and head_dim: the shapes `pallas_kernels.norm_rope` takes.
POW2 = dataclasses.replace(TINY, hidden_size=64, head_dim=32)
KERNEL_VARIANTS = {"llama": POW2, "qwen3_qknorm": dataclasses.replace(POW2, architecture="qwen3", qk_norm=True),
                   "qwen2_bias_tied": dataclasses.replace(POW2, architecture="qwen2", qkv_bias=True,
                                                          tie_embeddings=True)}


@pytest.mark.parametrize("name", sorted(KERNEL_VARIANTS))
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_decode_steps_with_layer_kernels_match_xla(name, dtype):
    """Decode steps with the norm/RoPE kernels (interpret mode) give the XLA path's logits and states, and in
    float32 the full causal forward's logits."""
    config = KERNEL_VARIANTS[name]
    model = init_model(jax.random.PRNGKey(7), config, dtype)
    t, p = 11, 8
    tokens = jax.random.randint(jax.random.PRNGKey(8), (2, t), 0, config.vocab_size)
    full = _full_logits(model, tokens) if dtype == jnp.float32 else None
    attn = BF16Attention()
    ctx = PrefillContext(jnp.int32(0), jnp.full((2,), p, jnp.int32), t, whole=True)
    states = tuple(attn.prefill_state(config, 2, t, t, dtype, True) for _ in range(config.num_layers))
    _, states = model(tokens[:, :p], ctx, states, attention=attn)
    tol = 1e-5 if dtype == jnp.float32 else 3e-2
    for i in range(p, t):
        dctx = DecodeContext(jnp.full((2,), i, jnp.int32), jnp.ones((2,), bool))
        step = tokens[:, i:i + 1]
        xla, xla_states = model(step, dctx, states, attention=attn, kernels="xla")
        fused, states = model(step, dctx, states, attention=attn, kernels="interpret")
        np.testing.assert_allclose(fused, xla, rtol=tol, atol=tol * float(jnp.abs(xla).max()))
        for a, b in zip(jax.tree_util.tree_leaves(states), jax.tree_util.tree_leaves(xla_states)):
            np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=tol, atol=tol)
        if full is not None:
            np.testing.assert_allclose(fused[:, 0], full[:, i], rtol=1e-4, atol=1e-4)


def test_layer_kernels_mode():
    dctx = DecodeContext(jnp.zeros((1,), jnp.int32), jnp.ones((1,), bool))
    pctx = PrefillContext(jnp.int32(0), jnp.ones((1,), jnp.int32), 4, whole=True)
    assert layer_kernels("interpret", dctx, POW2) == "interpret"
    assert layer_kernels("interpret", pctx, POW2) == "xla"  # prefill chunks always run the XLA ops
    assert layer_kernels("auto", dctx, POW2) == ("triton" if jax.default_backend() == "gpu" else "xla")
    assert layer_kernels("auto", dctx, TINY) == "xla"  # hidden size 48: not a power of two
    with pytest.raises(ValueError, match="powers of two"):
        layer_kernels("triton", dctx, TINY)
    with pytest.raises(ValueError, match="layer_kernels must be one of"):
        layer_kernels("cuda", dctx, POW2)


def test_chunked_prefill_matches_whole():
    config = TINY
    model = init_model(jax.random.PRNGKey(3), config, jnp.float32)
    tokens = jax.random.randint(jax.random.PRNGKey(4), (1, 16), 0, config.vocab_size)
    full = _full_logits(model, tokens)
    attn = BF16Attention()
    states = _states(config, 1, 16)
    lengths = jnp.array([16], jnp.int32)
    for c in range(4):
        ctx = PrefillContext(jnp.int32(4 * c), lengths, 16, whole=False)
        logits, states = model(tokens[:, 4 * c:4 * c + 4], ctx, states, attention=attn)
        np.testing.assert_allclose(logits, full[:, 4 * c:4 * c + 4], rtol=1e-4, atol=1e-4)


@settings(max_examples=20, deadline=None)
@given(b=st.integers(1, 2), hkv=st.integers(1, 2), g=st.integers(1, 3), t=st.integers(1, 70),
       extra=st.integers(0, 90), offset=st.integers(0, 40), rows=st.sampled_from([1, 16, 32, 10**6]),
       key_block=st.sampled_from([1, 7, 16, 64, 10**6]), seed=st.integers(0, 2**16))
def test_prefix_attention_matches_float64_oracle(b, hkv, g, t, extra, offset, rows, key_block, seed):
    """Chunked prefill's attention (queries at offset.. over the key slots up to each query's position) equals
    the float64 oracle, in one query block or several (`logits_budget` sized to give `rows` rows a block, at
    least 16; blocks past T padded), with key blocks of any size (dividing S or not, one block for all of S);
    f32 probabilities for exact products."""
    from models.attention import prefix_attention
    from tests.helpers import oracle

    rng = np.random.default_rng(seed)
    d, hq = 16, hkv * g
    s = offset + t + extra  # slots past the chunk's end exist (the staging buffer) and stay invisible
    q = rng.standard_normal((b, hq, t, d)).astype(np.float32)
    k, v = (rng.standard_normal((b, hkv, s, d)).astype(np.float32) for _ in range(2))
    q_pos = offset + np.arange(t, dtype=np.int32)
    kb = min(key_block, s)
    got = prefix_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), jnp.asarray(q_pos), f32_probs=True,
                           logits_budget=rows * 4 * b * hq * kb, key_block=key_block)
    want, _ = oracle.exact_attention(q, k, v, [s] * b, q_positions=np.tile(q_pos, (b, 1)))
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("rows", [16, 10**6])
def test_prefix_attention_reads_no_key_block_past_the_chunk(rows):
    """Key blocks wholly past the last query's position are never read: NaN keys and values there leave the
    output finite and equal to the oracle's over clean keys (a chunk at positions 50..79 of a 300-slot staging
    buffer reads blocks of 64 up to slot 127), with one query block or two of 16 rows (the first of them reads
    one key block)."""
    from models.attention import prefix_attention
    from tests.helpers import oracle

    rng = np.random.default_rng(7)
    q = rng.standard_normal((2, 4, 30, 16)).astype(np.float32)
    k, v = (rng.standard_normal((2, 2, 300, 16)).astype(np.float32) for _ in range(2))
    q_pos = 50 + np.arange(30, dtype=np.int32)
    want, _ = oracle.exact_attention(q, k, v, [300] * 2, q_positions=np.tile(q_pos, (2, 1)))
    k[:, :, 128:], v[:, :, 128:] = np.nan, np.nan
    got = prefix_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), jnp.asarray(q_pos), f32_probs=True,
                           logits_budget=rows * 4 * 2 * 4 * 64, key_block=64)
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5)


def test_prefix_attention_steps_bound_the_logits_of_a_long_prompt():
    """A 2048-token chunk of a 32-head model over 128K staged slots (traced abstractly, nothing allocated): with
    the default 1 GiB budget and 4096-slot key blocks the whole chunk runs as one query block, and each step
    of the key loop holds at most 1 GiB of float32 logits, where one step over all slots would hold 34 GB."""
    from models.attention import KEY_BLOCK, LOGITS_BUDGET, prefix_attention

    q = jax.ShapeDtypeStruct((1, 32, 2048, 128), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((1, 8, 131072, 128), jnp.bfloat16)
    jaxpr = jax.make_jaxpr(lambda q, k, v: prefix_attention(q, k, v, jnp.arange(2048)))(q, kv, kv)
    assert not [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "scan"]  # no query blocks
    (loop,) = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "while"]
    body = loop.params["body_jaxpr"].jaxpr
    logits = [v.aval for e in body.eqns for v in e.outvars if v.aval.dtype == jnp.float32]
    assert max(a.size * 4 for a in logits) == LOGITS_BUDGET == 2048 * 32 * KEY_BLOCK * 4


def test_output_index_selects_rows():
    model = init_model(jax.random.PRNGKey(5), TINY, jnp.float32)
    tokens = jax.random.randint(jax.random.PRNGKey(6), (2, 8), 0, TINY.vocab_size)
    full = _full_logits(model, tokens)
    ctx = PrefillContext(jnp.int32(0), jnp.array([8, 5]), 8, whole=True)
    last, _ = model(tokens, ctx, _states(TINY, 2, 8), attention=BF16Attention(), output_index=jnp.array([7, 4]))
    np.testing.assert_allclose(last, full[jnp.arange(2), jnp.array([7, 4])], rtol=1e-5, atol=1e-5)


def test_check_model_names_the_weight():
    model = init_model(jax.random.PRNGKey(0), TINY, jnp.float32)
    check_model(model)
    model.config = VARIANTS["qwen2_bias"]  # a config the weights were not made for
    with pytest.raises(ValueError, match=r"model.layers\[0\].bqkv has shape None, config needs \(2, 4, 16\)"):
        check_model(model)
    model.config = VARIANTS["llama_tied"]
    with pytest.raises(ValueError, match=r"model.lm_head has shape \(48, 97\), config needs None"):
        check_model(model)
    model.config = TINY
    model.layers[1].w_up = nnx.Param(model.layers[1].w_up[...][:, :5])
    with pytest.raises(ValueError, match=r"model.layers\[1\].w_up has shape \(48, 5\), config needs \(48, 96\)"):
        check_model(model)
    with pytest.raises(ValueError, match="model must be a models.Decoder"):
        check_model({"embed": 0})


@pytest.mark.parametrize("name", ["llama_tied", "qwen2_bias", "qwen3_qknorm"])
def test_init_model_draws_the_modules_own_weights(name):
    """`init_model` (one compiled program per layer, the module filled abstractly) gives the weights of the
    module built op by op from the same key, with the structure and logical axes of `abstract_model`."""
    config = VARIANTS[name]
    eager = Decoder(config, jnp.float32, rngs=nnx.Rngs(params=jax.random.PRNGKey(11)))
    key = nnx.Rngs(params=jax.random.PRNGKey(11)).params()  # the key the constructor drew from
    fast = init_model(key, config, jnp.float32)
    chex.assert_trees_all_close(nnx.state(fast), nnx.state(eager), rtol=1e-6, atol=1e-6)
    abstract = abstract_model(config, jnp.float32)
    assert jax.tree_util.tree_structure(nnx.state(abstract)) == jax.tree_util.tree_structure(nnx.state(fast))
    chex.assert_trees_all_equal_shapes_and_dtypes(split_model(abstract).weights, split_model(fast).weights)
    assert fast.layers[0].wqkv.get_metadata()["out_sharding"] == ("embed", "kv_heads", "qkv", "head_dim")
    assert fast.dtype == jnp.float32 and fast.nbytes() == 4 * config.num_params()
    with pytest.raises(ValueError, match="init_model: dtype must be floating-point"):
        init_model(key, config, jnp.int8)


def test_split_model_runs_under_jit_with_a_static_model_def():
    """A jitted function of (ModelDef, weights) merges the module at trace time and gives the eager module's
    logits; an equal ModelDef from another split (or another model of the config) reuses the compiled program,
    and the ModelDef's hash is computed once."""
    model = init_model(jax.random.PRNGKey(5), TINY, jnp.float32)
    tokens = jax.random.randint(jax.random.PRNGKey(6), (2, 8), 0, TINY.vocab_size)
    traces = []

    def logits(model_def, weights, tokens):
        traces.append(1)
        return _full_logits(model_def.merge(weights), tokens)

    run = jax.jit(logits, static_argnums=0)
    model_def, weights = split_model(model)
    assert set(weights) == {"embed", "final_norm", "layers", "lm_head"} and set(weights["layers"]) == {0, 1}
    chex.assert_trees_all_close(run(model_def, weights, tokens), _full_logits(model, tokens), rtol=1e-5, atol=1e-5)
    other_def, other_weights = split_model(init_model(jax.random.PRNGKey(7), TINY, jnp.float32))
    assert other_def == model_def and hash(other_def) == hash(model_def)
    run(other_def, other_weights, tokens)
    assert len(traces) == 1
    assert split_model(init_model(jax.random.PRNGKey(7), VARIANTS["llama_tied"], jnp.float32)).model_def != model_def
    with pytest.raises(ValueError, match="model must be a models.Decoder"):
        split_model(weights)


@pytest.mark.parametrize("xp", [np, jnp])
@pytest.mark.parametrize("hq, hkv", [(4, 2), (6, 6), (8, 1)])
def test_fuse_qkv_groups_each_kv_head_with_its_queries(xp, hq, hkv):
    rng = np.random.default_rng(hq * 10 + hkv)
    e, d, g = 5, 3, hq // hkv
    wq, wk, wv = (xp.asarray(rng.standard_normal((e, h, d)), xp.float32) for h in (hq, hkv, hkv))
    fused = fuse_qkv(wq, wk, wv)
    assert fused.shape == (e, hkv, g + 2, d) and isinstance(fused, type(wq))
    for j in range(hkv):
        for i in range(g):  # query head j*G + i attends with KV head j (GQA)
            np.testing.assert_array_equal(fused[:, j, i], wq[:, j * g + i])
        np.testing.assert_array_equal(fused[:, j, g], wk[:, j])
        np.testing.assert_array_equal(fused[:, j, g + 1], wv[:, j])
    for a, b in zip(split_qkv(fused), (wq, wk, wv)):
        np.testing.assert_array_equal(a, b)
    biases = fuse_qkv(wq[0], wk[0], wv[0])  # [H, D] biases: the same layout without the E axis
    np.testing.assert_array_equal(biases, fused[0])


def test_fuse_qkv_rejects_mismatched_shapes():
    w = np.zeros((4, 6, 8), np.float32)
    with pytest.raises(ValueError, match="fuse_qkv"):
        fuse_qkv(w, np.zeros((4, 4, 8)), np.zeros((4, 4, 8)))  # 4 KV heads do not divide 6 query heads
    with pytest.raises(ValueError, match="fuse_qkv"):
        fuse_qkv(w, np.zeros((4, 2, 8)), np.zeros((4, 3, 8)))


@pytest.mark.parametrize("bias", [False, True])
def test_fused_qkv_projection_matches_float64_products(bias):
    rng = np.random.default_rng(7)
    b, t, e, hq, hkv, d = 2, 3, 16, 6, 2, 8
    x = rng.standard_normal((b, t, e))
    ws = [rng.standard_normal((e, h, d)) / 4 for h in (hq, hkv, hkv)]
    bs = [rng.standard_normal((h, d)) for h in (hq, hkv, hkv)] if bias else None
    got = _project_qkv(jnp.asarray(x, jnp.float32), jnp.asarray(fuse_qkv(*ws), jnp.float32),
                       None if bs is None else jnp.asarray(fuse_qkv(*bs), jnp.float32))
    for i, (out, w) in enumerate(zip(got, ws)):
        want = np.einsum("bte,ehd->bhtd", x, w) + (0 if bs is None else bs[i][None, :, None, :])
        np.testing.assert_allclose(np.asarray(out, np.float64), want, rtol=1e-5, atol=1e-5)


def test_cudnn_applies_only_to_gpu_half_precision_head_dims_up_to_128(monkeypatch):
    from models import attention as attention_module

    q = jnp.zeros((1, 4, 8, 128), jnp.bfloat16)
    assert not attention_module.cudnn_applies(q)  # CPU
    monkeypatch.setattr(attention_module.jax, "default_backend", lambda: "gpu")
    assert attention_module.cudnn_applies(q)
    assert attention_module.cudnn_applies(q.astype(jnp.float16)[..., :64])
    assert not attention_module.cudnn_applies(q.astype(jnp.float32))
    assert not attention_module.cudnn_applies(jnp.zeros((1, 4, 8, 256), jnp.bfloat16))
    assert not attention_module.cudnn_applies(jnp.zeros((1, 4, 8, 100), jnp.bfloat16))


@pytest.mark.gpu
@pytest.mark.parametrize("qk_norm", [True, False])
def test_gpu_decode_step_layer_kernels_match_xla(qk_norm):
    """The compiled norm/RoPE kernels in a bf16 decode step of Qwen3-8B's head shapes (2 layers, small MLP and
    vocabulary) against the XLA ops: logits and the written cache."""
    config = dataclasses.replace(TINY, architecture="qwen3" if qk_norm else "llama", qk_norm=qk_norm,
                                 hidden_size=4096, intermediate_size=1024, num_heads=32, num_kv_heads=8,
                                 head_dim=128, vocab_size=512)
    model = init_model(jax.random.PRNGKey(9), config, jnp.bfloat16)
    attn = BF16Attention()
    b, p = 3, 20
    tokens = jax.random.randint(jax.random.PRNGKey(10), (b, p + 1), 0, config.vocab_size)
    ctx = PrefillContext(jnp.int32(0), jnp.full((b,), p, jnp.int32), p + 8, whole=True)
    states = tuple(attn.prefill_state(config, b, p, p + 8, jnp.bfloat16, True) for _ in range(config.num_layers))
    model_def, weights = split_model(model)
    _, states = jax.jit(lambda w, s: model_def.merge(w)(tokens[:, :p], ctx, s, attention=attn))(weights, states)
    dctx = DecodeContext(jnp.full((b,), p, jnp.int32), jnp.ones((b,), bool))
    step = jax.jit(lambda w, s, kernels: model_def.merge(w)(tokens[:, p:], dctx, s, attention=attn, kernels=kernels),
                   static_argnums=2)
    xla, xla_states = step(weights, states, "xla")
    fused, fused_states = step(weights, states, "triton")
    scale = float(jnp.abs(xla).max())
    np.testing.assert_allclose(np.asarray(fused), np.asarray(xla), rtol=0, atol=3e-2 * scale)
    for a, c in zip(jax.tree_util.tree_leaves(fused_states), jax.tree_util.tree_leaves(xla_states)):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(c, np.float32), rtol=2e-2, atol=2e-2)


def test_qwen2_yarn_logits_match_transformers():
    """A tiny random Qwen2 with YaRN (trained for 64 positions, scaled 4x) gives the logits of Hugging Face
    transformers over 200 tokens, past the 64 (tests/fixtures/make_yarn_reference.py made the fixture)."""
    import pathlib

    from models.hf_loader import load_hf

    folder = pathlib.Path(__file__).parent / "fixtures" / "qwen2_yarn_tiny"
    model = load_hf(folder, dtype="float32")
    config = model.config
    assert (config.rope_type, config.rope_factor, config.rope_original_max_position) == ("yarn", 4.0, 64)
    ref = np.load(folder / "reference.npz")
    logits = np.asarray(_full_logits(model, jnp.asarray(ref["tokens"])))[0, ref["positions"]]
    np.testing.assert_allclose(logits, ref["logits"], rtol=1e-4, atol=1e-4 * np.abs(ref["logits"]).max())
    # without the YaRN scaling the same weights (the module of the other config, filled with this state) give
    # other logits past the original context
    plain = dataclasses.replace(config, rope_type="default", rope_attention_factor=1.0)
    plain_model = nnx.merge(nnx.graphdef(abstract_model(plain, jnp.float32)), nnx.state(model))
    far = ref["positions"] > 64
    other = np.asarray(_full_logits(plain_model, jnp.asarray(ref["tokens"])))[0, ref["positions"]]
    assert np.abs(other[far] - ref["logits"][far]).max() > 0.1
