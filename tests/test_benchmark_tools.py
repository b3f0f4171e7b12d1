"""Helpers of the benchmark scripts that turn arguments and results into what they report."""

import os
import sys

import pytest

from benchmarks.decode_kernel import CASES, parse_tunings, select_cases
from benchmarks.prefill_kernel import summarize
from benchmarks.report import e2e_prefill_table, prefill_table
from hyquant_jax.decode_kernel import DecodeTuning


def test_parse_tunings_fields_and_default_items():
    first, default, third = parse_tunings("warps=1,pages=2,stages=3;;convert=magic,n_low=8")
    assert (first.num_warps, first.pages_per_tile, first.num_stages) == (1, 2, 3)
    assert (default.num_warps, default.num_stages, default.pages_per_tile, default.n_low) == (None,) * 4
    assert (third.convert, third.n_low) == ("magic", 8)
    assert all(isinstance(t, DecodeTuning) for t in (first, default, third))


def test_parse_tunings_mosaic_splits():
    (t,) = parse_tunings("mosaic_splits=5,mosaic_stages=3")
    assert (t.mosaic_splits, t.mosaic_stages, t.mosaic_blocks_per_sm, t.mosaic_pages_per_copy) == (5, 3, 2, 1)
    (t,) = parse_tunings("mosaic_ppc=4,mosaic_wide=1")
    assert t.mosaic_pages_per_copy == 4 and t.mosaic_wide
    (t,) = parse_tunings("mosaic_il=1")
    assert t.mosaic_interleave and not t.mosaic_wide


def test_select_cases_by_name_and_by_shape():
    assert select_cases("") == CASES
    assert [c[0] for c in select_cases("B1 1K,B16")] == ["qwen3-8b B1 1K", "qwen3-8b B16 32K"]
    assert select_cases("B1 32K,B25 32K")[1] == ("qwen3-8b B25 32K", 25, 32, 8, 128, 32768)
    assert select_cases("B16 32K") == [c for c in CASES if c[0] == "qwen3-8b B16 32K"]  # a known case wins
    for bad in ("B25", "B0 32K", "llama B1"):
        with pytest.raises(ValueError, match="--cases"):
            select_cases(bad)


@pytest.mark.parametrize("spec", ["warp=1", "warps=", "warps"])
def test_parse_tunings_rejects_unknown_or_empty_keys(spec):
    with pytest.raises(ValueError, match="--compare-tunings"):
        parse_tunings(spec)


def test_e2e_prefill_table_ratio_is_against_bf16_at_the_same_length():
    rows = [{"method": "bf16", "prefix": 4096, "seconds": 0.1, "tokens_per_s": 40960},
            {"method": "hyquant", "prefix": 4096, "seconds": 0.125, "tokens_per_s": 32768},
            {"method": "hyquant", "prefix": 8192, "seconds": 0.3, "tokens_per_s": 27307},
            {"method": "kivi4", "prefix": 4096, "error": "out of memory"}]
    lines = e2e_prefill_table({"prefill": rows}).splitlines()
    assert lines[2] == "| bf16 | 4096 | 0.100 | 40960 | 1.00x |"
    assert lines[3] == "| hyquant | 4096 | 0.125 | 32768 | 0.80x |"
    assert lines[4] == "| hyquant | 8192 | 0.300 | 27307 | - |"
    assert len(lines) == 5  # the failed row is left out


def test_trace_breakdown_sums_per_kernel_and_counts_gaps():
    """Per-name launches and time per step; busy time is the union of overlapping intervals; idle share is the
    uncovered part of the span."""
    from benchmarks.trace import breakdown, busy_time

    events = [  # ts, dur in microseconds, sorted by start
        {"name": "decode", "ts": 0.0, "dur": 10.0, "args": {"hlo_op": "custom-call.1"}},
        {"name": "merge", "ts": 5.0, "dur": 10.0},  # overlaps decode by 5 us
        {"name": "decode", "ts": 20.0, "dur": 10.0},  # after a 5 us gap
        {"name": "merge", "ts": 22.0, "dur": 4.0},  # inside the second decode
    ]
    assert busy_time(events) == 25.0
    r = breakdown(events, steps=2, top=5)
    assert r["kernels_per_step"] == 2.0 and r["kernel_us_per_step"] == 17.0
    assert r["span_us_per_step"] == 15.0 and r["busy_us_per_step"] == 12.5
    assert r["idle_share"] == pytest.approx(5.0 / 30.0)
    top = {k["name"]: k for k in r["top"]}
    assert [k["name"] for k in r["top"]] == ["decode", "merge"]
    assert top["decode"]["us_per_step"] == 10.0 and top["decode"]["us_per_launch"] == 10.0
    assert top["decode"]["hlo_op"] == "custom-call.1"
    assert top["merge"]["launches_per_step"] == 1.0 and top["merge"]["us_per_launch"] == 7.0
    # The one idle stretch (15 -> 20 us) ends with the second decode launch.
    assert r["idle_before"] == [{"name": "decode", "gaps_per_step": 0.5, "idle_us_per_step": 2.5}]


def test_prefill_table_reports_the_mosaic_kernel_when_the_run_has_it():
    """Ratios, VTI share and MSE ratio of the row are those of the Mosaic kernel (from `summarize`); methods a
    length lacks print n/a."""
    r = {"hybrid_int8": {"loop_ms": 5.5, "rel_mse": 2e-6}, "uniform_int8": {"loop_ms": 5.0, "rel_mse": 1e-4},
         "hybrid_int8_mgpu_2wg_fast_pp": {"loop_ms": 4.0, "rel_mse": 2.5e-6}, "hybrid_e2e_mosaic": {"loop_ms": 4.2},
         "vti": {"loop_ms": 0.21}, "cudnn_bf16": {"loop_ms": 4.4}, "pallas_mha_bf16": {"loop_ms": 5.2}}
    d = {"shape": {"Hq": 32, "Hkv": 8, "D": 128}, "device": "H200", "jax": "0.11.2", "date": "2026-11-30",
         "command": "x", "results": {"16384": r}, "summary": summarize({"16384": r}, [16384])}
    lines = prefill_table(d).splitlines()
    assert "`mosaic`/cuDNN" in lines[2] and "MSE uniform / `mosaic`" in lines[2]
    assert lines[4] == ("| 16384 | 5.500 | n/a | 5.000 | 4.000 | n/a | 4.200 | 4.400 | 5.200 | 1.10x | 1.30x | "
                        "5.0% | 40x |")


def test_read_bandwidth_reads_whole_arrays_of_the_asked_size():
    """Each form's array is the asked size (to within one row of 8192 / 4096 values) and its product reads
    all of it; `best` is the largest rate; an unknown form is refused by name."""
    import numpy as np

    from benchmarks.read_bandwidth import FORMS, _gemv, _operands, _rows, read_bandwidth

    nbytes = 1 << 20
    probe = read_bandwidth(nbytes, iters=1, reps=1)
    assert set(probe["tb_s"]) == set(FORMS) and probe["best"] == max(probe["tb_s"].values()) > 0
    assert all(nbytes - 2 * 8192 < b <= nbytes for b in probe["bytes"].values())
    for form, fn in (("rows", _rows), ("gemv", _gemv)):
        q, x = _operands(form, 1 << 16)
        xf, qf = np.asarray(x, np.float64), np.asarray(q, np.float64)
        want = (xf * qf[0, 0]).sum(axis=1) if form == "rows" else qf @ xf
        np.testing.assert_allclose(np.asarray(fn(q, x), np.float64), want, rtol=2e-2, atol=1e-3)
    with pytest.raises(ValueError, match="forms"):
        read_bandwidth(nbytes, forms=("copy",))


def test_decode_table_reports_the_hybrid_against_the_read_probe():
    from benchmarks.report import decode_table

    case = {"case": "c", "hybrid": {"loop_ms": 0.25, "tb_per_s": 2.6, "speedup_vs_best_bf16": 2.0},
            "cudnn": {"loop_ms": 0.5}, "pallas": {}, "xla": {}, "kivi4": {}, "bytes": {"hybrid": 1, "bf16": 4}}
    run = {"env": {"device": "d", "jax": "j", "date": "2026-12-01", "command": "x"},
           "config": {"key_bits": 4, "value_bits": 4, "scheme": "channel_key", "rho": 0.05, "window": 128},
           "cases": [case]}
    assert decode_table(run).splitlines()[-1].endswith("| 0.250 |")  # the old JSONs: no probe column
    run["read_bandwidth"] = {"best": 4.0}
    assert decode_table(run).splitlines()[-1].endswith("| 0.250 | 65% |")


def test_bf16_slots_probe_attends_like_the_bf16_decode():
    """The probe's attention is the bf16 baseline's decode attention: slots past the position are ignored, and
    with the step's token already in its slot it equals `BF16Attention.decode` (which writes it first)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from benchmarks.bf16_slots_probe import attention_step
    from models.attention import BF16Attention, DecodeContext, KVBuffer

    kq, kk, kv, kn = jax.random.split(jax.random.PRNGKey(0), 4)
    k = jax.random.normal(kk, (1, 2, 512, 64), jnp.float32)
    v = jax.random.normal(kv, (1, 2, 512, 64), jnp.float32)
    q = jax.random.normal(kq, (1, 4, 64), jnp.float32)
    pos = jnp.array([300], jnp.int32)
    out = attention_step(q, k, v, pos)
    noise = jax.random.normal(kn, (1, 2, 211, 64), jnp.float32)
    out_noisy = attention_step(q, k.at[:, :, 301:].set(noise), v.at[:, :, 301:].set(noise), pos)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(out_noisy))
    ctx = DecodeContext(positions=pos, active=jnp.array([True]))
    ref, _ = BF16Attention(f32_probs=False).decode(0, q, k[:, :, 300], v[:, :, 300], KVBuffer(k, v), ctx)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=1e-6, atol=1e-6)


def test_flush_period_is_the_ring_block_of_a_ring_cache():
    """e2e.py's flush period: the block size of caches with a window ring, None for bf16, through a mesh."""
    from benchmarks.e2e import flush_period
    from hyquant_jax import make_attention
    from hyquant_jax.sharding import ShardedAttention, make_mesh
    from models import BF16Attention

    assert flush_period(make_attention("hyquant")) == 64
    assert flush_period(make_attention("kivi4")) == 32
    assert flush_period(make_attention("uniform4")) == 16
    assert flush_period(BF16Attention()) is None
    mesh = make_mesh("data=1,model=1")
    assert flush_period(ShardedAttention(make_attention("hyquant"), mesh)) == 64
    assert flush_period(ShardedAttention(BF16Attention(), mesh)) is None


def test_e2e_stop_token_never_ends_the_timed_loops():
    """e2e.py --stop-token decodes with eos id = vocab size: the loops stop on data as in `generate`, yet run every
    step (`_decode_config` asserts the step count), for a cache with and without the nested runs of steps."""
    import jax
    import jax.numpy as jnp

    from benchmarks import e2e
    from models import init_params

    args = e2e.parse_args(["--smoke", "--sections", "b1", "--stop-token", "--steps", "3", "--reps", "1"])
    assert args.stop_token and not e2e.parse_args(["--smoke"]).stop_token
    config = e2e._model(args)
    params = init_params(jax.random.PRNGKey(0), config, jnp.bfloat16)
    for method in ("bf16", "hyquant"):
        attention, _ = e2e._attention(args, method)
        row = e2e._decode_config(args, params, config, attention, method, 64, 1)
        assert row["step_ms"] > 0
        assert isinstance(row["decode_temp_bytes"], int) and row["decode_temp_bytes"] >= 0


def test_e2e_in_place_times_decode_in_place(monkeypatch):
    """e2e.py --in-place times `generate.decode_in_place` (every call's buffers where the previous call's were),
    with and without a stop token; without the flag it times `decode`."""
    import jax
    import jax.numpy as jnp

    import hyquant_jax  # noqa: F401 - imports the module hyquant_jax.generate (the package exports a function)
    from benchmarks import e2e
    from models import init_params

    module = sys.modules["hyquant_jax.generate"]
    calls = []
    for name in ("decode", "decode_in_place"):
        monkeypatch.setattr(module, name, _counting(getattr(module, name), name, calls))
    config = e2e._model(e2e.parse_args(["--smoke"]))
    params = init_params(jax.random.PRNGKey(0), config, jnp.bfloat16)
    for flags in (["--in-place"], ["--in-place", "--stop-token"], []):
        args = e2e.parse_args(["--smoke", "--sections", "b1", *flags])
        for method in ("bf16", "hyquant"):
            calls.clear()
            attention, _ = e2e._attention(args, method)
            row = e2e._decode_config(args, params, config, attention, method, 64, 1)
            assert row["step_ms"] > 0 and isinstance(row["decode_temp_bytes"], int)
            assert calls == ["decode_in_place" if flags else "decode"] * (1 + args.reps), (flags, method, calls)


def test_e2e_prefill_chunk_times_chunked_prefill():
    """e2e.py --prefill-chunk times `generate.prefill` in chunks of that size (the row says which), for the bf16
    baseline and hyquant, each chunk's attention through XLA or (--chunk-impl pallas) the fused kernel; a chunk
    that does not divide a prompt length is an argument error."""
    import jax
    import jax.numpy as jnp

    from benchmarks import e2e
    from models import init_params

    args = e2e.parse_args(["--smoke", "--sections", "prefill", "--prefill-chunk", "128"])
    config = e2e._model(args)
    params = init_params(jax.random.PRNGKey(0), config, jnp.bfloat16)
    for method in ("bf16", "hyquant"):
        attention, _ = e2e._attention(args, method)
        assert attention.chunk_impl == "auto"  # the library's default, the XLA path off the GPU
        row = e2e._prefill_config(args, params, config, attention, method, 256)
        assert (row["chunk"], row["prefix"], row["chunk_impl"]) == (128, 256, "xla") and row["seconds"] > 0
    fused = e2e.parse_args(["--smoke", "--sections", "prefill", "--prefill-chunk", "128", "--chunk-impl", "pallas"])
    for method in ("bf16", "hyquant"):
        attention, _ = e2e._attention(fused, method)
        assert attention.chunk_impl == "pallas"
    assert e2e._prefill_config(fused, params, config, attention, "hyquant", 256)["chunk_impl"] == "pallas"
    whole = e2e.parse_args(["--smoke", "--sections", "prefill"])
    assert e2e._prefill_config(whole, params, config, e2e._attention(whole, "bf16")[0], "bf16", 256)["chunk"] == 256
    for bad in ("100", "-1"):
        with pytest.raises(SystemExit):
            e2e.parse_args(["--prefill-prefixes", "4096,32768", "--prefill-chunk", bad])


def test_chunked_prefill_attention_benchmark(tmp_path):
    """benchmarks/chunked_prefill_attention.py: the slots each way reads (a 4096-slot block per chunk end, or
    the whole prompt per chunk), and a tiny run that writes every variant's row, a baseline module and the
    fused kernel (interpret mode) included."""
    import json

    from benchmarks import chunked_prefill_attention as cpa

    assert cpa.slots_read(16384, 2048, 4096) == 2 * 4096 + 2 * 8192 + 2 * 12288 + 2 * 16384
    assert cpa.slots_read(16384, 2048, 16384) == 8 * 16384
    assert cpa.slots_read(3000, 1000, 4096) == 3 * 3000  # one block of the whole prompt
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cpa.main(["--out", str(tmp_path), "--name", "t", "--heads", "2", "--kv-heads", "1", "--head-dim", "16",
              "--prompt", "64", "--chunk", "16", "--dtype", "float32", "--reps", "1",
              "--baseline", os.path.join(root, "models", "attention.py"), "--pallas",
              "--pallas-launches", "16,16,4,2;24,16,4,2"])
    result = json.load(open(tmp_path / "t.json"))
    assert [r["variant"] for r in result["rows"]] == ["blocks", "all_slots", "baseline", "pallas",
                                                      "pallas_q16_k16_w4_s2", "pallas_q24_k16_w4_s2"]
    assert all(r["seconds"] > 0 for r in result["rows"][:-1]) and result["environment"]["jax"]
    assert "block_q must be a power of two" in result["rows"][-1]["error"]  # a failed launch: recorded, run goes on
    assert result["pallas_rel_diff"] < 1e-5  # float32: the kernel and the XLA path agree to rounding
    assert result["rows"][-2]["rel_diff_last_chunk"] < 1e-5  # each launch of the sweep is checked as well
    for bad in (["--prompt", "100", "--chunk", "16"], ["--pallas-launches", "64,64,4"]):
        with pytest.raises(SystemExit):
            cpa.main(bad)


def _counting(fn, name, calls):
    def counted(*args, **kwargs):
        calls.append(name)
        return fn(*args, **kwargs)

    counted.lower = fn.lower
    return counted


def test_e2e_workers_share_one_compilation_and_autotune_cache(monkeypatch, tmp_path):
    """e2e.py gives every worker one JAX compilation cache (a set JAX_COMPILATION_CACHE_DIR wins), and JAX
    puts XLA's per-fusion autotune cache inside it, so the methods and variants of one GPU call run the same
    GEMM picks. The last assert fails if a JAX upgrade stops doing that by default."""
    import tempfile

    import jax

    from benchmarks import e2e

    args = e2e.parse_args([])
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    env = e2e.worker_env(args)
    assert env["JAX_COMPILATION_CACHE_DIR"] == os.path.join(tempfile.gettempdir(), "hyquant_e2e_jax_cache")
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true" and env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.95"
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path))
    assert e2e.worker_env(args)["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path)
    enabled = jax.config.jax_persistent_cache_enable_xla_caches
    assert enabled == "all" or "xla_gpu_per_fusion_autotune_cache_dir" in enabled


def test_flush_cond_probe_variants():
    """The probe's variants: the same attention but without the ring flush (its once-per-step work returns
    the states untouched), then also without ring scores; the first is timed again last."""
    from benchmarks.flush_cond_probe import NoFlushAttention, variants
    from hyquant_jax import HyQuantConfig
    from hyquant_jax.model_attention import HybridAttention

    base = HybridAttention(HyQuantConfig(window=32, block_size=16, prefill_block=16), backend="reference")
    named = dict(variants(base))
    assert [n for n, _ in variants(base)] == ["hyquant", "no_flush", "no_flush_no_ring_scores", "hyquant_again"]
    assert named["hyquant"] is base and named["hyquant_again"] is base
    no_flush, no_scores = named["no_flush"], named["no_flush_no_ring_scores"]
    assert isinstance(no_flush, NoFlushAttention) and no_flush.config == base.config
    assert no_flush.backend == base.backend and no_scores.config.promote_flushed is False
    states = (object(),)
    assert no_flush.begin_decode_step(states, None) is states
    # and the decode loop calls that every step instead of counting steps until a flush that never comes
    from models.attention import steps_until_begin

    assert steps_until_begin(no_flush, states, None) is None


def test_step_ablation_probe_variants_leave_out_what_they_say():
    """The ablation probe's variants: bf16 and hybrid attentions whose decode returns q as the attention
    output, with or without storing the step's k, v; the structure variants run in one flat loop or in
    nested ones; the full hybrid variant is the library's attention itself."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from benchmarks import step_ablation_probe as probe
    from hyquant_jax import HyQuantConfig, freeze
    from hyquant_jax.model_attention import HybridAttention
    from models import KVBuffer
    from models.attention import DecodeContext, steps_until_begin

    hq = HyQuantConfig(window=32, block_size=16, prefill_block=16)
    base = HybridAttention(hq, backend="reference")
    made = {n: probe.attention_for(n, base) for n in probe.DEFAULT_VARIANTS}
    assert made["hyquant"] is base
    assert made["static"].skip == ("append", "attention", "ring_scores")
    assert steps_until_begin(made["static_flat"], (), None) is None
    assert made["static"].steps_until_begin.__func__ is HybridAttention.steps_until_begin  # nested runs
    with pytest.raises(ValueError, match="unknown variant"):
        probe.attention_for("nope", base)
    with pytest.raises(ValueError, match="unknown parts"):
        probe.AblatedHybrid(hq, skip=("kernels",))

    b, h, g, d, s = 1, 2, 2, 16, 64
    key = jax.random.split(jax.random.PRNGKey(0), 4)
    q = jax.random.normal(key[0], (b, h * g, d), jnp.float32)
    k, v = (jax.random.normal(x, (b, h, d), jnp.float32) for x in key[1:3])
    ctx = DecodeContext(jnp.array([5], jnp.int32), jnp.array([True]), prepared=True)
    buf = KVBuffer(jnp.zeros((b, h, s, d)), jnp.zeros((b, h, s, d)))
    out, written = made["bf16_write_only"].decode(0, q, k, v, buf, ctx)
    assert out is q and np.array_equal(written.k[:, :, 5], k) and float(jnp.abs(written.k).sum()) > 0
    out, kept = made["bf16_static"].decode(0, q, k, v, buf, ctx)
    assert out is q and kept is buf

    prompt = jax.random.normal(key[3], (b, h, 40, d), jnp.float32)
    cache = freeze(prompt, prompt, jnp.array([40], jnp.int32), None, hq, 64, vl=(jnp.zeros((b, h, 1), jnp.int32),
                                                                              jnp.ones((b,), jnp.int32)))
    out, same = made["static"].decode(0, q, k, v, cache, ctx)
    assert out is q and same is cache
    out, grown = made["append_only"].decode(0, q, k, v, cache, ctx)
    assert out is q and int(grown.length[0]) == 41
    full, _ = base.decode(0, q, k, v, cache, ctx)
    scored, _ = made["no_ring_scores"].decode(0, q, k, v, cache, ctx)
    np.testing.assert_array_equal(np.asarray(full), np.asarray(scored))  # same attention, no score update


def test_profile_e2e_takes_probe_variants_and_dumps_events_in_order(tmp_path):
    """profile_e2e.py profiles the step ablation probe's variants by name and writes the GPU events it read,
    times relative to the first event."""
    import gzip
    import json

    from benchmarks import e2e, profile_e2e, step_ablation_probe

    args = e2e.parse_args(["--smoke", "--sections", "b1"])
    assert isinstance(profile_e2e._attention(args, "static_flat"), step_ablation_probe.FlatAblatedHybrid)
    assert type(profile_e2e._attention(args, "bf16")).__name__ == "BF16Attention"
    with pytest.raises(ValueError, match="unknown variant"):
        profile_e2e._attention(args, "nope")
    events = [{"name": "a", "tid": 3, "ts": 100.0, "dur": 2.0}, {"name": "b", "tid": 4, "ts": 105.5, "dur": 1.0}]
    path = tmp_path / "sub" / "events.json.gz"
    profile_e2e._dump_events(events, str(path))
    got = json.load(gzip.open(path, "rt"))
    assert got["columns"] == ["name", "stream", "start_us", "dur_us"]
    assert got["events"] == [["a", 3, 0.0, 2.0], ["b", 4, 5.5, 1.0]]


def test_layer_timeline_offsets_of_each_layers_launches():
    """benchmarks/layer_timeline.py: per Mosaic launch, the offsets of the same layer's RoPE, Triton and merge
    kernels (us), whatever order the rows come in; a launch without a merge after it is left out."""
    from benchmarks import layer_timeline as lt

    layer = [[lt.ROPE, 1, 0.0, 2.0], [lt.MOSAIC, 2, 3.0, 20.0], [lt.TRITON, 3, 14.0, 18.0],
             [lt.MERGE, 1, 32.5, 3.0], ["gemm", 1, 36.0, 10.0]]
    events = [[n, s, t + 100.0 * k, d] for k in range(3) for n, s, t, d in layer]
    events.append([lt.MOSAIC, 2, 400.0, 5.0])  # no merge after it
    rows = lt.layer_offsets(events[::-1])
    assert len(rows) == 3
    assert rows[0] == {"rope_end_to_mosaic": 1.0, "mosaic_us": 20.0, "triton_start_after_mosaic_start": 11.0,
                       "triton_us": 18.0, "triton_end_after_mosaic_end": 9.0, "merge_gap": 0.5}
    assert lt.summary(rows)["layers"] == 3 and lt.summary([]) == {"layers": 0}


def test_mosaic_ablation_variants_apply_to_the_kernel_and_lower(tmp_path):
    """Every ablation of benchmarks/mosaic_ablation_variants.py still finds what it edits in the kernel's module
    (it raises otherwise), and the variants that restructure the loop or the copies lower for CUDA."""
    import jax

    from benchmarks import mosaic_ablation_variants as mav
    from benchmarks.common import load_module
    from tests.test_decode_mgpu import kernel_args, random_case

    with open(mav.SOURCE) as f:
        source = f.read()
    built = mav.variants(source)
    assert {"copy_only", "wide", "pv_overlap", "keys_const", "stages4"} <= set(built)
    assert all(text != source for text in built.values())
    args = kernel_args(random_case(1, 2, 6, [5], seed=0))
    for name in ("copy_only", "wide", "pv_overlap", "tiles_const"):
        path = tmp_path / f"{name}.py"
        path.write_text(built[name])
        mod = load_module(str(path), "ablation_" + name)
        fn = jax.jit(lambda *a, mod=mod: mod.low_bit_splits(*a, num_splits=2))
        assert "mosaic_gpu" in fn.trace(*args).lower(lowering_platforms=("cuda",)).as_text(), name


def test_decode_memory_lists_large_buffers_outside_the_loops():
    """benchmarks/decode_memory.py: the ENTRY computation's non-parameter results of at least min_bytes, with
    their sizes; parameters, bitcasts, tuples and the loop bodies' instructions are not listed."""
    from benchmarks.decode_memory import large_entry_buffers

    hlo = """HloModule m

%body (p: (s32[], bf16[4096,6144])) -> (s32[], bf16[4096,6144]) {
  %big = bf16[4096,6144]{1,0} copy(%x)
}

ENTRY %main (a: bf16[4096,8,6,128], b: s32[]) -> f32[1] {
  %a = bf16[4096,8,6,128]{3,2,1,0} parameter(0)
  %slice.1 = bf16[4096,8,4,128]{3,2,1,0} slice(%a), slice={[0:4096], [0:8], [0:4], [0:128]}
  %bitcast.2 = bf16[4096,6144]{1,0} bitcast(%a)
  %small = f32[16,16]{1,0} add(%c, %d)
  ROOT %wrapped_convert.3 = f32[4096,6144]{1,0} fusion(%a), kind=kLoop, calls=%fused
}
"""
    rows = large_entry_buffers(hlo, 1 << 20)
    assert [(r["name"], r["op"], r["bytes"]) for r in rows] == [
        ("slice.1", "slice", 4096 * 8 * 4 * 128 * 2), ("wrapped_convert.3", "fusion", 4096 * 6144 * 4)]
    assert large_entry_buffers(hlo, 1 << 30) == []


def test_e2e_mosaic_blocks_per_sm_reaches_the_hybrid_attention():
    from benchmarks import e2e
    from hyquant_jax.decode_kernel import DecodeTuning

    attention, _ = e2e._attention(e2e.parse_args(["--smoke", "--mosaic-blocks-per-sm", "1"]), "hyquant")
    assert attention.decode_tuning == DecodeTuning(mosaic_blocks_per_sm=1)
    attention, _ = e2e._attention(e2e.parse_args(["--smoke", "--mosaic-splits", "16"]), "hyquant")
    assert attention.decode_tuning == DecodeTuning(mosaic_splits=16)
    attention, _ = e2e._attention(e2e.parse_args(["--smoke", "--mosaic-pages-per-copy", "4"]), "hyquant")
    assert attention.decode_tuning == DecodeTuning(mosaic_pages_per_copy=4)
    attention, _ = e2e._attention(e2e.parse_args(["--smoke", "--mosaic-wide"]), "hyquant")
    assert attention.decode_tuning == DecodeTuning(mosaic_wide=True)
    attention, _ = e2e._attention(e2e.parse_args(["--smoke", "--mosaic-interleave"]), "hyquant")
    assert attention.decode_tuning == DecodeTuning(mosaic_interleave=True)
    attention, _ = e2e._attention(e2e.parse_args(["--smoke"]), "hyquant")
    assert attention.decode_tuning is None
    for flag in ("--mosaic-splits", "--mosaic-blocks-per-sm", "--mosaic-pages-per-copy"):
        with pytest.raises(SystemExit):
            e2e.parse_args(["--smoke", flag, "0"])


def test_stream_probe_threads_reference():
    """stream_probe.threads_reference (the check of the thread-load configs on the GPU) against a direct loop
    over threads, pages and 16-byte loads, on a split layout with an empty split."""
    import numpy as np

    from benchmarks import stream_probe as sp

    rng = np.random.default_rng(0)
    b, h, pages, splits = 1, 2, 5, 4  # 2 pages a split: the last split is empty
    kc, vc = (rng.integers(0, 256, (b, h, pages * sp.PAGE, sp.BYTES), dtype=np.uint8) for _ in range(2))
    want = np.zeros((b, h, splits, 128), np.float32)
    per = -(-pages // splits)
    for hh in range(h):
        flat = [x[0, hh].reshape(-1) for x in (kc, vc)]
        for s in range(splits):
            for t in range(128):
                acc = 0
                for page in range(s * per, min(s * per + per, pages)):
                    for arr in flat:
                        for m in range(2):
                            start = page * 4096 + 16 * t + 2048 * m
                            for word in arr[start:start + 16].view("<u4"):
                                acc ^= int(word)
                want[0, hh, s, t] = acc & 255
    got = sp.threads_reference(kc, vc, splits)
    np.testing.assert_array_equal(got, want)
    assert np.any(got[:, :, :3] != 0) and not np.any(got[:, :, 3])
    # interleaved: split s takes pages s, s + 4, ...: pages {0, 4}, {1}, {2}, {3}
    each = [sp.threads_reference(kc[:, :, p * sp.PAGE:(p + 1) * sp.PAGE], vc[:, :, p * sp.PAGE:(p + 1) * sp.PAGE], 1)
            for p in range(pages)]
    got = sp.threads_reference(kc, vc, splits, interleave=True)
    np.testing.assert_array_equal(got[:, :, 0:1], (each[0].astype(np.uint8) ^ each[4].astype(np.uint8)))
    for s in range(1, 4):
        np.testing.assert_array_equal(got[:, :, s:s + 1], each[s])



def test_l2_prefetch_probe_lowers():
    """benchmarks/l2_prefetch_probe.py: busy phases parse (bad ones name the rule), the prefetch and spin
    kernels lower for CUDA, the prefetch names the shape it needs, and each variant's stages lower in one
    program with the kernels it should have."""
    import jax
    import jax.numpy as jnp

    from benchmarks import l2_prefetch_probe as lp

    assert lp.parse_busy("spin5") == ("spin", 5.0) and lp.parse_busy("read32") == ("read", 32.0)
    assert lp.parse_busy("none") == ("none", 0.0)
    for bad in ("spin", "read-1", "wait5", "spin0"):
        with pytest.raises(ValueError, match="busy phase"):
            lp.parse_busy(bad)
    sd = jax.ShapeDtypeStruct
    w, a = sd((512, 768), jnp.bfloat16), sd((8, 128), jnp.float32)
    with pytest.raises(ValueError, match="multiples of 256"):
        lp.prefetch_l2(jnp.zeros((512, 100), jnp.bfloat16), jnp.zeros((8, 128), jnp.float32), blocks=8)
    x, flush = sd((1, 512), jnp.bfloat16), sd((1024,), jnp.bfloat16)
    for busy, prefetch, kernels in (("none", False, 0), ("none", True, 1), ("spin3", True, 2), ("spin3", False, 1),
                                    ("read2", True, 1)):
        fn = jax.jit(lp.stages(busy, prefetch=prefetch, gemv=True, spin_iters_per_us=100, blocks=8))
        text = fn.trace(a, x, w, flush, flush).lower(lowering_platforms=("cuda",)).as_text()
        assert text.count("custom_call @mosaic_gpu_v") == kernels, (busy, prefetch)


def test_stream_probe_configs_lower_and_slopes():
    """benchmarks/stream_probe.py: config names parse (bad ones name the rule), the copy-only kernel lowers for
    CUDA in the kernel's shape and in a wide multi-page one, and the slope between two B=1 contexts removes
    the fixed cost."""
    import functools

    import jax
    import jax.numpy as jnp

    from benchmarks import stream_probe as sp

    assert sp.parse_config("w256_p4_s3") == dict(width=256, pages=4, stages=3, small=True, interleave=False)
    assert sp.parse_config("w64_p1_s2_codes")["small"] is False
    assert sp.parse_config("w64_p1_s2_codes_i") == dict(width=64, pages=1, stages=2, small=False, interleave=True)
    assert sp.parse_config("t4") == dict(depth=4, interleave=False)
    assert sp.parse_config("t4_i") == dict(depth=4, interleave=True)
    for bad in ("w96_p1_s2", "w64_p8_s2", "p1_w64_s2", "w64_p1", "t0", "t9", "tx", "t4_j", "w64_p1_s2_i_codes"):
        with pytest.raises(ValueError, match="config"):
            sp.parse_config(bad)
    assert sp.PAGE_BYTES == 8960
    ops = sp.operands(1, 2, 1024)
    q = jnp.zeros((16,), jnp.float32)
    for name in ("w64_p1_s2", "w256_p4_s3", "w128_p2_s2_codes", "w64_p1_s2_i", "w256_p4_s2_codes_i"):
        fn = jax.jit(functools.partial(sp.stream, splits=2, **sp.parse_config(name)))
        assert "mosaic_gpu" in fn.trace(q, *ops).lower(lowering_platforms=("cuda",)).as_text(), name
    for depth, interleave in ((1, False), (3, False), (3, True)):  # 3 does not divide the 8 pages of a split
        fn = jax.jit(functools.partial(sp.stream_threads, depth=depth, splits=2, interleave=interleave))
        assert "mosaic_gpu" in fn.trace(q, ops[0], ops[1]).lower(lowering_platforms=("cuda",)).as_text(), depth
    with pytest.raises(ValueError, match="must divide"):
        sp.stream(q, *sp.operands(1, 2, 192), width=64, pages=2, stages=2, small=True, splits=1)
    # 1 ms for 1e9 bytes, 2 ms for 4e9: 3e9 bytes in 1 ms = 3 TB/s, and 1 ms - 1e9 / 3e12 s = 0.667 ms fixed
    rows = [{"config": "a", "batch": 1, "context": 1, "bytes": 1e9, "ms": 1.0},
            {"config": "a", "batch": 1, "context": 4, "bytes": 4e9, "ms": 2.0},
            {"config": "a", "batch": 16, "context": 1, "bytes": 9e9, "ms": 9.0},
            {"config": "b", "batch": 1, "context": 1, "bytes": 1e9, "error": "x"}]
    slopes = sp.fixed_cost_slopes(rows)
    assert set(slopes) == {"a"} and slopes["a"]["contexts"] == [1, 4]
    assert abs(slopes["a"]["tb_s"] - 3.0) < 1e-9 and abs(slopes["a"]["fixed_us"] - 1000 / 1.5) < 1e-6
