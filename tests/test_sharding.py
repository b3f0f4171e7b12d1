"""hyquant_jax.sharding: mesh parsing, specs, errors, and sharded generate == single-device generate.

The sharded-vs-single comparisons need 8 devices, which XLA only creates when
XLA_FLAGS=--xla_force_host_platform_device_count=8 is set before JAX starts;
this pytest process already started JAX (other test files import it), so they
run in one fresh interpreter (`sharded_generate_worker.py`, about 2 minutes
on 2 cores) and each case is reported as its own test here. The rest runs
in-process on one device, except one GPU test that needs 2 Hopper GPUs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from hyquant_jax import HyQuantConfig, cli, freeze, sharding
from hyquant_jax.generate import generate
from hyquant_jax.model_attention import PromptStaging, make_attention
from models import BF16Attention, KVBuffer, ModelConfig, PrefillContext, abstract_model, init_model, split_model
from models.attention import BATCH, KV_HEADS, logical_axes
from tests.helpers import sharded_generate_worker as worker  # importing it only reads CASES; no device is touched

ROOT = Path(__file__).resolve().parent.parent

COMPARISONS = [c for c, (kind, _, _) in worker.CASES.items() if kind is not None]
ERRORS = {"error-kv-heads": ["4 KV heads", "model axis of size 8"],
          "error-batch": ["batch of 3", "data axis of size 2"],
          "error-state-heads": ["3 KV heads", "model axis of size 2"]}


@pytest.fixture(scope="module")
def sharded_runs():
    """Run every worker case once in a subprocess with 8 host devices; {case: row}."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "helpers" / "sharded_generate_worker.py")],
                          capture_output=True, text=True, timeout=900, env=env, cwd=str(ROOT))
    rows = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{") and '"case"' in line:
            row = json.loads(line)
            rows[row["case"]] = row
    if not rows:
        pytest.fail(f"the sharding worker printed no results (rc={proc.returncode}):\n{proc.stderr[-4000:]}")
    return rows


@pytest.mark.parametrize("case", COMPARISONS)
def test_sharded_generate_equals_single_device(sharded_runs, case):
    """Greedy tokens of the sharded run equal the single-device run's, and states have the sharded layout."""
    row = sharded_runs.get(case)
    assert row is not None, f"worker did not report {case}"
    assert row["ok"], f"{case}: {row['detail']}"


@pytest.mark.parametrize("case", list(ERRORS))
def test_sharded_generate_errors(sharded_runs, case):
    row = sharded_runs[case]
    assert row["ok"], row["detail"]
    for words in ERRORS[case]:
        assert words in row["detail"], row["detail"]


# --------------------------------------------------------------------------- in-process (one device)


def test_parse_mesh_shape():
    assert sharding.parse_mesh_shape("data=1,model=2") == {"data": 1, "model": 2}
    assert sharding.parse_mesh_shape(" model = 4 ") == {"data": 1, "model": 4}
    assert sharding.parse_mesh_shape({"data": 2}) == {"data": 2, "model": 1}
    for bad, words in [("data=1,tensor=2", "unknown axis 'tensor'"), ("model=0", "positive integer"),
                       ("model=two", "positive integer"), ("model", "AXIS=SIZE"), ("", "names no axis"),
                       ("model=2,model=2", "given twice"), ({"model": 1.5}, "positive integer")]:
        with pytest.raises(ValueError, match=words):
            sharding.parse_mesh_shape(bad)


def test_make_mesh_needs_enough_devices():
    n = len(jax.devices())
    mesh = sharding.make_mesh(f"data=1,model={n}")
    assert sharding.mesh_sizes(mesh) == (1, n) and mesh.axis_names == ("data", "model")
    with pytest.raises(ValueError, match=f"needs {n + 1} devices") as err:
        sharding.make_mesh(f"data={n + 1},model=1")
    if jax.devices()[0].platform == "cpu":
        assert f"XLA_FLAGS=--xla_force_host_platform_device_count={n + 1}" in str(err.value)


def test_divisibility_errors_name_the_numbers():
    config = ModelConfig("llama", vocab_size=64, hidden_size=32, intermediate_size=96, num_layers=1, num_heads=6,
                         num_kv_heads=3, head_dim=16)
    sharding.check_model_fits(config, 3)
    with pytest.raises(ValueError, match="3 KV heads, which do not divide over the model axis of size 2"):
        sharding.check_model_fits(config, 2)
    odd_mlp = ModelConfig("llama", vocab_size=64, hidden_size=32, intermediate_size=90, num_layers=1, num_heads=4,
                          num_kv_heads=4, head_dim=16)
    with pytest.raises(ValueError, match="intermediate_size=90 does not divide over the model axis of size 4"):
        sharding.check_model_fits(odd_mlp, 4)
    with pytest.raises(ValueError, match="batch of 5 sequence"):
        sharding.check_batch_fits(5, 2)


@pytest.mark.parametrize("flags", [dict(qkv_bias=True), dict(qk_norm=True), dict(tie_embeddings=True)])
def test_param_specs_come_from_the_modules_logical_axes(flags):
    """The specs have the weights' structure and are the modules' logical axis names through `logical_rules`:
    whole GQA groups, heads and MLP columns over "model", the rest replicated (the same for the real model and
    its abstract form)."""
    config = ModelConfig("qwen3", vocab_size=60, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                         num_kv_heads=2, head_dim=16, **flags)
    model = init_model(jax.random.PRNGKey(0), config, jnp.float32)
    weights = split_model(model).weights
    specs = sharding.param_specs(model, 2)
    assert specs == sharding.param_specs(abstract_model(config), 2)
    is_spec = lambda x: isinstance(x, P)  # noqa: E731
    assert jax.tree_util.tree_structure(specs, is_leaf=is_spec) == jax.tree_util.tree_structure(weights)
    for spec, x in zip(jax.tree_util.tree_leaves(specs, is_leaf=is_spec), jax.tree_util.tree_leaves(weights)):
        assert len(spec) == x.ndim
    layer = specs["layers"][0]
    assert layer["wqkv"] == P(None, "model", None, None) and layer["wo"] == P("model", None, None)
    assert layer["w_gate"] == P(None, "model") and layer["w_down"] == P("model", None)
    assert specs["embed"] == P(None, None) and layer["attn_norm"] == P(None)
    if config.qkv_bias:
        assert layer["bqkv"] == P("model", None, None)
    if config.qk_norm:
        assert layer["q_norm"] == layer["k_norm"] == P(None)
    if not config.tie_embeddings:
        assert specs["lm_head"] == P(None, "model")
        assert sharding.param_specs(model, 7)["lm_head"] == P(None, None)  # 60 % 7: the head stays whole
    else:
        assert "lm_head" not in specs


def test_param_specs_refuse_a_weight_without_logical_axes():
    from flax import nnx

    config = ModelConfig("llama", vocab_size=60, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=4,
                         num_kv_heads=2, head_dim=16)
    model = init_model(jax.random.PRNGKey(0), config, jnp.float32)
    model.layers[0].w_up = nnx.Param(model.layers[0].w_up[...])
    with pytest.raises(ValueError, match=r"model weight layers.0.w_up \(32, 64\) has logical axes None"):
        sharding.param_specs(model, 2)


def test_init_model_sharded_equals_init_model():
    config = ModelConfig("qwen3", vocab_size=60, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                         num_kv_heads=2, head_dim=16, qkv_bias=True, qk_norm=True)
    mesh = sharding.make_mesh("data=1,model=1")
    sharded = sharding.init_model_sharded(jax.random.PRNGKey(0), config, mesh, jnp.float32)
    plain = init_model(jax.random.PRNGKey(0), config, jnp.float32)
    chex.assert_trees_all_close(split_model(sharded).weights, split_model(plain).weights, rtol=1e-6, atol=1e-6)
    placed = split_model(sharding.shard_model(plain, mesh)).weights
    assert placed["layers"][0]["wqkv"].sharding.spec == P(None, "model", None, None)
    assert not isinstance(split_model(plain).weights["embed"].sharding, jax.sharding.NamedSharding)  # untouched


def test_state_specs_split_heads_and_sequences():
    hq = HyQuantConfig(window=16, block_size=16, prefill_block=16, rho=0.1)
    b, h, n, d = 2, 2, 48, 32
    k = jax.random.normal(jax.random.PRNGKey(0), (b, h, n, d))
    q_tail = jax.random.normal(jax.random.PRNGKey(1), (b, 4, 16, d))
    cache = freeze(k, k, jnp.array([48, 30], jnp.int32), q_tail, hq, 96)
    specs = sharding.state_specs(cache)
    assert specs.max_len == cache.max_len
    for name in ("page_count", "num_pages", "num_vl", "ring_start", "ring_len", "length"):  # per sequence
        assert getattr(specs, name) == P("data"), name
    for name in ("k_codes", "k_scale", "v_codes", "vl_k", "ring_k", "ring_score"):
        assert getattr(specs, name) == P("data", "model"), name
    assert (cache.k_zero is None) == (specs.k_zero is None)
    assert sharding.state_specs(KVBuffer(k, k)) == KVBuffer(P("data", "model"), P("data", "model"))
    staging = sharding.state_specs(PromptStaging(k, k, q_tail))
    assert staging.q_tail == P("data", "model")
    assert sharding.state_specs(None) is None
    ctx = sharding.state_specs(PrefillContext(jnp.int32(0), jnp.array([48, 30]), 96))
    assert (ctx.offset, ctx.lengths, ctx.max_len) == (P(), P("data"), 96)
    with pytest.raises(TypeError, match="no sharding rule"):
        sharding.state_specs({"k": k})

    @jax.tree_util.register_dataclass
    @dataclasses.dataclass(frozen=True)
    class Undeclared:
        k: jax.Array = logical_axes(BATCH, KV_HEADS)
        v: jax.Array = None

    with pytest.raises(TypeError, match=r"undeclared: \['v'\]"):
        sharding.state_specs(Undeclared(k, k))


def test_shard_state_places_every_array():
    mesh = sharding.make_mesh("data=1,model=1")
    k = jax.random.normal(jax.random.PRNGKey(0), (2, 2, 48, 32))
    cache = freeze(k, k, jnp.array([48, 30], jnp.int32), k[:, :, -16:], HyQuantConfig(window=16, block_size=16,
                                                                                          prefill_block=16), 96)
    placed = sharding.shard_state(cache, mesh)
    for x, y in zip(jax.tree_util.tree_leaves(placed), jax.tree_util.tree_leaves(cache)):
        assert isinstance(x.sharding, jax.sharding.NamedSharding) and np.array_equal(x, y)
    assert sharding.shard_bytes(placed) == cache.nbytes()
    assert sharding.shard_states((None,), mesh) == (None,)


def test_one_device_mesh_generate_equals_plain_generate():
    config = ModelConfig("llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                         num_kv_heads=2, head_dim=16, max_position=512)
    model = init_model(jax.random.PRNGKey(0), config, jnp.float32)
    prompts = [[1, 2, 3, 4, 5], [7, 8]]
    mesh = sharding.make_mesh("data=1,model=1")
    attention = BF16Attention()
    plain = generate(model, prompts, attention=attention, max_new_tokens=6, eos_ids=())
    sharded = generate(model, prompts, attention=attention, max_new_tokens=6, eos_ids=(), mesh=mesh)
    assert np.array_equal(plain.tokens, sharded.tokens)
    wrapped = sharding.ShardedAttention(attention, mesh)
    assert hash(wrapped) == hash(sharding.ShardedAttention(BF16Attention(), mesh))
    assert sharding.shard_attention(wrapped, mesh) is wrapped
    assert sharding.ShardedAttention(make_attention("hyquant", backend="interpret"), mesh)._vma() is False
    assert sharding.ShardedAttention(make_attention("hyquant", backend="reference"), mesh)._vma() is True
    # the fused chunk kernel is a Pallas call too: no replication check with it (auto takes it on a GPU only)
    on_gpu = jax.default_backend() == "gpu"
    for impl, vma in (("triton", False), ("xla", True), ("auto", not on_gpu)):
        assert sharding.ShardedAttention(BF16Attention(chunk_impl=impl), mesh)._vma() is vma, impl
        hybrid = dataclasses.replace(make_attention("hyquant", backend="reference"), chunk_impl=impl)
        assert sharding.ShardedAttention(hybrid, mesh)._vma() is vma, impl


def test_cli_mesh_errors(capsys):
    n = len(jax.devices())
    assert cli.main(["generate", "--mesh", f"data={n + 1}"]) == 2
    err = capsys.readouterr().err
    assert f"needs {n + 1} devices" in err
    if jax.devices()[0].platform == "cpu":
        assert "xla_force_host_platform_device_count" in err
    assert cli.main(["generate", "--mesh", "tensor=2"]) == 2
    assert "unknown axis 'tensor'" in capsys.readouterr().err


def _hopper_pair() -> bool:
    from hyquant_jax.backends import is_hopper

    devices = [d for d in jax.devices() if d.platform == "gpu"]
    return len(devices) >= 2 and all(is_hopper(d) for d in devices[:2])


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper_pair(), reason="needs 2 Hopper GPUs (run `pytest -m gpu` on a 2-GPU box)")
@pytest.mark.parametrize("mesh_shape", ["data=1,model=2", "data=2,model=1"])
def test_gpu_sharded_hyquant_equals_single_device(mesh_shape):
    """HybridAttention with the GPU kernels (whole-prompt prefill + Freeze, then one decode step) on a 2-GPU
    mesh equals the same calls on one GPU: the caches bit for bit (the ring scores within 5e-3: they use the
    decode kernel's lse), the outputs within the kernels' tolerance, and the decode also against the float
    reference. The shapes make each shard's decode take the Mosaic low-bit kernel (B x local KV heads x pages
    >= MOSAIC_MIN_PAGES)."""
    from hyquant_jax import decode_launch
    from hyquant_jax.reference import hybrid_decode_attention_reference
    from models.attention import DecodeContext, PrefillContext

    config = HyQuantConfig()
    b, hq, h, d, s = 4, 32, 8, 128, 16384
    mesh = sharding.make_mesh(mesh_shape, jax.devices()[:2])
    data, model = sharding.mesh_sizes(mesh)
    keys = jax.random.split(jax.random.PRNGKey(21), 6)
    bf16 = lambda key, shape: jax.random.normal(key, shape, jnp.bfloat16)  # noqa: E731
    q, k, v = bf16(keys[0], (b, hq, s, d)), bf16(keys[1], (b, h, s, d)), bf16(keys[2], (b, h, s, d))
    lengths = jnp.array([s, 15000, 9001, 16000], jnp.int32)
    max_len = s + 128
    attn = make_attention("hyquant", config, backend="auto")
    sharded = sharding.ShardedAttention(attn, mesh)
    ctx = PrefillContext(jnp.int32(0), lengths, max_len, whole=True)

    out1, cache1 = attn.prefill(0, q, k, v, None, ctx)
    out2, cache2 = sharded.prefill(0, q, k, v, None, ctx)
    valid = (jnp.arange(s)[None, :] < lengths[:, None])[:, None, :, None]
    np.testing.assert_allclose(np.asarray(jnp.where(valid, out2, 0), np.float32),
                               np.asarray(jnp.where(valid, out1, 0), np.float32), atol=2e-3, rtol=2e-3)
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(cache1), jax.tree_util.tree_leaves(cache2)):
        assert np.array_equal(np.asarray(x), np.asarray(y)), f"prefill cache leaf {jax.tree_util.keystr(path)} differs"

    local = cache1.batch // data * (cache1.num_kv_heads // model) * cache1.page_count.shape[1]
    assert local >= decode_launch.MOSAIC_MIN_PAGES  # each shard's decode takes the Mosaic low-bit kernel
    qd, kd, vd = bf16(keys[3], (b, hq, d)), bf16(keys[4], (b, h, d)), bf16(keys[5], (b, h, d))
    step = DecodeContext(positions=lengths, active=jnp.ones((b,), bool))
    dec1, new1 = attn.decode(0, qd, kd, vd, cache1, step)
    dec2, new2 = sharded.decode(0, qd, kd, vd, cache2, step)
    want, _ = hybrid_decode_attention_reference(qd.astype(jnp.float32), new1, config)
    for got in (dec1, dec2):
        err = float(jnp.linalg.norm(got.astype(jnp.float32) - want) / jnp.linalg.norm(want))
        assert err < 1e-2, f"decode relative error {err:.3g} against the float reference"
    err = float(jnp.linalg.norm(dec2.astype(jnp.float32) - dec1.astype(jnp.float32)) / jnp.linalg.norm(want))
    assert err < 5e-3, f"sharded vs single-device decode differ by {err:.3g}"
    # the ring scores add exp(logit - lse) with the kernel's lse, whose split count follows the local shape
    np.testing.assert_allclose(np.asarray(new2.ring_score), np.asarray(new1.ring_score), rtol=5e-3, atol=1e-6)
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(dataclasses.replace(new1, ring_score=None)),
                            jax.tree_util.tree_leaves(dataclasses.replace(new2, ring_score=None))):
        assert np.array_equal(np.asarray(x), np.asarray(y)), f"decode cache leaf {jax.tree_util.keystr(path)} differs"
