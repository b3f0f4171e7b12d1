"""`hq.load` and `Model.generate`: whole-model use from Python in one object."""

import pytest

import hyquant_jax as hq
from hyquant_jax.api import Model

SMALL_HQ = hq.HyQuantConfig(window=16, block_size=16, prefill_block=16, rho=0.1)


@pytest.fixture(scope="module")
def tiny(tiny_gguf):
    return hq.load(str(tiny_gguf[0]))


@pytest.mark.slow
def test_load_and_generate_the_default_model(default_model):
    """The README's five lines: the default SmolLM2 answers, and the result carries per-sequence numbers."""
    model = hq.load()
    out = model.generate(["What is the capital of France?"], max_new_tokens=12)
    (c,) = out.completions
    assert "Paris" in c.text and out.texts == [c.text]
    assert c.finish_reason in ("stop", "length") and 1 <= len(c.tokens) <= 12 and c.prompt_tokens > 7
    assert c.kv_bytes > 0 and c.kv_bytes_bf16 > 0 and out.compile_seconds > 0 and out.decode_steps >= 1


def test_streamed_text_is_the_text(tiny):
    """on_text receives each prompt's new text as it decodes: joined, it is the final text, and the tokens are
    those of the call without streaming (sampled ones too)."""
    prompts = ["Hello world! The quick brown fox", "def f(x):"]
    sampling = hq.SamplingConfig(temperature=0.8, top_k=20)
    plain = tiny.generate(prompts, 10, sampling=sampling, config=SMALL_HQ, seed=1)
    pieces = [[], []]
    streamed = tiny.generate(prompts, 10, sampling=sampling, config=SMALL_HQ, seed=1,
                             on_text=lambda new: [p.append(x) for p, x in zip(pieces, new)])
    assert [c.tokens for c in streamed.completions] == [c.tokens for c in plain.completions]
    assert ["".join(p) for p in pieces] == streamed.texts == plain.texts


def test_chat_template_and_raw_prompts(tiny):
    chat, raw = tiny.prompt_ids("Hi there"), tiny.prompt_ids(["Hi there"], chat=False)
    assert len(chat[0]) > len(raw[0]) and raw == [tiny.tokenizer.encode("Hi there")]
    out = tiny.generate("Hi there", 4, attention="bf16", chat=False)
    assert len(out.completions) == 1 and out.attention == "bf16"


@pytest.mark.parametrize("kwargs, message", [
    (dict(prompts=[1, 2]), "prompts must be a str or a non-empty list of str, got a list of ['int']"),
    (dict(prompts=[]), "prompts must be a str or a non-empty list of str, got an empty list"),
    (dict(attention="bf8"), "attention must be one of"),
    (dict(attention="kivi4", config=hq.HyQuantConfig()), "config sets the hybrid cache and applies to "
                                                        "attention='hyquant' only"),
    (dict(attention="bf16", backend="reference"), "backend picks the hybrid cache's kernels"),
    (dict(config={"window": 16}), "config must be None or a hyquant_jax.HyQuantConfig, got dict"),
    (dict(sampling=0.7), "sampling must be None or a hyquant_jax.SamplingConfig, got float"),
    (dict(on_text="print"), "on_text must be None or a callable"),
    (dict(max_new_tokens=0), "max_new_tokens must be an int >= 1"),
])
def test_generate_refuses_bad_arguments(tiny, kwargs, message):
    kwargs = dict(dict(prompts="Hello", max_new_tokens=3), **kwargs)
    with pytest.raises(ValueError) as e:
        tiny.generate(**kwargs)
    assert message in str(e.value)


@pytest.mark.parametrize("model, message", [(42, "model must be None, a path string or a pathlib.Path, got int"),
                                            ("/no/such/model.gguf", "does not exist")])
def test_load_refuses_bad_paths(model, message):
    with pytest.raises(ValueError, match=message):
        hq.load(model)
    with pytest.raises(ValueError, match="dtype must be one of"):
        hq.load(dtype="float16")


def test_model_is_the_loaded_pieces(tiny):
    assert isinstance(tiny, Model) and tiny.config.num_layers == 2 and tiny.name == "tiny.gguf"
