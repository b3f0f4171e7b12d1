"""Decoder-only transformer (Llama / Mistral / Qwen2 / Qwen3 / SmolLM2) as Flax NNX modules.

`Decoder` holds the config, the token embedding, one `DecoderLayer` per layer (an `nnx.List`, not a stacked
array: each layer's cache is its own buffer, updated in place, and the layer loop is unrolled) and the final
norm and output head. Its weights are `nnx.Param`s whose `out_sharding` metadata names logical axes
(`EMBED`, `KV_HEADS`, ...); `hyquant_jax.sharding` maps those names onto a device mesh. A call runs one
prefill chunk or one decode step; attention is delegated to an `Attention` implementation
(`models.attention`) together with the per-layer states it updates, passed in and out explicitly.

Under jit a model travels as two values (`split_model`): a `ModelDef` (its `nnx.GraphDef`, a static argument)
and `weights`, a nested dict of arrays. The jitted function rebuilds the module at trace time
(`ModelDef.merge`), so the compiled program is the same as one over plain arrays and a call costs no graph
traversal.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models.attention import Attention, DecodeContext, PrefillContext
from models.config import ModelConfig
from models.layers import apply_rope, rms_norm, rope_cos_sin, swiglu
from pallas_kernels.norm_rope import add_rms_norm, fits, qk_norm_rope

LAYER_KERNELS = ("auto", "xla", "triton", "interpret")

# Logical axis names of the weights (`out_sharding` of each nnx.Param); `hyquant_jax.sharding.logical_rules`
# maps them onto the mesh axes.
EMBED = "embed"  # hidden size E
VOCAB = "vocab"  # the output head's vocabulary
VOCAB_TABLE = "vocab_table"  # the embedding table's rows (looked up, never multiplied)
KV_HEADS = "kv_heads"  # Hkv of the fused q/k/v weight: whole GQA groups per shard
QKV = "qkv"  # G + 2: a KV head's query group, its k and its v
HEADS = "heads"  # Hq of the output projection
HEAD_DIM = "head_dim"  # D
MLP = "mlp"  # FFN width F
LOGICAL_AXES = (EMBED, VOCAB, VOCAB_TABLE, KV_HEADS, QKV, HEADS, HEAD_DIM, MLP)


def _param(value, *axes: str) -> nnx.Param:
    """A weight with its logical axis names. Not placed when created (eager_sharding off): a model is built on
    one device or abstractly (loaders), and `hyquant_jax.sharding` places it on a mesh afterwards."""
    return nnx.Param(value, out_sharding=axes, eager_sharding=False)


def _normal(k, shape, std, dtype):
    return (jax.random.normal(k, shape, jnp.float32) * std).astype(dtype)


def _norm_weight(k, n, dtype):
    return (1.0 + 0.1 * jax.random.normal(k, (n,), jnp.float32)).astype(dtype)


def _check_dtype(dtype, name: str) -> None:
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"{name}: dtype must be floating-point, got {jnp.dtype(dtype).name}")


class DecoderLayer(nnx.Module):
    """One decoder layer. E hidden, F FFN width, Hq/Hkv heads, D head_dim, G = Hq / Hkv.

    attn_norm, mlp_norm: [E]. wqkv [E, Hkv, G + 2, D]: the q, k and v projections in one weight
    (`fuse_qkv`), grouped by KV head: for KV head j, its query heads jG .. jG + G - 1, then its k head, then
    its v head. bqkv [Hkv, G + 2, D]: the q/k/v biases in the same layout, or None. wo [Hq, D, E].
    q_norm, k_norm: [D] or None. w_gate, w_up [E, F], w_down [F, E].

    Why fused: a decode step then runs one GEMM for q, k and v. Separately, XLA lowers the small k/v
    products to a reduction fusion that delays the q GEMM behind it, so the fused weight makes the decode
    step faster (docs/design.md, "Fused q/k/v"). Grouping
    by KV head keeps each KV head and its query group together, so a split over the Hkv axis is a
    tensor-parallel split of whole GQA groups (`hyquant_jax.sharding`).

    Built from its weights, a dict keyed as above without the entries the config leaves out (random ones:
    `init_layer_weights`). Loaders and `init_model` fill an abstract module instead (`model_from_numpy`).
    """

    def __init__(self, config: ModelConfig, weights: dict):
        self.config = config
        self.attn_norm = _param(weights["attn_norm"], EMBED)
        self.wqkv = _param(weights["wqkv"], EMBED, KV_HEADS, QKV, HEAD_DIM)
        self.wo = _param(weights["wo"], HEADS, HEAD_DIM, EMBED)
        self.bqkv = _param(weights["bqkv"], KV_HEADS, QKV, HEAD_DIM) if config.qkv_bias else None
        self.q_norm = _param(weights["q_norm"], HEAD_DIM) if config.qk_norm else None
        self.k_norm = _param(weights["k_norm"], HEAD_DIM) if config.qk_norm else None
        self.mlp_norm = _param(weights["mlp_norm"], EMBED)
        self.w_gate = _param(weights["w_gate"], EMBED, MLP)
        self.w_up = _param(weights["w_up"], EMBED, MLP)
        self.w_down = _param(weights["w_down"], MLP, EMBED)

    def attention(self, i: int, h, cos, sin, state, ctx, attention: Attention, kernels: str):
        """Attention of the normalised hidden state h [B, T, E] (layer i) -> (output [B, T, E], new state)."""
        config = self.config
        q, k, v = _project_qkv(h, self.wqkv[...], _value(self.bqkv))  # [B, Hq, T, D], [B, Hkv, T, D] x 2
        q_norm, k_norm = _value(self.q_norm), _value(self.k_norm)
        if kernels != "xla":  # one decode token: q/k norms and RoPE in one launch
            q, k = qk_norm_rope(q[:, :, 0], k[:, :, 0], cos[:, 0, 0], sin[:, 0, 0], q_norm, k_norm,
                                config.rms_norm_eps, interpret=kernels == "interpret")
            q, k = q[:, :, None], k[:, :, None]
        else:
            if config.qk_norm:
                q = rms_norm(q, q_norm, config.rms_norm_eps)
                k = rms_norm(k, k_norm, config.rms_norm_eps)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if isinstance(ctx, DecodeContext):
            out, state = attention.decode(i, q[:, :, 0], k[:, :, 0], v[:, :, 0], state, ctx)
            out = out[:, :, None]
        else:
            out, state = attention.prefill(i, q, k, v, state, ctx)
        b, hq, t, d = out.shape
        merged = out.astype(h.dtype).transpose(0, 2, 1, 3).reshape(b, t, hq * d)
        return merged @ self.wo[...].reshape(hq * d, -1), state

    def __call__(self, i: int, x, h, cos, sin, state, ctx, next_norm, *, attention: Attention, kernels: str):
        """Layer i on the residual stream x [B, T, E] and its normalised form h (attn_norm applied).

        next_norm: [E], the next layer's attn_norm (the final norm after the last layer): each residual add is
        followed by an RMSNorm, so the two run as one step (one launch with the per-layer kernels).
        Returns (x, h for the next layer, new attention state).
        """
        eps = self.config.rms_norm_eps
        attn_out, state = self.attention(i, h, cos, sin, state, ctx, attention, kernels)
        x, h = _add_norm(x, attn_out, self.mlp_norm[...], eps, kernels)
        mlp = swiglu(h, self.w_gate[...], self.w_up[...], self.w_down[...])
        x, h = _add_norm(x, mlp, next_norm, eps, kernels)
        return x, h, state


def _value(param):
    return None if param is None else param[...]


class Decoder(nnx.Module):
    """A decoder-only transformer: config, embed [V, E], layers (one `DecoderLayer` each), final_norm [E],
    lm_head [E, V] or None (tied embeddings: the output head is embed's transpose).

    `Decoder(config, dtype, rngs=nnx.Rngs(0))` draws random weights op by op: those of
    `init_model(rngs.params(), config, dtype)`, which computes them one compiled layer at a time.
    `init_model` and `models.load_model` fill the abstract module (`abstract_model`) with their weights.
    """

    def __init__(self, config: ModelConfig, dtype=jnp.bfloat16, *, rngs: nnx.Rngs):
        _check_dtype(dtype, "Decoder")
        keys = model_keys(rngs.params(), config)
        self.config = config
        self.layers = nnx.List([DecoderLayer(config, init_layer_weights(keys[i], config, dtype))
                                for i in range(config.num_layers)])
        outer = init_outer_weights(keys[-3:], config, dtype)
        self.embed = _param(outer["embed"], VOCAB_TABLE, EMBED)
        self.final_norm = _param(outer["final_norm"], EMBED)
        self.lm_head = _param(outer["lm_head"], EMBED, VOCAB) if "lm_head" in outer else None

    @property
    def dtype(self):
        return self.embed.dtype

    def nbytes(self) -> int:
        return sum(x.nbytes for x in jax.tree_util.tree_leaves(nnx.state(self)))

    def __call__(self, tokens: jax.Array, ctx: PrefillContext | DecodeContext, states: tuple, *,
                 attention: Attention, output_index: jax.Array | None = None, kernels: str | None = None):
        """Run the model over one prefill chunk or one decode step.

        tokens: int32 [B, T] (T = 1 for a DecodeContext); states: tuple of one
        attention state per layer. output_index: optional int [B]; when given,
        only the hidden state at tokens[b, output_index[b]] goes through the
        output head. kernels: how norms and RoPE run (`layer_kernels`); None or
        "auto" take the attention's `layer_kernels` attribute where it has one.
        Returns (logits float32 [B, T, V] or [B, V], new states).
        """
        config = self.config
        b, t = tokens.shape
        if len(states) != config.num_layers:
            raise ValueError(f"states must hold one entry per layer ({config.num_layers}), got {len(states)}")
        mode = "auto" if kernels is None else kernels
        if mode == "auto":  # an implementation may opt out (ShardedAttention: XLA partitions the dense part)
            mode = getattr(attention, "layer_kernels", "auto")
        mode = layer_kernels(mode, ctx, config)
        cos, sin = rope_cos_sin(token_positions(ctx, b, t), config)
        x = self.embed[...][tokens]
        x, h = _add_norm(x, None, self.layers[0].attn_norm[...], config.rms_norm_eps, mode)
        new_states = []
        for i, layer in enumerate(self.layers):
            nxt = self.layers[i + 1].attn_norm if i + 1 < config.num_layers else self.final_norm
            x, h, state = layer(i, x, h, cos, sin, states[i], ctx, nxt[...], attention=attention, kernels=mode)
            new_states.append(state)
        if output_index is not None:
            h = jnp.take_along_axis(h, jnp.clip(output_index, 0, t - 1)[:, None, None].astype(jnp.int32), axis=1)[:, 0]
        return self.output_head(h), tuple(new_states)

    def logits(self, hidden: jax.Array) -> jax.Array:
        """Final RMSNorm and output head: hidden [..., E] -> float32 logits [..., V]."""
        return self.output_head(rms_norm(hidden, self.final_norm[...], self.config.rms_norm_eps))

    def output_head(self, h: jax.Array) -> jax.Array:
        """The output head alone (h after the final norm): [..., E] -> float32 logits [..., V]."""
        if self.lm_head is None:
            return jnp.einsum("...e,ve->...v", h, self.embed[...], preferred_element_type=jnp.float32)
        return jnp.einsum("...e,ev->...v", h, self.lm_head[...], preferred_element_type=jnp.float32)


def model_keys(key: jax.Array, config: ModelConfig) -> jax.Array:
    """The keys of a model's random weights: one per layer (`init_layer_weights`), then three for embed,
    final_norm and lm_head (`init_outer_weights`)."""
    return jax.random.split(key, config.num_layers + 3)


# --------------------------------------------------------------------------- under jit


class ModelDef:
    """A model's `nnx.GraphDef` as a static argument of `jax.jit`: its hash is computed once.

    jit hashes every static argument on every call, and hashing a deep GraphDef costs several times the rest
    of a call's dispatch (docs/design.md, "Flax modules under jit"). Equal when the graph definitions are equal.
    """

    __slots__ = ("graphdef", "_hash")

    def __init__(self, graphdef: nnx.GraphDef):
        self.graphdef = graphdef
        self._hash = hash(graphdef)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return self is other or (isinstance(other, ModelDef) and self._hash == other._hash
                                 and self.graphdef == other.graphdef)

    def merge(self, weights) -> Decoder:
        """The module with these weights (a nested dict of arrays or tracers, as `split_model` returns)."""
        return nnx.merge(self.graphdef, weights)


class SplitModel(NamedTuple):
    """`split_model`'s result: model_def (static under jit) and weights (a nested dict of arrays)."""

    model_def: ModelDef
    weights: dict


def split_model(model: Decoder) -> SplitModel:
    """(ModelDef, weights) of a model, for jitted functions: weights is `nnx.state(model)` as a nested dict of
    arrays ({"embed": ..., "layers": {0: {"wqkv": ...}, ...}, ...}), which jit flattens faster than the
    nnx.State of Params (docs/design.md, "Flax modules under jit"). Split once, call many times: the split
    itself walks the module graph."""
    if not isinstance(model, nnx.Module):
        raise ValueError(f"model must be a models.Decoder (models.load_model, models.init_model), got "
                         f"{type(model).__name__}")
    graphdef, state = nnx.split(model)
    return SplitModel(ModelDef(graphdef), nnx.to_pure_dict(state))


def abstract_model(config: ModelConfig, dtype=jnp.bfloat16) -> Decoder:
    """The model's structure with `jax.ShapeDtypeStruct` weights (`nnx.eval_shape`: no weight is computed)."""
    _check_dtype(dtype, "abstract_model")
    return nnx.eval_shape(lambda: Decoder(config, dtype, rngs=nnx.Rngs(0)))


def _model_def(config: ModelConfig) -> ModelDef:
    # the graph holds no dtype: one ModelDef per config (cached: an abstract trace of the constructor)
    if config not in _MODEL_DEFS:
        _MODEL_DEFS[config] = split_model(abstract_model(config, jnp.float32)).model_def
    return _MODEL_DEFS[config]


_MODEL_DEFS: dict[ModelConfig, ModelDef] = {}


def init_layer_weights(key: jax.Array, config: ModelConfig, dtype=jnp.bfloat16) -> dict:
    """Random weights of one `DecoderLayer` (benchmarks and tests), keyed as its attributes.

    Linear weights ~ N(0, 1/fan_in), norms ~ 1 + N(0, 0.1^2), biases ~ N(0, 0.1^2); the output projections are
    further scaled by 1/sqrt(2 * layers) so activations stay O(1) through many layers.
    """
    e, f, d = config.hidden_size, config.intermediate_size, config.head_dim
    hq, hkv = config.num_heads, config.num_kv_heads
    depth = 1.0 / math.sqrt(2 * config.num_layers)
    ks = jax.random.split(key, 14)
    out = {
        "attn_norm": _norm_weight(ks[0], e, dtype),
        "wqkv": fuse_qkv(_normal(ks[1], (e, hq, d), 1 / math.sqrt(e), dtype),
                         _normal(ks[2], (e, hkv, d), 1 / math.sqrt(e), dtype),
                         _normal(ks[3], (e, hkv, d), 1 / math.sqrt(e), dtype)),
        "wo": _normal(ks[4], (hq, d, e), depth / math.sqrt(hq * d), dtype),
        "mlp_norm": _norm_weight(ks[10], e, dtype),
        "w_gate": _normal(ks[11], (e, f), 1 / math.sqrt(e), dtype),
        "w_up": _normal(ks[12], (e, f), 1 / math.sqrt(e), dtype),
        "w_down": _normal(ks[13], (f, e), depth / math.sqrt(f), dtype),
    }
    if config.qkv_bias:
        out["bqkv"] = fuse_qkv(_normal(ks[5], (hq, d), 0.1, dtype), _normal(ks[6], (hkv, d), 0.1, dtype),
                               _normal(ks[7], (hkv, d), 0.1, dtype))
    if config.qk_norm:
        out["q_norm"], out["k_norm"] = _norm_weight(ks[8], d, dtype), _norm_weight(ks[9], d, dtype)
    return out


def init_outer_weights(keys: jax.Array, config: ModelConfig, dtype=jnp.bfloat16) -> dict:
    """{"embed", "final_norm"[, "lm_head"]} of a `Decoder` from its last three layer-independent keys."""
    e, v = config.hidden_size, config.vocab_size
    out = {"embed": _normal(keys[0], (v, e), 1.0, dtype), "final_norm": _norm_weight(keys[1], e, dtype)}
    if not config.tie_embeddings:
        out["lm_head"] = _normal(keys[2], (e, v), 1 / math.sqrt(e), dtype)
    return out


_init_layer_jit = jax.jit(init_layer_weights, static_argnames=("config", "dtype"))
_init_outer_jit = jax.jit(init_outer_weights, static_argnames=("config", "dtype"))


def init_model(key: jax.Array, config: ModelConfig, dtype=jnp.bfloat16) -> Decoder:
    """A model of the config's shapes with random weights (benchmarks and tests), computed layer by layer.

    With keys = `model_keys(key, config)`, layer i holds `init_layer_weights(keys[i])` and the rest is
    `init_outer_weights(keys[-3:])`, each compiled once and called per layer: op by op on the H200,
    Qwen3-8B's weights left ~1.1 GiB in use beyond themselves once q/k/v were fused, and one program for all
    layers takes minutes to compile at 64 layers. The module is built abstractly and filled. The weights
    equal those of `Decoder(config, dtype, rngs=rngs)` when rngs.params() gives `key`, up to the last bit
    of `dtype` (XLA may fuse the scaling differently than the eager ops).
    """
    _check_dtype(dtype, "init_model")
    keys = model_keys(key, config)
    weights = {"layers": {i: _init_layer_jit(keys[i], config, dtype) for i in range(config.num_layers)},
               **_init_outer_jit(keys[-3:], config, dtype)}
    return _model_def(config).merge(weights)


def weight_shapes(config: ModelConfig) -> dict:
    """The shape of each weight, keyed as `split_model`'s weights; layers: one dict for every layer. A weight the
    config leaves out (bqkv without qkv_bias, q_norm/k_norm without qk_norm, lm_head when tied) is None."""
    e, f, d = config.hidden_size, config.intermediate_size, config.head_dim
    hq, hkv, v = config.num_heads, config.num_kv_heads, config.vocab_size
    g = hq // hkv
    layer = {"attn_norm": (e,), "wqkv": (e, hkv, g + 2, d), "wo": (hq, d, e),
             "bqkv": (hkv, g + 2, d) if config.qkv_bias else None,
             "q_norm": (d,) if config.qk_norm else None, "k_norm": (d,) if config.qk_norm else None,
             "mlp_norm": (e,), "w_gate": (e, f), "w_up": (e, f), "w_down": (f, e)}
    return {"embed": (v, e), "layers": layer, "final_norm": (e,),
            "lm_head": None if config.tie_embeddings else (e, v)}


def check_model(model) -> None:
    """Raise ValueError unless `model` is a `Decoder` whose weights have its config's shapes and are
    floating-point (the message names the weight)."""
    if not isinstance(model, Decoder):
        raise ValueError(f"model must be a models.Decoder (models.load_model, models.init_model), got "
                         f"{type(model).__name__}")
    config = model.config
    want = weight_shapes(config)
    if len(model.layers) != config.num_layers:
        raise ValueError(f"model has {len(model.layers)} layers, config.num_layers={config.num_layers}")
    named = [(name, getattr(model, name), want[name]) for name in ("embed", "final_norm", "lm_head")]
    named += [(f"layers[{i}].{name}", getattr(layer, name), shape)
              for i, layer in enumerate(model.layers) for name, shape in want["layers"].items()]
    for name, param, shape in named:
        got = None if param is None else tuple(param.shape)
        if got != shape:
            hint = f" (config.tie_embeddings={config.tie_embeddings})" if name == "lm_head" else ""
            raise ValueError(f"model.{name} has shape {got}, config needs {shape}{hint}")
        if param is not None and not jnp.issubdtype(param.dtype, jnp.floating):
            raise ValueError(f"model.{name} must be floating-point, got {param.dtype}")


def cast_model(model: Decoder, dtype) -> Decoder:
    """A new model with all weights in `dtype`."""
    model_def, weights = split_model(model)
    return model_def.merge(jax.tree_util.tree_map(lambda x: x.astype(dtype), weights))


def fuse_qkv(wq, wk, wv):
    """wq [..., Hq, D], wk, wv [..., Hkv, D] -> [..., Hkv, Hq / Hkv + 2, D] (`DecoderLayer.wqkv` / `bqkv`
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


def layer_kernels(mode: str, ctx: PrefillContext | DecodeContext, config: ModelConfig) -> str:
    """How a model call runs its norms and RoPE: "xla" (jnp, `models.layers`), "triton" or "interpret"
    (`pallas_kernels.norm_rope`: one launch per residual add + RMSNorm and one for the q/k norms + RoPE of a
    layer; decode steps only, where the small XLA kernels they replace cost more to launch than to run:
    docs/design.md, "Per-layer kernels").

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


def _add_norm(x, delta, weight, eps: float, mode: str):
    """(x + delta, rms_norm(x + delta, weight)) for hidden states [B, T, E]; delta None: (x, rms_norm(x))."""
    if mode == "xla":
        total = x if delta is None else x + delta
        return total, rms_norm(total, weight, eps)
    total, normed = add_rms_norm(x[:, 0], None if delta is None else delta[:, 0], weight, eps,
                                 interpret=mode == "interpret")
    return total[:, None], normed[:, None]


# --------------------------------------------------------------------------- checkpoints


def checkpoint_name(short: str, top_names: dict, layer_names: dict, layer_prefix: str) -> str:
    """The checkpoint's tensor name of a short weight key (see `model_from_numpy`), given a loader's maps from
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


def model_from_numpy(arrays, config: ModelConfig, dtype, name_of=None) -> Decoder:
    """A `Decoder` from HF-convention numpy arrays keyed by short names (see loaders).

    `arrays` is any mapping (a lazy one reads each weight when asked; each is then put on the device in
    `dtype` and dropped from the host). Keys: "embed" [V, E], "final_norm" [E], optional "lm_head" [V, E],
    and per layer i: f"{i}.q" [Hq*D, E], "k"/"v" [Hkv*D, E], "o" [E, Hq*D], optional
    "q_bias"/"k_bias"/"v_bias", "q_norm"/"k_norm", "attn_norm", "mlp_norm", "gate"/"up" [F, E], "down" [E, F]
    (torch Linear layout: [out, in]). The module is built abstractly and filled with these weights: no
    random weight is computed. name_of: optional short name -> the checkpoint's own tensor name, for error
    messages.
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

    layers = {}
    for i in range(config.num_layers):
        p = f"{i}."
        layer = {
            "attn_norm": put(get(p + "attn_norm", (e,))),
            "wqkv": put(fuse_qkv(get(p + "q", (hq * d, e)).T.reshape(e, hq, d),
                                 get(p + "k", (hkv * d, e)).T.reshape(e, hkv, d),
                                 get(p + "v", (hkv * d, e)).T.reshape(e, hkv, d))),
            "wo": put(get(p + "o", (e, hq * d)).T.reshape(hq, d, e)),
            "mlp_norm": put(get(p + "mlp_norm", (e,))),
            "w_gate": put(get(p + "gate", (config.intermediate_size, e)).T),
            "w_up": put(get(p + "up", (config.intermediate_size, e)).T),
            "w_down": put(get(p + "down", (e, config.intermediate_size)).T),
        }
        if config.qkv_bias:
            layer["bqkv"] = put(fuse_qkv(bias(p + "q_bias", hq), bias(p + "k_bias", hkv), bias(p + "v_bias", hkv)))
        if config.qk_norm:
            layer["q_norm"], layer["k_norm"] = put(get(p + "q_norm", (d,))), put(get(p + "k_norm", (d,)))
        layers[i] = layer
    weights = {"embed": put(get("embed", (config.vocab_size, e))), "layers": layers,
               "final_norm": put(get("final_norm", (e,)))}
    if not config.tie_embeddings:
        weights["lm_head"] = put(get("lm_head", (config.vocab_size, e)).T)
    model = _model_def(config).merge(weights)
    check_model(model)
    return model
