"""The Mosaic GPU low-bit decode kernel (`pallas_kernels/decode_mgpu.py`) and its launch planner
(`hyquant_jax.decode_launch`).

The kernel's unpack is inline PTX, which no interpreter runs, so on CPU: the channel orders it relies on,
its lowering for CUDA (Mosaic GPU's layout inference and lowering run in Python), its float64 oracle, the
argument checks, and the glue (q preparation, split conversion, merge with the Triton kernel's VL and ring
splits) with the kernel replaced by an emulation built from the oracle. On the GPU (`pytest -m gpu`): the
compiled kernel against the oracle on random caches, and (tests/test_decode.py) the whole decode
against the reference, which takes this kernel for the default config on Hopper.
"""

import dataclasses
import math
from types import SimpleNamespace

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest

import hyquant_jax as hq
from hyquant_jax import decode_launch
from hyquant_jax.cache import append
from hyquant_jax.model_attention import HybridAttention
from hyquant_jax.reference import hybrid_decode_attention_reference
from pallas_kernels import decode_mgpu as dm
from tests.test_decode import _cache

on_hopper = jax.default_backend() == "gpu" and str(getattr(jax.devices()[0], "compute_capability", "")).startswith("9.")


def random_case(batch, heads, pages, num_pages, seed, partial=True, spike_page=None):
    """Random cache arrays in the kernel's argument order (q natural f32 [B, H, 16, 128], base-2 logits).
    spike_page: shift that page's key zero points by 10, moving its logits by 10 * sum(q row), about +-20 (the
    running max jumps mid-split, past the lazy max's slack for some rows)."""
    rng = np.random.default_rng(seed)
    slots = pages * dm.PAGE
    bf16 = lambda x: np.asarray(jnp.asarray(x, jnp.bfloat16))  # noqa: E731
    q = (rng.normal(size=(batch, heads, dm.ROWS, dm.HEAD_DIM)) * 0.2).astype(np.float32)
    kc = rng.integers(0, 256, (batch, heads, slots, dm.BYTES), dtype=np.uint8)
    ks = bf16(rng.uniform(0.02, 0.2, (batch, heads, pages, dm.HEAD_DIM)))
    kz = rng.normal(size=(batch, heads, pages, dm.HEAD_DIM))
    if spike_page is not None:
        kz[:, :, spike_page] += 10.0
    kz = bf16(kz)
    vc = rng.integers(0, 256, (batch, heads, slots, dm.BYTES), dtype=np.uint8)
    vs = bf16(rng.uniform(0.02, 0.2, (batch, heads, slots)))
    vz = bf16(rng.normal(size=(batch, heads, slots)))
    count = (rng.integers(1, dm.PAGE + 1, (batch, pages)) if partial else np.full((batch, pages), dm.PAGE))
    return q, kc, ks, kz, vc, vs, vz, count.astype(np.int32), np.asarray(num_pages, np.int32)


def kernel_args(case):
    q, *rest = case
    return (jnp.asarray(q[..., dm.KEY_CHANNELS], jnp.float16), *(jnp.asarray(x) for x in rest))


def test_channel_orders_are_permutations():
    assert sorted(dm.KEY_CHANNELS) == list(range(128)) and sorted(dm.VALUE_CHANNELS) == list(range(128))
    np.testing.assert_array_equal(dm.VALUE_CHANNELS[dm.NATURAL_FROM_VALUE_ROWS], np.arange(128))
    # A thread's 16 bytes 16j..16j+15 of a key row hold dims 16j..16j+15 and 64+16j..: virtual channels of
    # lane column j are exactly those 32 dims.
    for j in range(4):
        v = [x for x in range(128) if (x // 2) % 4 == j]
        want = list(range(16 * j, 16 * j + 16)) + list(range(64 + 16 * j, 80 + 16 * j))
        assert sorted(dm.KEY_CHANNELS[v]) == sorted(want)


@pytest.mark.parametrize("splits,stages", [(1, 1), (3, 2), (8, 4), (2, 3)])
def test_kernel_lowers_for_cuda(splits, stages):
    args = kernel_args(random_case(2, 2, 6, [5, 0], seed=0))
    fn = jax.jit(lambda *a: dm.low_bit_splits(*a, num_splits=splits, stages=stages))
    assert "mosaic_gpu" in fn.trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def test_splits_cover_every_page_once():
    """`split_pages`: over a sequence's splits, every page in use is attended exactly once, in order, each
    split a contiguous run of at most ceil(num_pages / num_splits) pages."""
    for num_pages in range(0, 40):
        for num_splits in (1, 2, 3, 5, 8, 33):
            seen = []
            for split in range(num_splits):
                first, stop = (int(x) for x in dm.split_pages(num_pages, split, num_splits))
                assert first <= stop and stop - first <= -(-num_pages // num_splits)
                seen += range(first, stop)
            assert seen == list(range(num_pages)), (num_pages, num_splits)


@pytest.mark.parametrize("group", [1, 4, 5, 16])
def test_kernel_lowers_for_cuda_with_the_query_prepared_inside(group):
    case = random_case(2, 2, 6, [5, 0], seed=0)
    args = kernel_args(case)
    q = jnp.zeros((2, 2 * group, dm.HEAD_DIM), jnp.bfloat16)
    fn = jax.jit(lambda *a: dm.low_bit_splits(*a, num_splits=3, stages=2, query_scale=0.125))
    text = fn.trace(q, *args[1:]).lower(lowering_platforms=("cuda",)).as_text()
    assert "mosaic_gpu" in text


def test_prepared_query_arguments():
    args = list(kernel_args(random_case(1, 2, 2, [2], seed=1)))
    with pytest.raises(ValueError, match=r"with query_scale, q must be bf16 \[B=1, H \* G, 128\]"):
        dm.low_bit_splits(jnp.zeros((1, 3, 128), jnp.bfloat16), *args[1:], num_splits=1, query_scale=0.1)
    with pytest.raises(ValueError, match=r"with query_scale, q must be bf16"):  # 17 rows per KV head
        dm.low_bit_splits(jnp.zeros((1, 34, 128), jnp.bfloat16), *args[1:], num_splits=1, query_scale=0.1)
    with pytest.raises(ValueError, match=r"q must be bfloat16 \(1, 8, 128\)"):
        dm.low_bit_splits(jnp.zeros((1, 8, 128), jnp.float32), *args[1:], num_splits=1, query_scale=0.1)


def test_prepared_query_layout_matches_kernel_query():
    """The addresses `_prepare_query` writes, replayed in NumPy: thread t (row t // 8, virtual channels
    16c .. 16c + 15 for c = t % 8) reads natural dims 16j + 4(c // 2) + 64(c % 2) + (0 .. 3) and stores its
    two 16-byte chunks at the tiled, swizzled offsets; unswizzling the buffer gives kernel_query's q."""
    rng = np.random.default_rng(3)
    group, scale = 5, 0.0883883
    q = np.asarray(jnp.asarray(rng.normal(size=(1, group, 128)), jnp.bfloat16).astype(jnp.float32))
    want = np.asarray(dm.kernel_query(decode_launch.query_groups(jnp.asarray(q), 1, scale)), np.float32)[0, 0]
    buf = np.zeros(16 * 128, np.float32)  # f16 elements of the [16, 128] tile buffer, in memory order
    for t in range(128):
        row, blk = t // 8, t % 8
        base = 4 * (blk // 2) + 64 * (blk % 2)
        vals = np.zeros((2, 8), np.float32)  # two chunks of 8 f16 values (4 pairs each)
        for j in range(4):
            d = base + 16 * j
            x = q[0, row, d:d + 4] if row < group else np.zeros(4, np.float32)
            conv = ((x * np.float32(scale)) * np.float32(1 / dm.LN2)).astype(np.float16).astype(np.float32)
            vals[0, 2 * j:2 * j + 2], vals[1, 2 * j:2 * j + 2] = conv[:2], conv[2:]
        tile, r8 = (row // 8) * 2 + blk // 4, row % 8
        for k in range(2):
            chunk = (2 * (blk % 4) + k) ^ r8
            start = (tile * 1024 + r8 * 128 + chunk * 16) // 2
            buf[start:start + 8] = vals[k]
    tiles = buf.reshape(2, 2, 8, 8, 8)  # (row tile, column tile, row in tile, 16-byte chunk, 8 f16)
    unswizzled = np.empty_like(tiles)
    for r8 in range(8):
        unswizzled[:, :, r8] = tiles[:, :, r8][:, :, [k ^ r8 for k in range(8)]]
    got = unswizzled.reshape(2, 2, 8, 64).transpose(0, 2, 1, 3).reshape(16, 128)
    np.testing.assert_array_equal(got, want)


def test_argument_errors_name_the_argument():
    args = list(kernel_args(random_case(1, 1, 2, [2], seed=1)))
    bad = list(args)
    bad[4] = bad[4][..., :32]  # v_codes with the wrong width
    with pytest.raises(ValueError, match=r"v_codes must be uint8 \(1, 1, 128, 64\)"):
        dm.low_bit_splits(*bad, num_splits=1)
    bad = list(args)
    bad[0] = bad[0].astype(jnp.float32)
    with pytest.raises(ValueError, match="q must be float16"):
        dm.low_bit_splits(*bad, num_splits=1)
    with pytest.raises(ValueError, match="num_splits"):
        dm.low_bit_splits(*args, num_splits=0)


def test_oracle_is_attention_over_the_valid_tokens():
    """The float64 oracle equals a direct softmax over the valid tokens of each page (base 2)."""
    q, kc, ks, kz, vc, vs, vz, count, npg = random_case(1, 1, 3, [2], seed=2)
    out, m, l = dm.reference_low_bit(q, kc, ks, kz, vc, vs, vz, count, npg)
    nib = lambda c: np.concatenate([c & 15, c >> 4], axis=-1).astype(np.float64)  # noqa: E731
    keys, vals = [], []
    for p in range(2):
        t = slice(p * 64, p * 64 + int(count[0, p]))
        keys.append(nib(kc[0, 0, t]) * ks[0, 0, p].astype(np.float64) + kz[0, 0, p].astype(np.float64))
        vals.append(nib(vc[0, 0, t]) * vs[0, 0, t, None].astype(np.float64) + vz[0, 0, t, None].astype(np.float64))
    s = q[0, 0].astype(np.float64) @ np.concatenate(keys).T
    p = 2.0 ** (s - s.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out[0, 0], p @ np.concatenate(vals) / p.sum(axis=1, keepdims=True), rtol=1e-12)
    np.testing.assert_allclose(l[0, 0], p.sum(axis=1), rtol=1e-12)


def _emulated_low_bit_splits(*args, num_splits, stages, packed=False, query_scale=None):
    """`low_bit_splits` as one split (the rest empty), from the float64 oracle: same inputs, same outputs."""
    del stages
    if query_scale is not None:  # the step's bf16 q, prepared as the kernel does it
        args = (dm.kernel_query(decode_launch.query_groups(args[0], args[1].shape[1], query_scale)), *args[1:])

    def host(q, *cache_arrays):
        qn = np.asarray(q, np.float64)[..., np.argsort(dm.KEY_CHANNELS)]
        out, m, l = dm.reference_low_bit(qn, *(np.asarray(x) for x in cache_arrays))
        empty = l == 0
        o = np.where(empty[..., None], 0.0, out * l[..., None])[..., dm.VALUE_CHANNELS]
        m = np.where(empty, dm.NEG_INIT, m)
        pad = lambda x, fill: np.concatenate(  # noqa: E731
            [x[:, :, None], np.full(x.shape[:2] + (num_splits - 1,) + x.shape[2:], fill)], axis=2)
        return tuple(pad(x, f).astype(np.float32) for x, f in ((o, 0.0), (m, dm.NEG_INIT), (l, 0.0)))

    b, h = args[0].shape[:2]
    shapes = [jax.ShapeDtypeStruct((b, h, num_splits, dm.ROWS) + extra, jnp.float32) for extra in ((128,), (), ())]
    o, m, l = jax.pure_callback(host, tuple(shapes), *args)
    return (jnp.swapaxes(o, -1, -2), jnp.stack([m, l], axis=-2)) if packed else (o, m, l)


def test_glue_merges_mosaic_and_triton_splits(monkeypatch):
    """decode_launch's Mosaic path (q in base 2 and KEY_CHANNELS order, output rows back in natural order,
    natural-log maxima, the Triton kernel's VL and ring splits with n_low = 0) equals the reference, with the
    kernel emulated from its oracle. A sequence shorter than the window (no pages) is included."""
    monkeypatch.setattr(dm, "low_bit_splits", _emulated_low_bit_splits)
    config = hq.HyQuantConfig()  # the config the Mosaic kernel covers (K4V4 channel_key, pages of 64)
    qd, cache = _cache(jax.random.PRNGKey(11), 3, 8, 2, 128, [700, 300, 90], config, appends=2)
    assert decode_launch.mosaic_low_bit_fits(cache, config, 8)
    lay = decode_launch.decode_layout(cache, config, 8, low_bit_elsewhere=True)
    assert lay.n_low == 0 and lay.n_vl >= 1
    p = decode_launch.DecodePlan(low_bit="mosaic", layout=lay, num_warps=2, num_stages=2, mosaic_splits=3,
                                 mosaic_stages=2, merge="kernel", interpret=True)
    out, lse = decode_launch._run(qd, cache, p, 1.0 / math.sqrt(128))
    ref, ref_lse = hybrid_decode_attention_reference(qd, cache, config)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(np.asarray(lse), np.asarray(ref_lse), atol=2e-3)  # bf16 q in the Triton splits
    # with the step's own token as one more key (merged by decode_merge's kernel): as over the appended cache
    k, v = jax.random.normal(jax.random.PRNGKey(12), (2, 3, 2, 128))
    active = jnp.asarray([True, True, False])
    out, lse = decode_launch._run(qd, cache, p, 1.0 / math.sqrt(128), (k, v, active))
    ref, ref_lse = hybrid_decode_attention_reference(qd, append(cache, k, v, config, active=active), config)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(np.asarray(lse), np.asarray(ref_lse), atol=2e-3)
    # a bf16 q (the models' decode) reaches the kernel as it is, with the softmax scale to prepare it inside
    seen = []
    monkeypatch.setattr(dm, "low_bit_splits", lambda *a, **k: seen.append(k) or _emulated_low_bit_splits(*a, **k))
    qb = qd.astype(jnp.bfloat16)
    out, lse = decode_launch._run(qb, cache, p, 1.0 / math.sqrt(128))
    ref, ref_lse = hybrid_decode_attention_reference(qb, cache, config)
    assert seen and seen[0]["query_scale"] == 1.0 / math.sqrt(128)
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref, np.float32), rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(np.asarray(lse), np.asarray(ref_lse), atol=2e-3)


H100 = SimpleNamespace(platform="gpu", compute_capability="9.0", core_count=132, device_kind="NVIDIA H100")
A100 = SimpleNamespace(platform="gpu", compute_capability="8.0", core_count=108, device_kind="NVIDIA A100")
CPU = SimpleNamespace(platform="cpu", device_kind="cpu")


def test_mosaic_choice():
    """DecodeTuning.low_bit on fake devices: "auto" takes the Mosaic kernel on Hopper for large caches of the
    config it covers, "mosaic" where it cannot run is an error, "triton" never takes it."""
    config = hq.HyQuantConfig()
    qd, cache = _cache(jax.random.PRNGKey(12), 1, 8, 2, 128, [200], config)
    tuning = decode_launch.DecodeTuning

    def low_bit(c, t, device=H100, interpret=False):
        return decode_launch.plan(c, config, 8, t, device=device, interpret=interpret).low_bit

    large = dataclasses.replace(cache, page_count=jnp.zeros((1, decode_launch.MOSAIC_MIN_PAGES // 2), jnp.int32))
    assert low_bit(large, tuning()) == "mosaic"
    assert low_bit(large, tuning(), interpret=True) == "triton"
    assert low_bit(large, tuning(), device=A100) == low_bit(large, tuning(), device=CPU) == "triton"
    assert low_bit(large, tuning(low_bit="triton")) == "triton"
    # "auto" leaves small caches to the Triton kernel (1 x 2 heads x 4 pages here); "mosaic" takes them
    assert low_bit(cache, tuning()) == "triton"
    assert low_bit(cache, tuning(low_bit="mosaic")) == "mosaic"
    with pytest.raises(ValueError, match="low_bit='mosaic'.*needs a Hopper GPU"):
        low_bit(cache, tuning(low_bit="mosaic"), interpret=True)
    with pytest.raises(ValueError, match="low_bit='mosaic'.*needs a Hopper GPU"):
        low_bit(cache, tuning(low_bit="mosaic"), device=A100)
    for other in (hq.HyQuantConfig(key_bits=2), hq.HyQuantConfig(scheme="token_asym"),
                  hq.HyQuantConfig(block_size=32, window=128)):
        assert not decode_launch.mosaic_low_bit_fits(cache, other, 8)
    assert not decode_launch.mosaic_low_bit_fits(cache, config, 2 * 17)  # GQA group of 17 > 16 rows


def test_mosaic_splits_override(monkeypatch):
    """DecodeTuning.mosaic_splits reaches the Mosaic launch (splits, stages) as given; without it mosaic_splits
    decides, over the device's multiprocessors unless sm_count is set."""
    config = hq.HyQuantConfig()
    qd, cache = _cache(jax.random.PRNGKey(13), 2, 8, 2, 128, [300, 200], config)
    pages = cache.page_count.shape[1]

    def launch(tuning, device=H100):
        p = decode_launch.plan(cache, config, 8, dataclasses.replace(tuning, low_bit="mosaic"), device=device)
        return p.mosaic_splits, p.mosaic_stages

    assert launch(decode_launch.DecodeTuning(mosaic_splits=5, mosaic_stages=3)) == (5, 3)
    splits = decode_launch.mosaic_splits(2, 2, pages, 132)
    assert launch(decode_launch.DecodeTuning()) == (splits, 2)
    few_sms = SimpleNamespace(**{**vars(H100), "core_count": 2})
    few = decode_launch.mosaic_splits(2, 2, pages, 2)
    assert few != splits and launch(decode_launch.DecodeTuning(), few_sms) == (few, 2)
    assert launch(decode_launch.DecodeTuning(mosaic_splits=5, mosaic_stages=3), few_sms) == (5, 3)
    assert launch(decode_launch.DecodeTuning(sm_count=132), few_sms) == (splits, 2)


def test_hybrid_attention_passes_its_decode_tuning(monkeypatch):
    """HybridAttention(decode_tuning=...) reaches the kernel glue through decode_step (e2e.py's
    --mosaic-blocks-per-sm uses it); without it the glue gets its defaults; a wrong type is an error."""
    from models import DecodeContext

    config = hq.HyQuantConfig()
    qd, cache = _cache(jax.random.PRNGKey(14), 1, 8, 2, 128, [200], config)
    seen = []
    original = decode_launch.decode_attention
    monkeypatch.setattr(decode_launch, "decode_attention",
                        lambda *a, **k: seen.append(k.get("tuning")) or original(*a, **k))
    k, v = jax.random.normal(jax.random.PRNGKey(15), (2, 1, 2, 128))
    ctx = DecodeContext(jnp.asarray([200]), jnp.asarray([True]))
    tuning = decode_launch.DecodeTuning(mosaic_blocks_per_sm=1)
    for attention in (HybridAttention(config, "interpret", decode_tuning=tuning),
                      HybridAttention(config, "interpret")):
        out, _ = attention.decode(0, qd, k, v, cache, ctx)
        assert out.shape == qd.shape
    assert seen == [tuning, None]
    with pytest.raises(ValueError, match="HybridAttention.decode_tuning must be None or a"):
        HybridAttention(config, decode_tuning={"mosaic_blocks_per_sm": 1})
    with pytest.raises(ValueError, match="tuning must be None or a"):
        hq.decode_step(qd, k, v, cache, config, backend="interpret", tuning="fast")


def test_mosaic_splits():
    """One wave: 2 blocks per multiprocessor (132 on the H200), at least 2 splits, never more splits than
    pages. Past one wave (396 resident blocks): the fastest split count of the H200 sweep."""
    splits = decode_launch.mosaic_splits
    assert splits(1, 8, 512, 132) == 33  # B1 32K: 264 blocks
    assert splits(16, 8, 512, 132) == 3  # B16 32K: 384 blocks
    assert splits(24, 8, 512, 132) == 2  # 384 blocks, one wave
    assert splits(1, 8, 16, 132) == 16 and splits(4, 8, 1, 132) == 1  # capped by the pages
    assert splits(1, 8, 2048, 132, per_sm=4) == 66
    # the fastest count at each batch on the H200 (32K, 512 pages; docs/design.md, "Split heuristic")
    assert [splits(b, 8, 512, 132) for b in (25, 28, 64, 74, 76)] == [5, 5, 3, 2, 3]
    assert splits(48, 8, 512, 132) == 2  # at least 2
    assert splits(200, 8, 1, 132) == 1 and splits(200, 8, 2, 132) == 2


SHARDED_LOWERING = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, PartitionSpec as P
from pallas_kernels import decode_mgpu as dm
mesh = Mesh(np.array(jax.devices()[:2]), ("model",))
heads = P(None, "model")
fn = jax.shard_map(lambda *a: dm.low_bit_splits(*a, num_splits=4), mesh=mesh,
                   in_specs=(heads,) * 7 + (P(), P()), out_specs=(heads, heads, heads), check_vma=False)
sd = jax.ShapeDtypeStruct
args = (sd((2, 8, 16, 128), jnp.float16), sd((2, 8, 512, 64), jnp.uint8), sd((2, 8, 8, 128), jnp.bfloat16),
        sd((2, 8, 8, 128), jnp.bfloat16), sd((2, 8, 512, 64), jnp.uint8), sd((2, 8, 512), jnp.bfloat16),
        sd((2, 8, 512), jnp.bfloat16), sd((2, 8), jnp.int32), sd((2,), jnp.int32))
text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
print("mosaic custom calls:", text.count("mosaic_gpu_v2"))
"""


def test_kernel_lowers_for_cuda_under_shard_map():
    """Sharded generate splits the KV heads over the model axis: the kernel lowers for CUDA per shard
    (two virtual CPU devices; own process for the device count)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", PYTHONPATH=str(root))
    r = subprocess.run([sys.executable, "-c", SHARDED_LOWERING], cwd=root, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "mosaic custom calls: 1" in r.stdout, r.stdout


def test_profile_summary_sums_nested_regions_per_block():
    """benchmarks/profile_decode_mgpu.py: region totals over blocks from begin/end pairs, nested regions
    included, and shares of the loop regions; an unbalanced trace is an error; the blocks' timeline."""
    from benchmarks.profile_decode_mgpu import summarize, timeline

    def block(pid, tid, spans):
        return [dict(name=n, ph=ph, ts=t, pid=pid, tid=tid) for n, t0, t1 in spans for ph, t in (("B", t0), ("E", t1))]

    events = block(1, 1, [("wait", 0.0, 1.0), ("keys", 1.0, 4.0), ("pv", 4.0, 8.0)])
    events += block(2, 2, [("wait", 10.0, 12.0)])
    events += [dict(name="qk_values", ph="B", ts=20.0, pid=2, tid=2), dict(name="inner", ph="B", ts=21.0, pid=2, tid=2),
               dict(name="inner", ph="E", ts=22.0, pid=2, tid=2), dict(name="qk_values", ph="E", ts=25.0, pid=2, tid=2)]
    got = summarize({"traceEvents": events})
    assert got["blocks"] == 2
    r = got["regions"]
    assert (r["wait"]["total"], r["wait"]["count"], r["wait"]["mean"]) == (3.0, 2, 1.5)
    assert (r["keys"]["total"], r["pv"]["total"], r["qk_values"]["total"], r["inner"]["total"]) == (3.0, 4.0, 5.0, 1.0)
    assert r["pv"]["share_of_loop"] == 4.0 / 15.0 and "inner" not in summarize.__globals__["REGIONS"]
    with pytest.raises(ValueError, match="never closed"):
        summarize({"traceEvents": events[:-1]})
    # the timeline: block 1 starts at 0 and lasts 8, block 2 starts at 10 and lasts 15; SM 1 and SM 2 one each
    t = timeline({"traceEvents": events})
    assert t["start_us"]["min"] == 0.0 and t["start_us"]["max"] == 10.0 and t["start_us"]["p50"] == 5.0
    assert t["duration_kcycles"]["min"] == 8.0 and t["duration_kcycles"]["max"] == 15.0
    assert t["sms_by_blocks"] == {"1": 2}


# ----------------------------------------------------------------- GPU: the compiled kernel

GPU_CASES = [  # (name, case kwargs, splits, stages)
    ("one sequence, full pages", dict(batch=1, heads=2, pages=4, num_pages=[4], seed=0, partial=False), 2, 2),
    ("ragged, a sequence without pages", dict(batch=3, heads=2, pages=6, num_pages=[5, 0, 3], seed=1), 4, 3),
    ("more splits than pages", dict(batch=2, heads=1, pages=3, num_pages=[3, 1], seed=2), 8, 2),
    ("40 pages, 5 splits, 4 stages", dict(batch=1, heads=8, pages=40, num_pages=[37], seed=3), 5, 4),
    ("one split", dict(batch=2, heads=3, pages=9, num_pages=[9, 7], seed=4), 1, 2),
    ("300 pages in one split", dict(batch=1, heads=2, pages=300, num_pages=[300], seed=6, partial=False), 1, 2),
    ("max jumps mid-split", dict(batch=2, heads=2, pages=12, num_pages=[12, 10], seed=5, spike_page=7), 2, 2),
]


@pytest.mark.gpu
@pytest.mark.skipif(not on_hopper, reason="needs a Hopper GPU")
@pytest.mark.parametrize("group", [1, 4, 5, 16])
def test_gpu_prepared_query_equals_kernel_query(group):
    """The kernel with the step's bf16 q prepared inside equals it with `kernel_query`'s q, and the oracle."""
    case = random_case(batch=2, heads=3, pages=7, num_pages=[7, 4], seed=20 + group)
    rng = np.random.default_rng(group)
    qn = jnp.asarray(rng.normal(size=(2, 3 * group, dm.HEAD_DIM)) * 2.0, jnp.bfloat16)
    scale = 1.0 / math.sqrt(128)
    rest = kernel_args(case)[1:]
    got = dm.low_bit_splits(qn, *rest, num_splits=3, query_scale=scale)
    prepared = dm.kernel_query(decode_launch.query_groups(qn, 3, scale))
    want = dm.low_bit_splits(prepared, *rest, num_splits=3)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    q64 = np.asarray(prepared, np.float64)[..., np.argsort(dm.KEY_CHANNELS)]
    out = np.asarray(dm.merge(*got), np.float64)[:, :, :group]
    ref = dm.reference_low_bit(q64, *case[1:])[0][:, :, :group]
    err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    assert err < 1e-3, f"relative error {err:.3g}"


@pytest.mark.gpu
@pytest.mark.skipif(not on_hopper, reason="needs a Hopper GPU")
@pytest.mark.parametrize("name,kwargs,splits,stages", GPU_CASES, ids=[c[0] for c in GPU_CASES])
def test_gpu_kernel_matches_oracle(name, kwargs, splits, stages):
    _check_oracle(kwargs, splits, stages)


def _check_oracle(kwargs, splits, stages):
    case = random_case(**kwargs)
    q16 = np.asarray(jnp.asarray(case[0], jnp.float16), np.float64)  # the oracle sees the kernel's fp16 q
    o, m, l = dm.low_bit_splits(*kernel_args(case), num_splits=splits, stages=stages)
    out = np.asarray(dm.merge(o, m, l), np.float64)
    want, _, l_want = dm.reference_low_bit(q16, *case[1:])
    has = case[-1] > 0
    err = np.linalg.norm(out[has] - want[has]) / np.linalg.norm(want[has])
    assert np.all(np.isfinite(out)) and err < 1e-3, f"relative error {err:.3g}"
    assert np.all(out[~has] == 0)
    l_sum = (np.asarray(l) * 2.0 ** (np.asarray(m) - np.asarray(m).max(axis=2, keepdims=True))).sum(axis=2)
    assert np.all((l_sum > 0) == (l_want > 0))
