"""Load a Hugging Face checkpoint folder: config.json + (sharded) safetensors."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from models.config import ModelConfig, from_hf_config
from models.transformer import Decoder, checkpoint_name, model_from_numpy

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

_LAYER_NAMES = {
    "self_attn.q_proj.weight": "q", "self_attn.k_proj.weight": "k", "self_attn.v_proj.weight": "v",
    "self_attn.o_proj.weight": "o", "self_attn.q_proj.bias": "q_bias", "self_attn.k_proj.bias": "k_bias",
    "self_attn.v_proj.bias": "v_bias", "self_attn.q_norm.weight": "q_norm", "self_attn.k_norm.weight": "k_norm",
    "input_layernorm.weight": "attn_norm", "post_attention_layernorm.weight": "mlp_norm",
    "mlp.gate_proj.weight": "gate", "mlp.up_proj.weight": "up", "mlp.down_proj.weight": "down",
}
_TOP_NAMES = {"model.embed_tokens.weight": "embed", "model.norm.weight": "final_norm", "lm_head.weight": "lm_head"}


def short_name(hf_name: str) -> str | None:
    """HF tensor name -> the short key of `model_from_numpy` (None: not a model weight)."""
    if hf_name in _TOP_NAMES:
        return _TOP_NAMES[hf_name]
    parts = hf_name.split(".", 3)
    if len(parts) == 4 and parts[0] == "model" and parts[1] == "layers" and parts[3] in _LAYER_NAMES:
        return f"{parts[2]}.{_LAYER_NAMES[parts[3]]}"
    return None


def hf_name(short: str) -> str:
    """Inverse of `short_name`."""
    return checkpoint_name(short, _TOP_NAMES, _LAYER_NAMES, "model.layers.")


class _SafetensorsWeights(Mapping):
    """Lazy mapping short name -> float32 numpy array, read from safetensors shards."""

    def __init__(self, files: dict[str, Path]):
        self._files = files  # short name -> (shard path, hf name)

    def __getitem__(self, key):
        from safetensors import safe_open

        path, name = self._files[key]
        with safe_open(str(path), framework="flax") as f:
            return np.asarray(f.get_tensor(name).astype("float32"))

    def __contains__(self, key):
        return key in self._files

    def __iter__(self):
        return iter(self._files)

    def __len__(self):
        return len(self._files)


def _shards(folder: Path) -> dict[str, Path]:
    """hf tensor name -> shard file."""
    from safetensors import safe_open

    index = folder / INDEX_FILE
    if index.exists():
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index}: no 'weight_map' object")
        return {name: folder / shard for name, shard in weight_map.items()}
    single = folder / SINGLE_FILE
    if single.exists():
        with safe_open(str(single), framework="flax") as f:
            return {name: single for name in f.keys()}
    raise ValueError(f"{folder}: no {SINGLE_FILE} or {INDEX_FILE} (safetensors weights) found")


def load_hf_config(folder: str | Path) -> tuple[ModelConfig, dict]:
    """(ModelConfig, raw config dict) from folder/config.json (+ generation_config.json eos ids)."""
    folder = Path(folder)
    path = folder / "config.json"
    if not path.exists():
        raise ValueError(f"{folder}: no config.json (not a Hugging Face checkpoint folder)")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    config = from_hf_config(raw)
    gen = folder / "generation_config.json"
    if gen.exists():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        if eos is not None:
            eos = tuple(eos) if isinstance(eos, list) else (eos,)
            import dataclasses

            config = dataclasses.replace(config, eos_token_ids=tuple(dict.fromkeys(config.eos_token_ids + eos)))
    return config, raw


def load_hf(folder: str | Path, dtype="bfloat16") -> Decoder:
    """The model of a Hugging Face folder (llama/mistral/qwen2/qwen3); its config is `model.config`.

    Weights may be one model.safetensors or shards listed in
    model.safetensors.index.json; any stored dtype, cast to `dtype`.
    """
    import jax.numpy as jnp

    folder = Path(folder)
    config, _ = load_hf_config(folder)
    files = {}
    for name, shard in _shards(folder).items():
        short = short_name(name)
        if short is not None:
            if not shard.exists():
                raise ValueError(f"{folder}: shard {shard.name} named in {INDEX_FILE} is missing")
            files[short] = (shard, name)
    if config.tie_embeddings:
        files.pop("lm_head", None)
    return model_from_numpy(_SafetensorsWeights(files), config, jnp.dtype(dtype),
                            name_of=lambda short: f"{folder}: {hf_name(short)}")
