import gc
import os

import jax
import pytest

jax.config.update("jax_default_matmul_precision", "highest")
# `hyquant generate` run in this process would turn on JAX's persistent compilation cache for every later test
os.environ["HYQUANT_COMPILE_CACHE"] = "0"


def pytest_collection_modifyitems(config, items):
    if jax.default_backend() == "gpu":
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run `pytest -m gpu` on the GPU box)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop JAX's compiled programs after each test module.

    Every executable XLA:CPU compiles keeps ~3 memory mappings while it is cached; the whole suite compiles
    ~20,000 programs, and a process may hold at most vm.max_map_count (65530) mappings. Past that, the next
    compile's mmap fails inside LLVM and the process segfaults (measured: the crash came at 65,301 mappings).
    """
    yield
    jax.clear_caches()
    gc.collect()


@pytest.fixture(scope="session")
def default_model():
    """The default checkpoint's path (SmolLM2-135M-Instruct GGUF); skips the test where it is not installed."""
    from models import default_model_path

    try:
        return default_model_path()
    except ValueError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """(path, config) of a 2-layer llama GGUF with a trained BPE tokenizer: a real checkpoint file in seconds."""
    import jax.numpy as jnp

    from models import ModelConfig, init_model
    from tests.helpers.checkpoint_files import train_tokenizer, write_gguf

    tok = train_tokenizer()
    config = ModelConfig("llama", vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128,
                         num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32, max_position=4096)
    path = tmp_path_factory.mktemp("ckpt") / "tiny.gguf"
    write_gguf(path, init_model(jax.random.PRNGKey(0), config, jnp.float32), tokenizer=tok)
    return path, config

