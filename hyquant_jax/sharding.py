"""Tensor- and data-parallel sharding over a device mesh (JAX's own engine: Mesh, NamedSharding, shard_map).

A mesh has two axes, "data" (the batch) and "model" (Megatron-style tensor
parallelism). `make_mesh("data=1,model=2")` builds one over the first
data * model devices (with `jax.distributed.initialize()` first, over the
devices of several hosts).

Weights (`param_specs`), replicated over "data". Each `nnx.Param` of a `models.Decoder` names its axes
(`out_sharding` metadata, e.g. wqkv ("embed", "kv_heads", "qkv", "head_dim")); `logical_rules` maps those
names onto the mesh axes and `param_specs` reads the model's state through them (Flax's
`nnx.logical_axis_rules` + `nnx.get_partition_spec`), so a weight's layout is declared once, where the
module creates it:

  "kv_heads" -> "model": q/k/v projections wqkv [E, Hkv, G+2, D] (bias
    [Hkv, G+2, D]) split over the KV heads (column-parallel). The fused
    weight holds each KV head's query group (heads h*G .. h*G+G-1), k and v
    together, so each shard gets whole GQA groups and attention needs no
    communication.
  "heads" -> "model": wo [Hq, D, E] split by heads (row-parallel; XLA adds
    one all-reduce).
  "mlp" -> "model": w_gate/w_up [E, F] split over F (column-parallel),
    w_down [F, E] over F (row-parallel; one all-reduce).
  "vocab_table" -> replicated: embed [V, E]. The token lookup is a gather;
    replicating it needs no collective, and a decode step reads only B of
    its rows.
  "vocab" -> "model" when V divides the model axis (else replicated): lm_head
    [E, V]. Every decode step reads all of it (1.6 GB for Qwen3-32B), so
    splitting divides that read; each logit is still a full E-contraction on
    one device (bit-identical to one device), and sampling's argmax/top-k
    over the split vocabulary is a small collective on [B, V]. With tied
    embeddings the table stays replicated.
  "embed", "qkv", "head_dim" -> replicated: norms, and the other axes of the
    weights above.

Attention states (`state_specs`) declare their layout where they are defined: each array field of a state
or context names the logical axes of its leading dimensions (`models.attention.logical_axes`, e.g. every
HybridKVCache code, scale, VL, ring and ring_score array ("batch", "kv_heads"), its per-sequence counters
("batch",)), and `STATE_RULES` maps "batch" -> "data" and the head axes -> "model": per-head arrays are split
P("data", "model", ...), per-sequence ones P("data") (identical on every "model" shard).

`ShardedAttention` wraps any attention implementation (bf16, HyQuant with
the reference or Pallas backend, the quantized baselines) so that each
layer's prefill, finish_prefill (Freeze) and decode (append, window flush,
VTI, kernel) run per shard under `jax.shard_map`: each device sees its local
batch rows and KV heads. All of that is per (sequence, KV head), so no
collective runs inside; the Pallas kernels are custom calls that XLA could
not partition itself, so the shard_map is required for them. The dense part
of the model (projections, MLP, head) is partitioned by XLA from the weight
shardings under `jax.jit`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from hyquant_jax.backends import resolve_backend
from models import transformer
from models.attention import BATCH, HEADS, KV_HEADS, STATE_AXES, DecodeContext, PrefillContext
from models.config import ModelConfig
from models.transformer import Decoder, abstract_model, init_layer_weights, init_outer_weights, model_keys, split_model

DATA = "data"
MODEL = "model"
AXES = (DATA, MODEL)

# --------------------------------------------------------------------------- mesh


def parse_mesh_shape(text: str | Mapping[str, int]) -> dict[str, int]:
    """"data=1,model=2" (or a mapping) -> {"data": 1, "model": 2}; a missing axis is 1.

    Raises ValueError for unknown axis names, repeated axes, or sizes that
    are not positive integers.
    """
    if isinstance(text, Mapping):
        items = [(str(k), v) for k, v in text.items()]
    else:
        items = []
        for part in str(text).split(","):
            part = part.strip()
            if not part:
                continue
            m = re.fullmatch(r"([A-Za-z_]\w*)\s*=\s*(\S+)", part)
            if not m:
                raise ValueError(f"mesh shape {text!r}: {part!r} is not AXIS=SIZE (e.g. 'data=1,model=2')")
            items.append((m.group(1), m.group(2)))
        if not items:
            raise ValueError(f"mesh shape {text!r} names no axis; write e.g. 'data=1,model=2'")
    shape = {DATA: 1, MODEL: 1}
    seen = set()
    for name, size in items:
        if name not in AXES:
            raise ValueError(f"mesh shape {text!r}: unknown axis {name!r}; the axes are {AXES}")
        if name in seen:
            raise ValueError(f"mesh shape {text!r}: axis {name!r} given twice")
        seen.add(name)
        integral = (isinstance(size, int) and not isinstance(size, bool)) or (
            isinstance(size, str) and size.strip().isdigit())
        if not integral or int(size) < 1:
            raise ValueError(f"mesh shape {text!r}: axis {name!r} needs a positive integer size, got {size!r}")
        shape[name] = int(size)
    return shape


def make_mesh(shape: str | Mapping[str, int], devices=None) -> Mesh:
    """A ("data", "model") Mesh over the first data * model devices.

    shape: "data=D,model=M" or a mapping; devices: defaults to `jax.devices()`
    (all hosts' devices after `jax.distributed.initialize()`). Raises
    ValueError when the mesh needs more devices than there are (on a CPU-only
    machine the message says how to get virtual host devices).
    """
    sizes = parse_mesh_shape(shape)
    d, m = sizes[DATA], sizes[MODEL]
    devices = list(jax.devices() if devices is None else devices)
    need = d * m
    if need > len(devices):
        hint = ""
        if devices and devices[0].platform == "cpu":
            hint = (f"; on a CPU-only machine set XLA_FLAGS=--xla_force_host_platform_device_count={need} "
                    "before JAX starts to get that many virtual host devices")
        raise ValueError(f"mesh data={d},model={m} needs {need} devices but only {len(devices)} "
                         f"{devices[0].platform if devices else ''} device(s) are visible{hint}")
    auto = (jax.sharding.AxisType.Auto,) * 2
    return jax.make_mesh((d, m), AXES, axis_types=auto, devices=devices[:need])


def as_mesh(mesh) -> Mesh | None:
    """A caller's `mesh` argument as a Mesh: None, a Mesh with the ("data", "model") axes, or a shape that
    `make_mesh` builds one from ("data=1,model=2" or a mapping). ValueError naming `mesh` otherwise."""
    if mesh is None:
        return None
    if isinstance(mesh, Mesh):
        mesh_sizes(mesh)
        return mesh
    if isinstance(mesh, (str, Mapping)):
        return make_mesh(mesh)
    raise ValueError(f"mesh must be None, a jax.sharding.Mesh (make_mesh) or a shape such as 'data=1,model=2', "
                     f"got {type(mesh).__name__}")


def mesh_sizes(mesh: Mesh) -> tuple[int, int]:
    """(data, model) sizes of a mesh built by `make_mesh`."""
    missing = [a for a in AXES if a not in mesh.shape]
    if missing:
        raise ValueError(f"the mesh needs axes {AXES}, it has {tuple(mesh.axis_names)}; build it with make_mesh")
    return mesh.shape[DATA], mesh.shape[MODEL]


def describe_mesh(mesh: Mesh) -> str:
    d, m = mesh_sizes(mesh)
    return f"data={d},model={m} over {d * m} {mesh.devices.flat[0].platform} device(s)"


# --------------------------------------------------------------------------- checks


def check_model_fits(config: ModelConfig, model_size: int) -> None:
    """Raise ValueError unless the model splits over a model axis of this size."""
    hkv, hq, f = config.num_kv_heads, config.num_heads, config.intermediate_size
    if hkv % model_size:
        raise ValueError(f"the model has {hkv} KV heads, which do not divide over the model axis of size "
                         f"{model_size}; attention is split by KV heads, so pick a model axis that divides {hkv}")
    if hq % model_size:  # implied by the line above (Hq is a multiple of Hkv); kept for a clear message
        raise ValueError(f"the model has {hq} query heads, which do not divide over the model axis of size "
                         f"{model_size}")
    if f % model_size:
        raise ValueError(f"the MLP width intermediate_size={f} does not divide over the model axis of size "
                         f"{model_size}")


def check_batch_fits(batch: int, data_size: int) -> None:
    """Raise ValueError unless `batch` sequences split evenly over the data axis."""
    if batch % data_size:
        raise ValueError(f"a batch of {batch} sequence(s) does not divide over the data axis of size {data_size}; "
                         f"pass a multiple of {data_size} prompts or use a smaller data axis")


# --------------------------------------------------------------------------- specs


def logical_rules(config: ModelConfig, model_size: int | None = None) -> tuple[tuple[str, str | None], ...]:
    """(logical axis, mesh axis or None) for every axis name the model's weights use (see the module docstring).

    model_size: the model axis size, only to decide whether lm_head splits over the vocabulary (None: it does).
    """
    split_vocab = model_size is None or config.vocab_size % model_size == 0
    rules = {transformer.EMBED: None, transformer.VOCAB_TABLE: None, transformer.QKV: None,
             transformer.HEAD_DIM: None, transformer.KV_HEADS: MODEL, transformer.HEADS: MODEL,
             transformer.MLP: MODEL, transformer.VOCAB: MODEL if split_vocab else None}
    assert set(rules) == set(transformer.LOGICAL_AXES)
    return tuple(rules.items())


def param_specs(model: Decoder, model_size: int | None = None) -> dict:
    """PartitionSpecs of the model's weights, keyed as `models.split_model(model).weights`.

    Read from each `nnx.Param`'s logical axis names through `logical_rules` (`model` may be abstract, e.g.
    `models.abstract_model(config)`). model_size: the model axis size, only to decide whether lm_head splits
    over the vocabulary (None: it does).
    """
    state = nnx.state(model)
    for path, param in nnx.to_flat_state(state):
        axes = param.get_metadata().get("out_sharding")
        unknown = set(axes or ()) - set(transformer.LOGICAL_AXES) - {None}
        if axes is None or len(axes) != param.ndim or unknown:
            raise ValueError(f"model weight {'.'.join(map(str, path))} {param.shape} has logical axes {axes}: each "
                             f"axis needs one of {transformer.LOGICAL_AXES} or None")
    with nnx.logical_axis_rules(logical_rules(model.config, model_size)):
        return nnx.to_pure_dict(nnx.get_partition_spec(state))


# Logical axes of the attention states (`models.attention.STATE_AXES`) -> mesh axes.
STATE_RULES = {BATCH: DATA, KV_HEADS: MODEL, HEADS: MODEL}
assert set(STATE_RULES) == set(STATE_AXES)


def _declared_axes(state) -> dict[str, tuple[str, ...]]:
    """{field: its leading logical axes} of an attention state or context, as its fields declare them
    (`models.attention.logical_axes`); a TypeError when it declares none or leaves an array field out."""
    fields = dataclasses.fields(state) if dataclasses.is_dataclass(state) and not isinstance(state, type) else ()
    declared = {f.name: f.metadata["logical_axes"] for f in fields if "logical_axes" in f.metadata}
    undeclared = [f.name for f in fields if f.name not in declared and hasattr(getattr(state, f.name), "shape")]
    if not declared or undeclared:
        raise TypeError(f"no sharding rule for attention state {type(state).__name__}: its array fields must "
                        f"declare their logical axes (models.attention.logical_axes); undeclared: "
                        f"{undeclared or 'all'}")
    return declared


def state_specs(state) -> Any:
    """PartitionSpecs of one layer's attention state, or of an attention context (same pytree; None stays None).

    Read from the logical axes each array field declares (`models.attention.logical_axes`: KVBuffer,
    PromptStaging, HybridKVCache, PrefillContext, DecodeContext, ...) through `STATE_RULES`; the leaves may be
    ShapeDtypeStructs (e.g. from `jax.eval_shape`).
    """
    if state is None:
        return None
    specs = {name: None if getattr(state, name) is None else P(*(STATE_RULES[a] for a in axes))
             for name, axes in _declared_axes(state).items()}
    return dataclasses.replace(state, **specs)


def _is_spec(x) -> bool:
    return isinstance(x, P)


def named(mesh: Mesh, specs):
    """Pytree of PartitionSpecs -> the same pytree of NamedShardings on `mesh`."""
    return jax.tree_util.tree_map(lambda s: NamedSharding(mesh, s), specs, is_leaf=_is_spec)


# --------------------------------------------------------------------------- placing arrays


def _place(x, sharding: NamedSharding) -> jax.Array:
    """Put one array onto `sharding` (also across hosts: each process supplies its own shards)."""
    if sharding.is_fully_addressable:
        return jax.device_put(x, sharding)
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def place(tree, shardings):
    """Put every array of `tree` onto the matching sharding of the `shardings` pytree."""
    return jax.tree_util.tree_map(lambda s, x: _place(x, s), shardings, tree,
                                  is_leaf=lambda s: isinstance(s, NamedSharding))


def shard_model(model: Decoder, mesh: Mesh) -> Decoder:
    """The model with its weights placed on `mesh` (Megatron-style over "model", replicated over "data"); the
    given model is left as it was."""
    _, m = mesh_sizes(mesh)
    check_model_fits(model.config, m)
    model_def, weights = split_model(model)
    return model_def.merge(place(weights, named(mesh, param_specs(model, m))))


def init_model_sharded(key: jax.Array, config: ModelConfig, mesh: Mesh, dtype=jnp.bfloat16) -> Decoder:
    """`models.init_model` computed directly into the sharded layout.

    The same random draws (values equal up to the last bit of `dtype`: under
    jit XLA may fuse the scaling differently than the eager ops).

    No device ever holds more than its shards. One layer is compiled once
    (with `out_shardings`) and called per layer: compiling the whole 64-layer
    init as one program takes minutes.
    """
    _, m = mesh_sizes(mesh)
    check_model_fits(config, m)
    abstract = abstract_model(config, dtype)
    model_def = split_model(abstract).model_def
    shardings = named(mesh, param_specs(abstract, m))
    keys = model_keys(key, config)
    make_layer = jax.jit(lambda k: init_layer_weights(k, config, dtype), out_shardings=shardings["layers"][0])
    outer = {name: shardings[name] for name in ("embed", "final_norm", "lm_head") if name in shardings}
    weights = {"layers": {i: make_layer(keys[i]) for i in range(config.num_layers)},
               **jax.jit(lambda k: init_outer_weights(k, config, dtype), out_shardings=outer)(keys[-3:])}
    return model_def.merge(weights)


def shard_state(state, mesh: Mesh):
    """Place one layer's attention state on `mesh` (batch over "data", KV heads over "model")."""
    _check_state(state, mesh)
    return place(state, named(mesh, state_specs(state)))


def shard_states(states: tuple, mesh: Mesh) -> tuple:
    """`shard_state` for every layer."""
    return tuple(shard_state(s, mesh) for s in states)


def _check_state(state, mesh: Mesh) -> None:
    """Raise ValueError unless every split axis of the state's arrays divides over its mesh axis."""
    if state is None:
        return
    d, m = mesh_sizes(mesh)
    for name, axes in _declared_axes(state).items():
        x = getattr(state, name)
        for size, axis in zip(() if x is None else x.shape, axes):
            if STATE_RULES[axis] == DATA:
                check_batch_fits(size, d)
            elif size % m:
                heads = "KV heads" if axis == KV_HEADS else "query heads"
                raise ValueError(f"the attention state has {size} {heads}, which do not divide over the model "
                                 f"axis of size {m}")


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    """Sharding of a [B, ...] array split over "data" along its first axis."""
    return NamedSharding(mesh, P(DATA, *([None] * (ndim - 1))))


def put_batch(x, mesh: Mesh) -> jax.Array:
    """A host or device array [B, ...] split over "data" along B (checks that B divides)."""
    x = np.asarray(x) if not isinstance(x, jax.Array) else x
    check_batch_fits(x.shape[0], mesh_sizes(mesh)[0])
    return _place(x, batch_sharding(mesh, x.ndim))


def put_replicated(x, mesh: Mesh) -> jax.Array:
    """An array copied to every device of `mesh` (e.g. a PRNG key)."""
    return _place(x, NamedSharding(mesh, P()))


def to_host(x) -> np.ndarray:
    """A (possibly multi-host) array as one numpy array on this host."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


def shard_bytes(tree) -> int:
    """Bytes of `tree` held by one device (the first shard of each array): per-device weight/cache bytes."""
    total = 0
    for x in jax.tree_util.tree_leaves(tree):
        shards = getattr(x, "addressable_shards", None)
        total += shards[0].data.nbytes if shards else x.nbytes
    return total


# --------------------------------------------------------------------------- attention per shard


@dataclasses.dataclass(frozen=True)
class ShardedAttention:
    """Run an attention implementation per shard of a ("data", "model") mesh.

    inner: any `models.attention.Attention` (BF16Attention, HybridAttention
    with any backend, QuantizedCacheAttention). Each call is wrapped in
    `jax.shard_map`: q [B, Hq, ...] and k, v [B, Hkv, ...] enter split
    P("data", "model"), the state by `state_specs`, contexts by batch; inside,
    `inner` sees B/data sequences and Hkv/model KV heads (and their query
    heads) and runs exactly as on one device (Freeze, append, window flush,
    VTI and the kernels are per (sequence, KV head): no collective). Outputs
    leave with the same specs, so states keep one layout across prefill and
    the donated decode loop. Hashable (static under jit).

    check_vma: shard_map's replication check; it verifies that per-sequence
    state arrays really are identical over "model". Pallas calls may not
    carry that typing, so by default (None) it is off for kernel backends
    and for chunked prefill through the fused chunk kernel (`chunk_impl`
    "triton", or "auto" on a GPU).
    """

    inner: Any
    mesh: Mesh
    check_vma: bool | None = None
    # The model's norms and RoPE stay XLA ops under a mesh (`models.transformer.layer_kernels`): XLA partitions
    # them with the dense part, while a Pallas call there would make it gather its operands onto every device.
    layer_kernels: ClassVar[str] = "xla"

    def __post_init__(self):
        mesh_sizes(self.mesh)

    @property
    def data_size(self) -> int:
        return mesh_sizes(self.mesh)[0]

    @property
    def model_size(self) -> int:
        return mesh_sizes(self.mesh)[1]

    def _vma(self) -> bool:
        if self.check_vma is not None:
            return self.check_vma
        backends = [getattr(self.inner, "backend", "reference"), getattr(self.inner, "prefill_backend", None)]
        chunks = getattr(self.inner, "chunk_impl", "xla")
        fused_chunks = chunks == "triton" or (chunks == "auto" and jax.default_backend() == "gpu")
        return not fused_chunks and all(b is None or resolve_backend(b) == "reference" for b in backends)

    def _check(self, q, k):
        check_batch_fits(q.shape[0], self.data_size)
        if k.shape[1] % self.model_size:
            raise ValueError(f"the model has {k.shape[1]} KV heads, which do not divide over the model axis of "
                             f"size {self.model_size}")

    def _per_shard(self, fn, args, in_specs, out_first):
        """shard_map(fn) with out_specs (out_first, state_specs(new state)) from an abstract trace."""
        out_struct = jax.eval_shape(fn, *args)
        if out_first is None:
            out_specs = state_specs(out_struct)
        else:
            out_specs = (out_first, state_specs(out_struct[1]))
        run = jax.shard_map(fn, mesh=self.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=self._vma())
        return run(*args)

    def prefill_state(self, config, batch, prompt_len, max_len, dtype, whole):
        check_batch_fits(batch, self.data_size)
        state = self.inner.prefill_state(config, batch, prompt_len, max_len, dtype, whole)
        if state is None:
            return None
        return jax.lax.with_sharding_constraint(state, named(self.mesh, state_specs(state)))

    def prefill(self, layer, q, k, v, state, ctx: PrefillContext):
        self._check(q, k)
        heads = P(DATA, MODEL)

        def fn(q, k, v, state, ctx):
            return self.inner.prefill(layer, q, k, v, state, ctx)

        return self._per_shard(fn, (q, k, v, state, ctx), (heads, heads, heads, state_specs(state), state_specs(ctx)),
                               heads)

    def finish_prefill(self, layer, state, ctx: PrefillContext):
        def fn(state, ctx):
            return self.inner.finish_prefill(layer, state, ctx)

        return self._per_shard(fn, (state, ctx), (state_specs(state), state_specs(ctx)), None)

    def decode(self, layer, q, k, v, state, ctx: DecodeContext):
        self._check(q, k)
        heads = P(DATA, MODEL)

        def fn(q, k, v, state, ctx):
            return self.inner.decode(layer, q, k, v, state, ctx)

        return self._per_shard(fn, (q, k, v, state, ctx), (heads, heads, heads, state_specs(state), state_specs(ctx)),
                               heads)

    def begin_decode_step(self, states: tuple, ctx: DecodeContext) -> tuple:
        """The inner implementation's once-per-step work, per shard (states keep their layout)."""
        begin = getattr(self.inner, "begin_decode_step", None)
        if begin is None:
            return states
        specs = tuple(state_specs(s) for s in states)
        run = jax.shard_map(begin, mesh=self.mesh, in_specs=(specs, state_specs(ctx)), out_specs=specs,
                            check_vma=self._vma())
        return run(states, ctx)

    def steps_until_begin(self, states: tuple, ctx: DecodeContext):
        """The inner implementation's count (`models.attention.steps_until_begin`), None without one. It reads
        per-sequence counters only, so it runs on the global arrays: the minimum spans every shard."""
        until = getattr(self.inner, "steps_until_begin", None)
        return None if until is None else until(states, ctx)

    def used_bytes(self, state, lengths=None) -> np.ndarray:
        return self.inner.used_bytes(state, lengths)


def shard_attention(attention, mesh: Mesh) -> ShardedAttention:
    """Wrap `attention` for `mesh` (an already wrapped one must use the same mesh)."""
    if isinstance(attention, ShardedAttention):
        if attention.mesh != mesh:
            raise ValueError("the attention is already sharded over a different mesh")
        return attention
    return ShardedAttention(attention, mesh)


def prepare(model: Decoder, attention, mesh: Mesh, batch: int):
    """Validate and shard for `generate`: (model with its weights on `mesh`, ShardedAttention).

    Raises ValueError when the KV heads (or MLP width) do not divide the model
    axis or the batch does not divide the data axis.
    """
    d, m = mesh_sizes(mesh)
    check_model_fits(model.config, m)
    check_batch_fits(batch, d)
    return shard_model(model, mesh), shard_attention(attention, mesh)


__all__ = [
    "AXES", "DATA", "MODEL", "ShardedAttention", "batch_sharding", "check_batch_fits", "check_model_fits",
    "describe_mesh", "init_model_sharded", "logical_rules", "make_mesh", "mesh_sizes", "named", "param_specs",
    "parse_mesh_shape", "place", "prepare", "put_batch", "put_replicated", "shard_attention", "shard_bytes",
    "shard_model", "shard_state", "shard_states", "state_specs", "to_host",
]
