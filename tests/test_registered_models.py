"""The registered models where they have been fetched (`scripts/fetch_model.sh NAME`; skipped otherwise): the file
is the pinned one, and the 0.5B model loads by name and answers a plain question."""

import pytest

from models.fetch import REGISTRY, FetchError, gguf_header, registered_path


def _fetched(name: str):
    try:
        return registered_path(name)
    except FetchError as e:
        pytest.skip(str(e))


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_the_fetched_file_is_the_registered_one(name):
    path, spec = _fetched(name), REGISTRY[name]
    assert path.stat().st_size == spec.size
    assert gguf_header(path) == {"name": spec.gguf_name, "architecture": spec.architecture,
                                 "tensor_count": spec.tensor_count}


@pytest.mark.slow
def test_the_small_model_answers_by_name():
    import hyquant_jax as hq

    _fetched("qwen2.5-coder-0.5b")
    model = hq.load("qwen2.5-coder-0.5b")
    cfg = model.config
    assert (cfg.architecture, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == ("qwen2", 24, 14, 2, 64)
    assert cfg.max_position == 32768
    out = model.generate("What is the capital of France? Answer in one sentence.", max_new_tokens=12,
                         attention="bf16")
    assert "Paris" in out.texts[0]
