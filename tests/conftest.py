import jax
import pytest

jax.config.update("jax_default_matmul_precision", "highest")


def pytest_collection_modifyitems(config, items):
    if jax.default_backend() == "gpu":
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run `pytest -m gpu` on the GPU box)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
