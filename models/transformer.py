"""Decoder-only transformer (Llama / Mistral / Qwen2 / Qwen3 / SmolLM2) as pure functions.

Weights are registered-dataclass pytrees, one `LayerParams` per layer (a
tuple, not a stacked array: each layer's cache is its own buffer, updated in
place, and the layer loop is unrolled). `forward` runs one prefill chunk or
one decode step; attention is delegated to an `Attention` implementation
(`models.attention`) together with the per-layer states it updates.
"""

from __future__ import annotations

import dataclasses
import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from models.attention import Attention, DecodeContext, PrefillContext
from models.config import ModelConfig
from models.layers import apply_rope, rms_norm, rope_cos_sin, swiglu
from pallas_kernels.norm_rope import add_rms_norm, fits, qk_norm_rope

LAYER_KERNELS = ("auto", "xla", "triton", "interpret")
_LAYER_FIELDS = ["attn_norm", "wqkv", "wo", "bqkv", "q_norm", "k_norm", "mlp_norm", "w_gate", "w_up", "w_down"]


@partial(jax.tree_util.register_dataclass, data_fields=_LAYER_FIELDS, meta_fields=[])
@dataclasses.dataclass(frozen=True)
class LayerParams:
    """One decoder layer. E hidden, F FFN width, Hq/Hkv heads, D head_dim.

    attn_norm, mlp_norm: [E]. wqkv [E, Hkv, G + 2, D]: the q, k and v projections in one weight
    (`fuse_qkv`), grouped by KV head: for KV head j, its G = Hq / Hkv query heads jG .. jG + G - 1, then its
    k head, then its v head. bqkv [Hkv, G + 2, D]: the q/k/v biases in the same layout, or None.
    wo [Hq, D, E]. q_norm, k_norm: [D] or None. w_gate, w_up [E, F], w_down [F, E].

    Why fused: a decode step then runs one GEMM for q, k and v. Separately, XLA lowers the small k/v
    products to a reduction fusion that delays the q GEMM behind it; on the H200 the fused weight made the
    hybrid B=1 step 0.15-0.3 ms faster at 32K and bf16's no slower (docs/design.md, "Fused q/k/v"). Grouping
    by KV head keeps each KV head and its query group together, so a split over the Hkv axis is a
    tensor-parallel split of whole GQA groups (`hyquant_jax.sharding`).
    """

    attn_norm: jax.Array
    wqkv: jax.Array
    wo: jax.Array
    bqkv: jax.Array | None
    q_norm: jax.Array | None
    k_norm: jax.Array | None
    mlp_norm: jax.Array
    w_gate: jax.Array
    w_up: jax.Array
    w_down: jax.Array


@partial(jax.tree_util.register_dataclass, data_fields=["embed", "layers", "final_norm", "lm_head"],
         meta_fields=[])
@dataclasses.dataclass(frozen=True)
class Params:
    """embed [V, E]; layers: tuple of LayerParams; final_norm [E]; lm_head [E, V] or None (tied)."""

    embed: jax.Array
    layers: tuple[LayerParams, ...]
    final_norm: jax.Array
    lm_head: jax.Array | None

    @property
    def dtype(self):
        return self.embed.dtype

    def nbytes(self) -> int:
        return sum(x.nbytes for x in jax.tree_util.tree_leaves(self))


def check_params(params: Params, config: ModelConfig) -> None:
    """Raise ValueError if any weight's shape does not match the config or a weight is not floating-point."""
    if not isinstance(params, Params):
        raise ValueError(f"params must be a models.Params (models.load_model, init_params), got "
                         f"{type(params).__name__}")
    e, f, d = config.hidden_size, config.intermediate_size, config.head_dim
    hq, hkv, v = config.num_heads, config.num_kv_heads, config.vocab_size
    g = hq // hkv
    want = {"attn_norm": (e,), "wqkv": (e, hkv, g + 2, d), "wo": (hq, d, e),
            "bqkv": (hkv, g + 2, d) if config.qkv_bias else None,
            "q_norm": (d,) if config.qk_norm else None, "k_norm": (d,) if config.qk_norm else None,
            "mlp_norm": (e,), "w_gate": (e, f), "w_up": (e, f), "w_down": (f, e)}
    if params.embed.shape != (v, e):
        raise ValueError(f"params.embed has shape {params.embed.shape}, config needs {(v, e)}")
    if len(params.layers) != config.num_layers:
        raise ValueError(f"params has {len(params.layers)} layers, config.num_layers={config.num_layers}")
    for i, layer in enumerate(params.layers):
        for name, shape in want.items():
            x = getattr(layer, name)
            got = None if x is None else tuple(x.shape)
            if got != shape:
                raise ValueError(f"params.layers[{i}].{name} has shape {got}, config needs {shape}")
    if params.final_norm.shape != (e,):
        raise ValueError(f"params.final_norm has shape {params.final_norm.shape}, config needs {(e,)}")
    head = None if params.lm_head is None else tuple(params.lm_head.shape)
    if head != (None if config.tie_embeddings else (e, v)):
        raise ValueError(f"params.lm_head has shape {head}; config.tie_embeddings={config.tie_embeddings} "
                         f"needs {None if config.tie_embeddings else (e, v)}")
    for path, x in jax.tree_util.tree_leaves_with_path(params):
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(f"params{jax.tree_util.keystr(path)} must be floating-point, got {x.dtype}")


def init_params(key: jax.Array, config: ModelConfig, dtype=jnp.bfloat16) -> Params:
    """Random weights of the config's shapes (benchmarks and tests).

    Linear weights ~ N(0, 1/fan_in), norms ~ 1 + N(0, 0.1^2), biases ~ N(0, 0.1^2);
    scaled so activations stay O(1) through many layers. Layer i is
    `init_layer_params(keys[i])` and the rest `init_outer_params(keys[-3:])`
    with keys = jax.random.split(key, num_layers + 3), each compiled once and
    called per layer (op by op on the H200, Qwen3-8B's weights left ~1.1 GiB
    in use beyond themselves once q/k/v were fused).
    """
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"init_params: dtype must be floating-point, got {jnp.dtype(dtype).name}")
    keys = jax.random.split(key, config.num_layers + 3)
    layers = tuple(_init_layer_jit(keys[i], config, dtype) for i in range(config.num_layers))
    embed, final_norm, lm_head = _init_outer_jit(keys[-3:], config, dtype)
    return Params(embed=embed, layers=layers, final_norm=final_norm, lm_head=lm_head)


def _normal(k, shape, std, dtype):
    return (jax.random.normal(k, shape, jnp.float32) * std).astype(dtype)


def _norm_weight(k, n, dtype):
    return (1.0 + 0.1 * jax.random.normal(k, (n,), jnp.float32)).astype(dtype)


def init_layer_params(key: jax.Array, config: ModelConfig, dtype=jnp.bfloat16) -> LayerParams:
    """One decoder layer of `init_params` from its key."""
    e, f, d = config.hidden_size, config.intermediate_size, config.head_dim
    hq, hkv = config.num_heads, config.num_kv_heads
    depth = 1.0 / math.sqrt(2 * config.num_layers)
    ks = jax.random.split(key, 14)
    return LayerParams(
        attn_norm=_norm_weight(ks[0], e, dtype),
        wqkv=fuse_qkv(_normal(ks[1], (e, hq, d), 1 / math.sqrt(e), dtype),
                      _normal(ks[2], (e, hkv, d), 1 / math.sqrt(e), dtype),
                      _normal(ks[3], (e, hkv, d), 1 / math.sqrt(e), dtype)),
        wo=_normal(ks[4], (hq, d, e), depth / math.sqrt(hq * d), dtype),
        bqkv=fuse_qkv(_normal(ks[5], (hq, d), 0.1, dtype), _normal(ks[6], (hkv, d), 0.1, dtype),
                      _normal(ks[7], (hkv, d), 0.1, dtype)) if config.qkv_bias else None,
        q_norm=_norm_weight(ks[8], d, dtype) if config.qk_norm else None,
        k_norm=_norm_weight(ks[9], d, dtype) if config.qk_norm else None,
        mlp_norm=_norm_weight(ks[10], e, dtype),
        w_gate=_normal(ks[11], (e, f), 1 / math.sqrt(e), dtype),
        w_up=_normal(ks[12], (e, f), 1 / math.sqrt(e), dtype),
        w_down=_normal(ks[13], (f, e), depth / math.sqrt(f), dtype),
    )


def init_outer_params(keys: jax.Array, config: ModelConfig, dtype=jnp.bfloat16):
    """(embed, final_norm, lm_head or None) of `init_params` from its last three keys."""
    e, v = config.hidden_size, config.vocab_size
    embed = _normal(keys[0], (v, e), 1.0, dtype)
    final_norm = _norm_weight(keys[1], e, dtype)
    lm_head = None if config.tie_embeddings else _normal(keys[2], (e, v), 1 / math.sqrt(e), dtype)
    return embed, final_norm, lm_head


_init_layer_jit = jax.jit(init_layer_params, static_argnames=("config", "dtype"))
_init_outer_jit = jax.jit(init_outer_params, static_argnames=("config", "dtype"))


def cast_params(params: Params, dtype) -> Params:
    """All weights in `dtype`."""
    return jax.tree_util.tree_map(lambda x: x.astype(dtype), params)


def fuse_qkv(wq, wk, wv):
    """wq [..., Hq, D], wk, wv [..., Hkv, D] -> [..., Hkv, Hq / Hkv + 2, D] (`LayerParams.wqkv` / `bqkv`
    from separate q/k/v weights [E, H, D] or biases [H, D])."""
    *lead, hq, d = wq.shape
    hkv = wk.shape[-2]
    if wk.shape != wv.shape or wk.shape[:-2] != tuple(lead) or wk.shape[-1] != d or hq % hkv:
        raise ValueError(f"fuse_qkv: need wq [..., Hq, D] and wk, wv [..., Hkv, D] with Hkv dividing Hq, got "
                         f"{wq.shape}, {wk.shape}, {wv.shape}")
    xp = np if all(isinstance(w, np.ndarray) for w in (wq, wk, wv)) else jnp  # loaders fuse on the host
    q = wq.reshape(*lead, hkv, hq // hkv, d)
    return xp.concatenate([q, wk[..., None, :], wv[..., None, :]], axis=-2)


def split_qkv(wqkv):
    """Inverse of `fuse_qkv`: [..., Hkv, G + 2, D] -> (wq [..., Hkv * G, D], wk, wv [..., Hkv, D])."""
    *lead, hkv, g2, d = wqkv.shape
    return wqkv[..., :g2 - 2, :].reshape(*lead, hkv * (g2 - 2), d), wqkv[..., g2 - 2, :], wqkv[..., g2 - 1, :]


def _project_qkv(x, w, b):
    """x [B, T, E] @ w [E, Hkv, G + 2, D] (+ b [Hkv, G + 2, D]) as one 2-D matmul -> q [B, Hkv * G, T, D],
    k, v [B, Hkv, T, D]."""
    e, hkv, g2, d = w.shape
    y = (x @ w.reshape(e, hkv * g2 * d)).reshape(x.shape[0], x.shape[1], hkv, g2, d)
    if b is not None:
        y = y + b.astype(y.dtype)
    return tuple(z.transpose(0, 2, 1, 3) for z in split_qkv(y))


def _attention_block(layer: LayerParams, i: int, h, cos, sin, state, ctx, config: ModelConfig,
                     attention: Attention, kernels: str):
    """Attention of the normalised hidden state h [B, T, E] -> (output [B, T, E], new state)."""
    q, k, v = _project_qkv(h, layer.wqkv, layer.bqkv)  # [B, Hq, T, D], [B, Hkv, T, D] x 2
    if kernels != "xla":  # one decode token: q/k norms and RoPE in one launch
        q, k = qk_norm_rope(q[:, :, 0], k[:, :, 0], cos[:, 0, 0], sin[:, 0, 0], layer.q_norm, layer.k_norm,
                            config.rms_norm_eps, interpret=kernels == "interpret")
        q, k = q[:, :, None], k[:, :, None]
    else:
        if config.qk_norm:
            q = rms_norm(q, layer.q_norm, config.rms_norm_eps)
            k = rms_norm(k, layer.k_norm, config.rms_norm_eps)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    if isinstance(ctx, DecodeContext):
        out, state = attention.decode(i, q[:, :, 0], k[:, :, 0], v[:, :, 0], state, ctx)
        out = out[:, :, None]
    else:
        out, state = attention.prefill(i, q, k, v, state, ctx)
    b, hq, t, d = out.shape
    merged = out.astype(h.dtype).transpose(0, 2, 1, 3).reshape(b, t, hq * d)
    return merged @ layer.wo.reshape(hq * d, -1), state


def layer_kernels(mode: str, ctx: PrefillContext | DecodeContext, config: ModelConfig) -> str:
    """How a forward call runs its norms and RoPE: "xla" (jnp, `models.layers`), "triton" or "interpret"
    (`pallas_kernels.norm_rope`: one launch per residual add + RMSNorm and one for the q/k norms + RoPE of a
    layer; decode steps only, where these ~6 small XLA kernels a layer cost ~1.1-1.8 us each).

    mode: "auto" (pallas on a GPU for a decode step whose hidden size and head_dim are powers of two, else
    xla), "xla", "triton" (decode steps only; raises where the shapes do not fit) or "interpret" (the same
    kernels in Pallas interpret mode, for tests on CPU).
    """
    if mode not in LAYER_KERNELS:
        raise ValueError(f"layer_kernels must be one of {LAYER_KERNELS}, got {mode!r}")
    shapes_fit = fits(config.hidden_size, config.head_dim)
    if mode == "xla" or not isinstance(ctx, DecodeContext):
        return "xla"
    if mode == "auto":
        return "triton" if jax.default_backend() == "gpu" and shapes_fit else "xla"
    if not shapes_fit:
        raise ValueError(f"layer_kernels={mode!r} needs hidden_size and head_dim powers of two >= 32, got "
                         f"{config.hidden_size} and {config.head_dim}")
    return mode


def token_positions(ctx: PrefillContext | DecodeContext, batch: int, t: int) -> jax.Array:
    """int32 [B, T] positions of the tokens of this call."""
    if isinstance(ctx, DecodeContext):
        return ctx.positions[:, None].astype(jnp.int32)
    return jnp.broadcast_to(ctx.offset + jnp.arange(t, dtype=jnp.int32), (batch, t))


def forward(params: Params, tokens: jax.Array, ctx: PrefillContext | DecodeContext, states: tuple,
            *, config: ModelConfig, attention: Attention, output_index: jax.Array | None = None,
            kernels: str | None = None):
    """Run the model over one prefill chunk or one decode step.

    tokens: int32 [B, T] (T = 1 for a DecodeContext); states: tuple of one
    attention state per layer. output_index: optional int [B]; when given,
    only the hidden state at tokens[b, output_index[b]] goes through the
    output head. kernels: how norms and RoPE run (`layer_kernels`); None or
    "auto" take the attention's `layer_kernels` attribute where it has one.
    Returns (logits float32 [B, T, V] or [B, V], new states).
    """
    b, t = tokens.shape
    if len(states) != config.num_layers:
        raise ValueError(f"states must hold one entry per layer ({config.num_layers}), got {len(states)}")
    mode = "auto" if kernels is None else kernels
    if mode == "auto":  # an implementation may opt out (ShardedAttention: XLA partitions the dense part)
        mode = getattr(attention, "layer_kernels", "auto")
    mode = layer_kernels(mode, ctx, config)
    cos, sin = rope_cos_sin(token_positions(ctx, b, t), config)
    x = params.embed[tokens]
    # Every residual add is followed by the next RMSNorm (the last by the final norm), so the two run as one
    # step: one launch with the kernels, the jnp ops otherwise.
    x, h = _add_norm(x, None, params.layers[0].attn_norm, config.rms_norm_eps, mode)
    new_states = []
    for i, layer in enumerate(params.layers):
        attn_out, state = _attention_block(layer, i, h, cos, sin, states[i], ctx, config, attention, mode)
        x, h = _add_norm(x, attn_out, layer.mlp_norm, config.rms_norm_eps, mode)
        nxt = params.layers[i + 1].attn_norm if i + 1 < config.num_layers else params.final_norm
        x, h = _add_norm(x, swiglu(h, layer.w_gate, layer.w_up, layer.w_down), nxt, config.rms_norm_eps, mode)
        new_states.append(state)
    if output_index is not None:
        h = jnp.take_along_axis(h, jnp.clip(output_index, 0, t - 1)[:, None, None].astype(jnp.int32), axis=1)[:, 0]
    return output_head(params, h), tuple(new_states)


def _add_norm(x, delta, weight, eps: float, mode: str):
    """(x + delta, rms_norm(x + delta, weight)) for hidden states [B, T, E]; delta None: (x, rms_norm(x))."""
    if mode == "xla":
        total = x if delta is None else x + delta
        return total, rms_norm(total, weight, eps)
    total, normed = add_rms_norm(x[:, 0], None if delta is None else delta[:, 0], weight, eps,
                                 interpret=mode == "interpret")
    return total[:, None], normed[:, None]


def logits(params: Params, hidden: jax.Array, config: ModelConfig) -> jax.Array:
    """Final RMSNorm and output head: hidden [..., E] -> float32 logits [..., V]."""
    return output_head(params, rms_norm(hidden, params.final_norm, config.rms_norm_eps))


def output_head(params: Params, h: jax.Array) -> jax.Array:
    """The output head alone (h after the final norm): [..., E] -> float32 logits [..., V]."""
    if params.lm_head is None:
        return jnp.einsum("...e,ve->...v", h, params.embed, preferred_element_type=jnp.float32)
    return jnp.einsum("...e,ev->...v", h, params.lm_head, preferred_element_type=jnp.float32)


def checkpoint_name(short: str, top_names: dict, layer_names: dict, layer_prefix: str) -> str:
    """The checkpoint's tensor name of a short weight key (see `params_from_numpy`), given a loader's maps from
    checkpoint names to short names: `top_names` for whole-model weights, `layer_names` for the per-layer
    suffixes, each after f"{layer_prefix}{i}." (e.g. "model.layers." for Hugging Face, "blk." for GGUF)."""
    for k, v in top_names.items():
        if v == short:
            return k
    layer, _, name = short.partition(".")
    for k, v in layer_names.items():
        if v == name and layer.isdigit():
            return f"{layer_prefix}{layer}.{k}"
    raise ValueError(f"unknown weight key {short!r}")


def params_from_numpy(arrays: dict, config: ModelConfig, dtype, name_of=None) -> Params:
    """Params from HF-convention numpy arrays keyed by short names (see loaders).

    `arrays` is any mapping (a lazy one reads each weight when asked). Keys: "embed" [V, E], "final_norm" [E], optional "lm_head" [V, E], and per
    layer i: f"{i}.q" [Hq*D, E], "k"/"v" [Hkv*D, E], "o" [E, Hq*D], optional
    "q_bias"/"k_bias"/"v_bias", "q_norm"/"k_norm", "attn_norm", "mlp_norm",
    "gate"/"up" [F, E], "down" [E, F] (torch Linear layout: [out, in]).
    name_of: optional short name -> the checkpoint's own tensor name, for error messages.
    """
    e, d = config.hidden_size, config.head_dim
    hq, hkv = config.num_heads, config.num_kv_heads

    def label(name):
        return repr(name) if name_of is None else f"{name_of(name)} ({name!r})"

    def get(name, shape=None):
        if name not in arrays:
            raise ValueError(f"checkpoint has no weight {label(name)}")
        x = np.asarray(arrays[name])
        if shape is not None and tuple(x.shape) != tuple(shape):
            raise ValueError(f"checkpoint weight {label(name)} has shape {x.shape}, config needs {tuple(shape)}")
        return x

    def put(x):
        return jnp.asarray(x, dtype)

    def bias(name, heads):
        return get(name, (heads * d,)).reshape(heads, d)

    layers = []
    for i in range(config.num_layers):
        p = f"{i}."
        layers.append(LayerParams(
            attn_norm=put(get(p + "attn_norm", (e,))),
            wqkv=put(fuse_qkv(get(p + "q", (hq * d, e)).T.reshape(e, hq, d),
                              get(p + "k", (hkv * d, e)).T.reshape(e, hkv, d),
                              get(p + "v", (hkv * d, e)).T.reshape(e, hkv, d))),
            wo=put(get(p + "o", (e, hq * d)).T.reshape(hq, d, e)),
            bqkv=put(fuse_qkv(bias(p + "q_bias", hq), bias(p + "k_bias", hkv), bias(p + "v_bias", hkv)))
            if config.qkv_bias else None,
            q_norm=put(get(p + "q_norm", (d,))) if config.qk_norm else None,
            k_norm=put(get(p + "k_norm", (d,))) if config.qk_norm else None,
            mlp_norm=put(get(p + "mlp_norm", (e,))),
            w_gate=put(get(p + "gate", (config.intermediate_size, e)).T),
            w_up=put(get(p + "up", (config.intermediate_size, e)).T),
            w_down=put(get(p + "down", (e, config.intermediate_size)).T),
        ))
    lm_head = None
    if not config.tie_embeddings:
        lm_head = put(get("lm_head", (config.vocab_size, e)).T)
    params = Params(embed=put(get("embed", (config.vocab_size, e))), layers=tuple(layers),
                    final_norm=put(get("final_norm", (e,))), lm_head=lm_head)
    check_params(params, config)
    return params
