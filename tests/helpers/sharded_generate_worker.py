"""Subprocess behind tests/test_sharding.py: sharded vs single-device greedy generate on 8 virtual CPU devices.

XLA_FLAGS=--xla_force_host_platform_device_count=8 must be set before JAX
starts its backend, which the pytest process has already done with one
device; so the test runs this file in a fresh interpreter:

    python tests/helpers/sharded_generate_worker.py [CASE ...]   (no CASE: all of CASES, about 2 minutes)

Prints one JSON line per case: {"case", "ok", "detail", "seconds"}.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from hyquant_jax import HyQuantConfig, sharding  # noqa: E402
from hyquant_jax.generate import decode, generate, pad_prompts, prefill  # noqa: E402
from hyquant_jax.model_attention import make_attention  # noqa: E402
from hyquant_jax.sampling import SamplingConfig  # noqa: E402
from models import ModelConfig, init_model, split_model  # noqa: E402

# Hq 8 / Hkv 4: model axes 1, 2, 4 split the KV heads; vocab 90 splits over 2 but not 4 (lm_head then replicated).
CONFIG = ModelConfig("qwen3", vocab_size=90, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=8,
                     num_kv_heads=4, head_dim=32, max_position=1024, qk_norm=True, qkv_bias=True)
# Pallas kernels (interpret mode) need head_dim 64.
KERNEL_CONFIG = ModelConfig("qwen3", vocab_size=96, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                            num_kv_heads=2, head_dim=64, max_position=1024, qk_norm=True)
HQ = HyQuantConfig(window=16, block_size=16, prefill_block=16, rho=0.1)
PROMPT_LENGTHS = (37, 70, 5, 50)
NEW_TOKENS = 20

# case -> (attention kind, mesh, generate options)
CASES = {
    "bf16-data1-model2": ("bf16", "data=1,model=2", {}),
    "bf16-data2-model1": ("bf16", "data=2,model=1", {}),
    "bf16-data2-model2-donated": ("bf16", "data=2,model=2", {"manual": True}),
    "hyquant-data1-model2": ("hyquant", "data=1,model=2", {}),
    "hyquant-data2-model1": ("hyquant", "data=2,model=1", {}),
    "hyquant-data2-model2": ("hyquant", "data=2,model=2", {}),
    "hyquant-data1-model4": ("hyquant", "data=1,model=4", {}),
    "hyquant-chunked-data2-model2": ("hyquant", "data=2,model=2", {"prefill_chunk": 32}),
    # the fused chunked-prefill kernel (pallas_kernels.prefix, interpret mode here) inside the sharded prefill
    "bf16-chunked-triton-data2-model2": ("bf16-triton", "data=2,model=2", {"prefill_chunk": 32}),
    "hyquant-chunked-triton-data2-model2": ("hyquant-triton", "data=2,model=2", {"prefill_chunk": 32}),
    "kivi4-data2-model2": ("kivi4", "data=2,model=2", {}),
    "interpret-data2-model2": ("hyquant-interpret", "data=2,model=2", {}),
    "cli-data2-model2": ("cli", "data=2,model=2", {}),
    "error-kv-heads": (None, "data=1,model=8", {}),
    "error-batch": (None, "data=2,model=1", {}),
    "error-state-heads": (None, "data=1,model=2", {}),
}
def _attention(kind: str):
    if kind == "hyquant-interpret":
        return make_attention("hyquant", HQ, backend="interpret")
    if kind.endswith("-triton"):  # chunks attended by the fused kernel
        return dataclasses.replace(make_attention(kind.removesuffix("-triton"), HQ, backend="reference"),
                                   chunk_impl="triton")
    return make_attention(kind, HQ, backend="reference")


def _model(kind: str):
    config = KERNEL_CONFIG if kind == "hyquant-interpret" else CONFIG
    return init_model(jax.random.PRNGKey(0), config, jnp.float32)


def _prompts(config: ModelConfig):
    rng = np.random.default_rng(1)
    return [rng.integers(0, config.vocab_size, n).tolist() for n in PROMPT_LENGTHS]


_REFERENCE = {}


def _reference(kind: str, chunk: int) -> np.ndarray:
    """Single-device greedy tokens (cached per attention kind and prefill chunk)."""
    if (kind, chunk) not in _REFERENCE:
        model = _model(kind)
        res = generate(model, _prompts(model.config), attention=_attention(kind), max_new_tokens=NEW_TOKENS,
                       eos_ids=(), prefill_chunk=chunk)
        _REFERENCE[kind, chunk] = res.tokens
    return _REFERENCE[kind, chunk]


def _check_layout(states, mesh) -> str | None:
    """None if every state array is sharded as `state_specs` says and its local shard has the split shape."""
    d, m = sharding.mesh_sizes(mesh)
    specs = sharding.state_specs(states[0])
    leaves = jax.tree_util.tree_leaves(states[0])
    want = jax.tree_util.tree_leaves(specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
    for x, spec in zip(leaves, want):
        if not x.sharding.is_equivalent_to(jax.sharding.NamedSharding(mesh, spec), x.ndim):
            return f"array {x.shape} has sharding {x.sharding}, expected {spec}"
        local = x.addressable_shards[0].data.shape
        expect = list(x.shape)
        expect[0] //= d
        if len(spec) > 1 and spec[1] == sharding.MODEL:
            expect[1] //= m
        if list(local) != expect:
            return f"array {x.shape} has local shard {local}, expected {tuple(expect)}"
    return None


def _manual(kind: str, mesh, chunk: int):
    """prefill + decode by hand with sharded inputs; checks that the decode donates the sharded states."""
    model, attention = sharding.prepare(_model(kind), _attention(kind), mesh, len(PROMPT_LENGTHS))
    model_def, weights = split_model(model)
    tokens, lengths = pad_prompts(_prompts(model.config), chunk=chunk)
    tokens, lengths = sharding.put_batch(tokens, mesh), sharding.put_batch(lengths, mesh)
    key = sharding.put_replicated(jax.random.PRNGKey(0), mesh)
    static = dict(attention=attention, sampling=SamplingConfig())
    max_len = int(tokens.shape[1]) + NEW_TOKENS
    first, _, states = prefill(model_def, weights, tokens, lengths, key, chunk=chunk, max_len=max_len, **static)
    layout = _check_layout(states, mesh) or _check_weights(weights, model, mesh)
    new_states, out, _, _, _ = decode(model_def, weights, states, first, lengths, key, max_new_tokens=NEW_TOKENS,
                                      eos_ids=(), pad_id=0, **static)
    donated = all(x.is_deleted() for x in jax.tree_util.tree_leaves(states))
    return np.asarray(out), layout or _check_layout(new_states, mesh), donated


def _check_weights(weights, model, mesh) -> str | None:
    """None if every weight sits on `mesh` as `sharding.param_specs` of the model says."""
    specs = sharding.param_specs(model, sharding.mesh_sizes(mesh)[1])
    is_spec = lambda x: isinstance(x, jax.sharding.PartitionSpec)  # noqa: E731
    for x, spec in zip(jax.tree_util.tree_leaves(weights), jax.tree_util.tree_leaves(specs, is_leaf=is_spec)):
        if not x.sharding.is_equivalent_to(jax.sharding.NamedSharding(mesh, spec), x.ndim):
            return f"weight {x.shape} has sharding {x.sharding}, expected {spec}"
    return None


def _cli(shape: str) -> dict:
    """`hyquant generate --mesh shape` vs without a mesh on a tiny GGUF checkpoint (two prompts)."""
    import contextlib
    import io
    import tempfile
    from pathlib import Path

    from hyquant_jax import cli
    from tests.helpers.checkpoint_files import train_tokenizer, write_gguf

    tok = train_tokenizer()
    config = ModelConfig("llama", vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128,
                         num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32, max_position=4096)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tiny.gguf"
        write_gguf(path, init_model(jax.random.PRNGKey(0), config, jnp.float32), tokenizer=tok)
        runs = []
        for mesh in (None, shape):
            out = Path(tmp) / f"{mesh}.json"
            argv = ["generate", "--model", str(path), "--prompt", "Hello world! The quick brown fox", "--prompt",
                    "def f(x):", "--max-new-tokens", "8", "--window", "16", "--block-size", "16",
                    "--prefill-block", "16", "--no-compile-cache", "--json", str(out)]
            text = io.StringIO()
            with contextlib.redirect_stdout(text):
                rc = cli.main(argv + (["--mesh", mesh] if mesh else []))
            if rc != 0:
                return {"ok": False, "detail": f"rc={rc} with --mesh {mesh}"}
            runs.append(json.loads(out.read_text()))
    single, sharded = (r["runs"]["hyquant"]["tokens"] for r in runs)
    printed = f"mesh: {shape} over" in text.getvalue()
    ok = single == sharded and runs[1].get("mesh") == sharding.parse_mesh_shape(shape) and printed
    return {"ok": ok, "detail": {"equal": single == sharded, "mesh": runs[1].get("mesh"), "printed": printed,
                                 "got": sharded, "ref": single}}


def run_case(name: str) -> dict:
    kind, shape, opts = CASES[name]
    if kind == "cli":
        return _cli(shape)
    mesh = sharding.make_mesh(shape)
    if name == "error-state-heads":  # a state whose 3 KV heads cannot split over 2 devices
        from models import KVBuffer

        x = jnp.zeros((2, 3, 8, 4))
        try:
            sharding.shard_state(KVBuffer(x, x), mesh)
        except ValueError as e:
            return {"ok": True, "detail": str(e)}
        return {"ok": False, "detail": "no ValueError"}
    if kind is None:
        model = _model("bf16")
        prompts = _prompts(model.config)[:3] if name == "error-batch" else _prompts(model.config)
        try:
            generate(model, prompts, attention=_attention("bf16"), max_new_tokens=2, mesh=mesh)
        except ValueError as e:
            return {"ok": True, "detail": str(e)}
        return {"ok": False, "detail": "no ValueError"}
    chunk = opts.get("prefill_chunk", 2048)
    ref = _reference(kind, chunk)
    if opts.get("manual"):
        got, layout, donated = _manual(kind, mesh, chunk)
        ok = np.array_equal(got, ref) and layout is None and donated
        return {"ok": bool(ok), "detail": {"equal": bool(np.array_equal(got, ref)), "layout": layout,
                                           "donated": donated, "got": got.tolist(), "ref": ref.tolist()}}
    model = _model(kind)
    res = generate(model, _prompts(model.config), attention=_attention(kind), max_new_tokens=NEW_TOKENS,
                   eos_ids=(), prefill_chunk=chunk, mesh=mesh, keep_states=True)
    layout = _check_layout(res.states, mesh)
    equal = np.array_equal(res.tokens, ref)
    return {"ok": bool(equal and layout is None),
            "detail": {"equal": bool(equal), "layout": layout, "got": res.tokens.tolist(), "ref": ref.tolist()}}


def main(argv: list[str]) -> None:
    # Importing this module (as test_sharding.py does for CASES) touches no device; only running it
    # sets the device count, which works because XLA reads XLA_FLAGS when the backend first starts.
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
    jax.config.update("jax_default_matmul_precision", "highest")
    if len(jax.devices()) < 8:
        raise SystemExit(f"expected 8 host devices, got {len(jax.devices())} (was the backend started earlier?)")
    names = argv or list(CASES)
    for name in names:
        t0 = time.perf_counter()
        try:
            row = run_case(name)
        except Exception as e:  # reported to the test, which fails with the message
            row = {"ok": False, "detail": f"{type(e).__name__}: {e}"}
        row.update(case=name, seconds=round(time.perf_counter() - t0, 1))
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
