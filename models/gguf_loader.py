"""Load llama-, qwen2- and qwen3-architecture GGUF files (llama.cpp's format) with the `gguf` package.

Weights are dequantized to float32 on the host (F32, F16, BF16, Q8_0, Q4_0,
Q4_1, Q5_0, Q5_1 and the K-quants Q2_K-Q6_K that llama.cpp's Q*_K_M files
use), then cast. For the llama architecture (Llama, Mistral, SmolLM2) llama.cpp's
converter permutes the rows of Q and K so that its interleaved ("GPT-J") RoPE
gives the same result as HF's rotate-half RoPE; we undo that permutation so our
rotate-half RoPE applies unchanged. Qwen2/Qwen3 files keep HF's row order
(llama.cpp runs them with rotate-half RoPE).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from models.config import ModelConfig, yarn_mscale
from models.gguf_format import check_gguf
from models.transformer import Decoder, checkpoint_name, model_from_numpy

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3")
PERMUTED_ARCHITECTURES = ("llama",)  # Q/K rows permuted by llama.cpp's converter
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")

_LAYER_NAMES = {
    "attn_q.weight": "q", "attn_k.weight": "k", "attn_v.weight": "v", "attn_output.weight": "o",
    "attn_q.bias": "q_bias", "attn_k.bias": "k_bias", "attn_v.bias": "v_bias",
    "attn_norm.weight": "attn_norm", "ffn_norm.weight": "mlp_norm",
    "ffn_gate.weight": "gate", "ffn_up.weight": "up", "ffn_down.weight": "down",
    "attn_q_norm.weight": "q_norm", "attn_k_norm.weight": "k_norm",
}
_TOP_NAMES = {"token_embd.weight": "embed", "output_norm.weight": "final_norm", "output.weight": "lm_head"}


def gguf_name(short: str) -> str:
    """Short weight key (see `model_from_numpy`) -> GGUF tensor name."""
    return checkpoint_name(short, _TOP_NAMES, _LAYER_NAMES, "blk.")


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf Q/K row permutation: rotate-half -> interleaved pairs.

    w: [n_head * head_dim, ...] (rows = output features).
    """
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama_cpp_unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of `llama_cpp_permute`."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def open_gguf(path: str | Path):
    """A `gguf.GGUFReader` for path, with a clear error for missing/invalid files."""
    import gguf

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"GGUF file {path} does not exist" + (" (it is a folder)" if path.is_dir() else ""))
    check_gguf(path)  # names the field or tensor at fault, where the reader would fail inside numpy
    try:
        return gguf.GGUFReader(str(path))
    except Exception as e:  # a structure check_gguf accepts but the reader refuses
        raise ValueError(f"{path} is not a readable GGUF file: {type(e).__name__}: {e}") from e


def field(reader, key: str, default=None):
    """Scalar, string or list value of a GGUF metadata key (default when absent)."""
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def gguf_config(reader, path: str | Path = "") -> ModelConfig:
    """ModelConfig from GGUF metadata (architectures in SUPPORTED_ARCHITECTURES)."""
    arch = field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"{path}: general.architecture={arch!r} is not supported; supported: "
                         f"{SUPPORTED_ARCHITECTURES}")

    def need(key):
        value = field(reader, f"{arch}.{key}")
        if value is None:
            raise ValueError(f"{path}: GGUF metadata has no {arch}.{key}")
        return value

    heads = int(need("attention.head_count"))
    hidden = int(need("embedding_length"))
    tokens = field(reader, "tokenizer.ggml.tokens")
    vocab = field(reader, f"{arch}.vocab_size") or (len(tokens) if tokens else None)
    if vocab is None:
        vocab = _tensor(reader, "token_embd.weight").shape[1]
    head_dim = int(field(reader, f"{arch}.attention.key_length", hidden // heads))
    factors = None
    if any(t.name == "rope_freqs.weight" for t in reader.tensors):
        factors = tuple(float(x) for x in _dequantize(_tensor(reader, "rope_freqs.weight"), path))
    scaling = field(reader, f"{arch}.rope.scaling.type", "none")
    context = int(field(reader, f"{arch}.context_length", 4096))
    rope_type, rope_factor = "default", 1.0
    yarn = {}
    if scaling in ("linear", "yarn"):
        rope_type, rope_factor = scaling, float(field(reader, f"{arch}.rope.scaling.factor", 1.0))
    elif scaling not in ("none", None):
        raise ValueError(f"{path}: {arch}.rope.scaling.type={scaling!r} is not supported; supported: "
                         "none, linear, yarn")
    if scaling == "yarn":  # llama.cpp: cos and sin scaled by attn_factor * (0.1 ln(factor) + 1)
        yarn = dict(rope_original_max_position=int(field(reader, f"{arch}.rope.scaling.original_context_length",
                                                         context)),
                    rope_attention_factor=float(field(reader, f"{arch}.rope.scaling.attn_factor", 1.0))
                    * yarn_mscale(rope_factor))
        context = max(context, int(yarn["rope_original_max_position"] * rope_factor))
    eos = field(reader, "tokenizer.ggml.eos_token_id")
    eot = field(reader, "tokenizer.ggml.eot_token_id")
    eos_ids = tuple(dict.fromkeys(int(x) for x in (eos, eot) if x is not None))
    bos = field(reader, "tokenizer.ggml.bos_token_id")
    return ModelConfig(
        architecture=arch,
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(need("feed_forward_length")),
        num_layers=int(need("block_count")),
        num_heads=heads,
        num_kv_heads=int(field(reader, f"{arch}.attention.head_count_kv", heads)),
        head_dim=head_dim,
        rms_norm_eps=float(field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(field(reader, f"{arch}.rope.freq_base", 10000.0)),
        rope_type=rope_type,
        rope_factor=rope_factor,
        rope_freq_factors=factors,
        **yarn,
        tie_embeddings=not any(t.name == "output.weight" for t in reader.tensors),
        qkv_bias=any(t.name == "blk.0.attn_q.bias" for t in reader.tensors),
        qk_norm=any(t.name == "blk.0.attn_q_norm.weight" for t in reader.tensors),
        max_position=context,
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=eos_ids,
    )


def _tensor(reader, name):
    for t in reader.tensors:
        if t.name == name:
            return t
    raise KeyError(name)


def _dequantize(t, path) -> np.ndarray:
    """float32 array in numpy (row-major, torch) order: GGUF shape (ne0, ne1) -> [ne1, ne0]."""
    from gguf import quants

    kind = t.tensor_type.name
    if kind not in SUPPORTED_TYPES:
        raise ValueError(f"{path}: tensor {t.name} has type {kind}; supported: {SUPPORTED_TYPES}")
    data = quants.dequantize(t.data, t.tensor_type)
    return np.asarray(data, np.float32).reshape(tuple(int(n) for n in reversed(t.shape)))


class _GGUFWeights(Mapping):
    """Lazy mapping short name -> float32 numpy array (Q/K rows un-permuted)."""

    def __init__(self, reader, config: ModelConfig, path, progress=None):
        self._reader, self._config, self._path, self._progress = reader, config, path, progress
        self._names = {}
        for t in reader.tensors:
            short = _short(t.name)
            if short is not None:
                self._names[short] = t

    def __getitem__(self, key):
        t = self._names[key]
        w = _dequantize(t, self._path)
        kind = key.split(".")[-1]
        permuted = self._config.architecture in PERMUTED_ARCHITECTURES
        if permuted and kind in ("q", "q_bias"):
            w = llama_cpp_unpermute(w, self._config.num_heads)
        elif permuted and kind in ("k", "k_bias"):
            w = llama_cpp_unpermute(w, self._config.num_kv_heads)
        if self._progress is not None:
            self._progress.update(1)
        return w

    def __contains__(self, key):
        return key in self._names

    def __iter__(self):
        return iter(self._names)

    def __len__(self):
        return len(self._names)


def _short(name: str) -> str | None:
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    return None


def load_gguf(path: str | Path, dtype="bfloat16", progress: bool = False) -> Decoder:
    """The model of a GGUF file (llama, qwen2 or qwen3 architecture; its config is `model.config`), weights
    dequantized on the host and cast to `dtype`."""
    import jax.numpy as jnp

    reader = open_gguf(path)
    config = gguf_config(reader, path)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(reader.tensors), desc=f"loading {Path(path).name}", unit="tensor", leave=False)
    try:
        return model_from_numpy(_GGUFWeights(reader, config, path, bar), config, jnp.dtype(dtype),
                                name_of=lambda short: f"{path}: {gguf_name(short)}")
    finally:
        if bar is not None:
            bar.close()
