"""`ModelConfig`: the static shape and numerics of a decoder-only transformer.

One frozen, hashable value (a static argument of `jax.jit`) covers the Llama
family (Llama 2/3/3.1 with llama3 RoPE scaling, Mistral, SmolLM2) and Qwen2/2.5
(q/k/v bias) and Qwen3 (q/k RMSNorm), with YaRN RoPE scaling for their long
contexts. `from_hf_config` reads a Hugging Face
`config.json` dict; invalid or unsupported values raise `ValueError` naming
the field.
"""

from __future__ import annotations

import dataclasses
import math

ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")
ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Decoder-only transformer hyper-parameters.

    Attributes:
      architecture: one of ARCHITECTURES (informational; behaviour follows the
        flags below).
      vocab_size, hidden_size, intermediate_size, num_layers: model sizes.
      num_heads, num_kv_heads, head_dim: query heads, KV heads (GQA: num_heads
        is a multiple of num_kv_heads) and the per-head width.
      rms_norm_eps: epsilon of every RMSNorm.
      rope_theta: RoPE base; rope_type: "default", "linear" (positions / factor),
        "llama3" (Llama 3.1 frequency-dependent scaling with rope_factor,
        rope_low_freq_factor, rope_high_freq_factor, rope_original_max_position)
        or "yarn" (YaRN, arXiv 2309.00071: frequencies that turn fewer than
        rope_beta_slow times over rope_original_max_position divided by
        rope_factor, more than rope_beta_fast times kept, a linear ramp over
        the dimensions between; Qwen2.5/Qwen3 beyond 32K).
      rope_attention_factor: cos and sin are multiplied by it (YaRN's
        0.1 ln(factor) + 1; 1.0 otherwise).
      rope_freq_factors: optional per-frequency divisors (head_dim / 2 floats,
        llama.cpp's `rope_freqs` tensor); they replace rope_type scaling.
      tie_embeddings: the output projection is the transposed token embedding.
      qkv_bias: q/k/v projections have a bias (Qwen2). qk_norm: RMSNorm over
        head_dim on q and k before RoPE (Qwen3).
      max_position: the context length the model was trained for (with YaRN,
        at least rope_original_max_position * rope_factor).
      sliding_window: attention span limit (Mistral v0.1), None when unlimited;
        we never truncate attention, so sequences must fit inside it.
      bos_token_id, eos_token_ids: special token ids from the checkpoint.
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_type: str = "default"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_position: int = 8192
    rope_beta_fast: float = 32.0
    rope_beta_slow: float = 1.0
    rope_attention_factor: float = 1.0
    rope_freq_factors: tuple[float, ...] | None = None
    tie_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    max_position: int = 4096
    sliding_window: int | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"ModelConfig.architecture must be one of {ARCHITECTURES}, got {self.architecture!r}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"ModelConfig.num_heads={self.num_heads} must be a multiple of "
                             f"num_kv_heads={self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim must be even for RoPE, got {self.head_dim}")
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"ModelConfig.rope_type must be one of {ROPE_TYPES}, got {self.rope_type!r}")
        if self.rope_freq_factors is not None and len(self.rope_freq_factors) != self.head_dim // 2:
            raise ValueError(f"ModelConfig.rope_freq_factors must have head_dim/2={self.head_dim // 2} entries, "
                             f"got {len(self.rope_freq_factors)}")
        if self.rope_type == "yarn" and not self.rope_factor >= 1.0:
            raise ValueError(f"ModelConfig.rope_factor must be >= 1 for YaRN, got {self.rope_factor}")
        if not self.rms_norm_eps > 0 or not self.rope_theta > 0:
            raise ValueError(f"ModelConfig.rms_norm_eps and rope_theta must be > 0, got "
                             f"{self.rms_norm_eps} and {self.rope_theta}")

    @property
    def q_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads

    def num_params(self) -> int:
        """Parameter count (embedding counted once when tied)."""
        e, f, d = self.hidden_size, self.intermediate_size, self.head_dim
        attn = e * d * (self.num_heads * 2 + self.num_kv_heads * 2)
        if self.qkv_bias:
            attn += d * (self.num_heads + 2 * self.num_kv_heads)
        if self.qk_norm:
            attn += 2 * d
        layer = attn + 3 * e * f + 2 * e
        embed = self.vocab_size * e * (1 if self.tie_embeddings else 2)
        return self.num_layers * layer + embed + e

    def kv_bytes_per_token(self, bytes_per_element: int = 2) -> int:
        """Bytes of K and V of one token over all layers (bf16 by default)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * bytes_per_element


def _get(hf: dict, key: str, default=None, required: bool = False):
    if key in hf and hf[key] is not None:
        return hf[key]
    if required:
        raise ValueError(f"config.json has no {key!r} field")
    return default


def from_hf_config(hf: dict) -> ModelConfig:
    """ModelConfig from a Hugging Face `config.json` dict.

    Supported `model_type`: llama, mistral, qwen2, qwen3. Raises ValueError
    naming the field for anything else (unknown model_type, rope_scaling
    types other than linear/llama3/yarn, MLP biases).
    """
    model_type = _get(hf, "model_type", required=True)
    if model_type not in ARCHITECTURES:
        archs = _get(hf, "architectures", [])
        raise ValueError(f"config.json: model_type={model_type!r} (architectures={archs}) is not supported; "
                         f"supported: {ARCHITECTURES}")
    if _get(hf, "mlp_bias", False):
        raise ValueError("config.json: mlp_bias=true is not supported")
    hidden = _get(hf, "hidden_size", required=True)
    heads = _get(hf, "num_attention_heads", required=True)
    head_dim = _get(hf, "head_dim", hidden // heads)
    # transformers 5 writes "rope_parameters" (rope_theta inside, with the scaling); earlier checkpoints
    # "rope_theta" and "rope_scaling"
    params = _get(hf, "rope_parameters") or {}
    rope = _get(hf, "rope_scaling") or {k: v for k, v in params.items() if k != "rope_theta"}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if rope else "default"
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"config.json: rope_scaling type {rope_type!r} is not supported; supported: {ROPE_TYPES}")
    sliding = None
    if model_type == "mistral":
        sliding = _get(hf, "sliding_window")
    elif model_type in ("qwen2", "qwen3") and _get(hf, "use_sliding_window", False):
        sliding = _get(hf, "sliding_window")
    max_position = int(_get(hf, "max_position_embeddings", 4096))
    factor = float(rope.get("factor", 1.0))
    original = int(rope.get("original_max_position_embeddings", max_position if rope_type == "yarn" else 8192))
    attention_factor = 1.0
    if rope_type == "yarn":
        attention_factor = rope.get("attention_factor")
        if attention_factor is None:
            mscale, mscale_all_dim = rope.get("mscale"), rope.get("mscale_all_dim")
            attention_factor = (yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
                                if mscale and mscale_all_dim else yarn_mscale(factor))
        if not rope.get("truncate", True):
            raise ValueError("config.json: rope_scaling truncate=false is not supported")
        # YaRN is what stretches the context: Qwen2.5 keeps max_position_embeddings at 32768 with factor 4
        max_position = max(max_position, int(original * factor))
    eos = _get(hf, "eos_token_id", ())
    eos = tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)
    return ModelConfig(
        architecture=model_type,
        vocab_size=_get(hf, "vocab_size", required=True),
        hidden_size=hidden,
        intermediate_size=_get(hf, "intermediate_size", required=True),
        num_layers=_get(hf, "num_hidden_layers", required=True),
        num_heads=heads,
        num_kv_heads=_get(hf, "num_key_value_heads", heads),
        head_dim=head_dim,
        rms_norm_eps=float(_get(hf, "rms_norm_eps", 1e-6)),
        rope_theta=float(_get(hf, "rope_theta", params.get("rope_theta", 10000.0))),
        rope_type=rope_type,
        rope_factor=factor,
        rope_low_freq_factor=float(rope.get("low_freq_factor", 1.0)),
        rope_high_freq_factor=float(rope.get("high_freq_factor", 4.0)),
        rope_original_max_position=original,
        rope_beta_fast=float(rope.get("beta_fast") or 32.0),
        rope_beta_slow=float(rope.get("beta_slow") or 1.0),
        rope_attention_factor=float(attention_factor),
        tie_embeddings=bool(_get(hf, "tie_word_embeddings", False)),
        qkv_bias=model_type == "qwen2" or bool(_get(hf, "attention_bias", False)),
        qk_norm=model_type == "qwen3",
        max_position=max_position,
        sliding_window=sliding,
        bos_token_id=_get(hf, "bos_token_id"),
        eos_token_ids=tuple(int(e) for e in eos),
    )


def rope_inv_freq(config: ModelConfig):
    """Inverse RoPE frequencies, float64 numpy [head_dim / 2] (host constant)."""
    import numpy as np

    d = config.head_dim
    inv = 1.0 / config.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    if config.rope_freq_factors is not None:
        return inv / np.asarray(config.rope_freq_factors, np.float64)
    if config.rope_type == "linear":
        return inv / config.rope_factor
    if config.rope_type == "llama3":
        factor, lo, hi = config.rope_factor, config.rope_low_freq_factor, config.rope_high_freq_factor
        old = config.rope_original_max_position
        wavelen = 2 * math.pi / inv
        smooth = (old / wavelen - lo) / (hi - lo)
        scaled = np.where(wavelen > old / lo, inv / factor, inv)
        mid = (wavelen <= old / lo) & (wavelen >= old / hi)
        return np.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)
    if config.rope_type == "yarn":
        # the dimension whose frequency turns `rotations` times over the original context, rounded outwards
        def dim_of(rotations):
            return d * math.log(config.rope_original_max_position / (rotations * 2 * math.pi)) / (
                2 * math.log(config.rope_theta))

        low = max(math.floor(dim_of(config.rope_beta_fast)), 0)
        high = min(math.ceil(dim_of(config.rope_beta_slow)), d - 1)
        ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / max(high - low, 1e-3), 0.0, 1.0)
        return inv / config.rope_factor * ramp + inv * (1.0 - ramp)
    return inv


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature: 0.1 * mscale * ln(factor) + 1 (1 when factor <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0
