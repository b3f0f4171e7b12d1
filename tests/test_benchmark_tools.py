"""Helpers of the benchmark scripts that turn arguments and results into what they report."""

import os
import sys

import pytest

from benchmarks.cases import DECODE_CASES
from benchmarks.decode_kernel import parse_tunings, select_cases
from benchmarks.prefill_kernel import summarize
from benchmarks.report import e2e_prefill_table, prefill_table
from hyquant_jax.decode_launch import DecodeTuning


def test_parse_tunings_fields_and_default_items():
    first, default, third = parse_tunings("warps=1,pages=2,stages=3;;convert=magic,n_low=8")
    assert (first.num_warps, first.pages_per_tile, first.num_stages) == (1, 2, 3)
    assert (default.num_warps, default.num_stages, default.pages_per_tile, default.n_low) == (None,) * 4
    assert (third.convert, third.n_low) == ("magic", 8)
    assert all(isinstance(t, DecodeTuning) for t in (first, default, third))


def test_parse_tunings_mosaic_splits():
    (t,) = parse_tunings("mosaic_splits=5,mosaic_stages=3")
    assert (t.mosaic_splits, t.mosaic_stages, t.mosaic_blocks_per_sm) == (5, 3, 2)
    (t,) = parse_tunings("mosaic_per_sm=4,low=mosaic")
    assert (t.mosaic_blocks_per_sm, t.low_bit, t.mosaic_splits) == (4, "mosaic", None)


def test_select_cases_by_name_and_by_shape():
    assert select_cases("") == DECODE_CASES
    assert [c[0] for c in select_cases("B1 1K,B16")] == ["qwen3-8b B1 1K", "qwen3-8b B16 32K"]
    assert select_cases("B1 32K,B25 32K")[1] == ("qwen3-8b B25 32K", 25, 32, 8, 128, 32768)
    assert select_cases("B16 32K") == [c for c in DECODE_CASES if c[0] == "qwen3-8b B16 32K"]  # a known case wins
    for bad in ("B25", "B0 32K", "llama B1"):
        with pytest.raises(ValueError, match="--cases"):
            select_cases(bad)


@pytest.mark.parametrize("spec", ["warp=1", "warps=", "warps", "mosaic_ppc=4", "mosaic_wide=1", "mosaic_il=1"])
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


def test_flush_period_is_the_ring_block_of_a_ring_cache():
    """benchmarks.e2e's flush period: the block size of caches with a window ring, None for bf16, through a mesh."""
    from benchmarks.e2e.decode import flush_period
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
    """benchmarks.e2e --stop-token decodes with eos id = vocab size: the loops stop on data as in `generate`, yet
    run every step (`decode.decode_config` asserts the step count), for a cache with and without the nested runs of
    steps."""
    import jax
    import jax.numpy as jnp

    from benchmarks.e2e import decode, options
    from models import init_model

    args = options.parse_args(["--smoke", "--sections", "b1", "--stop-token", "--steps", "3", "--reps", "1"])
    assert args.stop_token and not options.parse_args(["--smoke"]).stop_token
    config = options.model_config(args)
    model = init_model(jax.random.PRNGKey(0), config, jnp.bfloat16)
    for method in ("bf16", "hyquant"):
        attention, _ = options.method_attention(args, method)
        row = decode.decode_config(args, model, attention, method, 64, 1)
        assert row["step_ms"] > 0
        assert isinstance(row["decode_temp_bytes"], int) and row["decode_temp_bytes"] >= 0


def test_e2e_in_place_times_decode_in_place(monkeypatch):
    """benchmarks.e2e --in-place times `generate.decode_in_place` (every call's buffers where the previous call's were),
    with and without a stop token; without the flag it times `decode`."""
    import jax
    import jax.numpy as jnp

    import hyquant_jax  # noqa: F401 - imports the module hyquant_jax.generate (the package exports a function)
    from benchmarks.e2e import decode, options
    from models import init_model

    module = sys.modules["hyquant_jax.generate"]
    calls = []
    for name in ("decode", "decode_in_place"):
        monkeypatch.setattr(module, name, _counting(getattr(module, name), name, calls))
    config = options.model_config(options.parse_args(["--smoke"]))
    model = init_model(jax.random.PRNGKey(0), config, jnp.bfloat16)
    for flags in (["--in-place"], ["--in-place", "--stop-token"], []):
        args = options.parse_args(["--smoke", "--sections", "b1", *flags])
        for method in ("bf16", "hyquant"):
            calls.clear()
            attention, _ = options.method_attention(args, method)
            row = decode.decode_config(args, model, attention, method, 64, 1)
            assert row["step_ms"] > 0 and isinstance(row["decode_temp_bytes"], int)
            assert calls == ["decode_in_place" if flags else "decode"] * (1 + args.reps), (flags, method, calls)


def test_e2e_prefill_chunk_times_chunked_prefill():
    """benchmarks.e2e --prefill-chunk times `generate.prefill` in chunks of that size (the row says which), for the bf16
    baseline and hyquant, each chunk's attention through XLA or (--chunk-impl triton) the fused kernel; a chunk
    that does not divide a prompt length is an argument error."""
    import jax
    import jax.numpy as jnp

    from benchmarks.e2e import options, prefill
    from models import init_model

    args = options.parse_args(["--smoke", "--sections", "prefill", "--prefill-chunk", "128"])
    config = options.model_config(args)
    model = init_model(jax.random.PRNGKey(0), config, jnp.bfloat16)
    for method in ("bf16", "hyquant"):
        attention, _ = options.method_attention(args, method)
        assert attention.chunk_impl == "auto"  # the library's default, the XLA path off the GPU
        row = prefill.prefill_config(args, model, attention, method, 256)
        assert (row["chunk"], row["prefix"], row["chunk_impl"]) == (128, 256, "xla") and row["seconds"] > 0
    fused = options.parse_args(["--smoke", "--sections", "prefill", "--prefill-chunk", "128", "--chunk-impl", "triton"])
    for method in ("bf16", "hyquant"):
        attention, _ = options.method_attention(fused, method)
        assert attention.chunk_impl == "triton"
    assert prefill.prefill_config(fused, model, attention, "hyquant", 256)["chunk_impl"] == "triton"
    whole = options.parse_args(["--smoke", "--sections", "prefill"])
    assert prefill.prefill_config(whole, model, options.method_attention(whole, "bf16")[0], "bf16", 256)["chunk"] == 256
    for bad in ("100", "-1"):
        with pytest.raises(SystemExit):
            options.parse_args(["--prefill-prefixes", "4096,32768", "--prefill-chunk", bad])


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
              "--baseline", os.path.join(root, "models", "attention.py"), "--triton",
              "--triton-launches", "16,16,4,2;24,16,4,2"])
    result = json.load(open(tmp_path / "t.json"))
    assert [r["variant"] for r in result["rows"]] == ["blocks", "all_slots", "baseline", "triton",
                                                      "triton_q16_k16_w4_s2", "triton_q24_k16_w4_s2"]
    assert all(r["seconds"] > 0 for r in result["rows"][:-1]) and result["environment"]["jax"]
    assert "block_q must be a power of two" in result["rows"][-1]["error"]  # a failed launch: recorded, run goes on
    assert result["triton_rel_diff"] < 1e-5  # float32: the kernel and the XLA path agree to rounding
    assert result["rows"][-2]["rel_diff_last_chunk"] < 1e-5  # each launch of the sweep is checked as well
    for bad in (["--prompt", "100", "--chunk", "16"], ["--triton-launches", "64,64,4"]):
        with pytest.raises(SystemExit):
            cpa.main(bad)


def _counting(fn, name, calls):
    def counted(*args, **kwargs):
        calls.append(name)
        return fn(*args, **kwargs)

    counted.lower = fn.lower
    return counted


def test_e2e_workers_share_one_compilation_and_autotune_cache(monkeypatch, tmp_path):
    """benchmarks.e2e gives every worker one JAX compilation cache (a set JAX_COMPILATION_CACHE_DIR wins), and JAX
    puts XLA's per-fusion autotune cache inside it, so the methods and variants of one GPU call run the same
    GEMM picks. The last assert fails if a JAX upgrade stops doing that by default."""
    import tempfile

    import jax

    from benchmarks.e2e import options, run

    args = options.parse_args([])
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    env = run.worker_env(args)
    assert env["JAX_COMPILATION_CACHE_DIR"] == os.path.join(tempfile.gettempdir(), "hyquant_e2e_jax_cache")
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true" and env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.95"
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path))
    assert run.worker_env(args)["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path)
    enabled = jax.config.jax_persistent_cache_enable_xla_caches
    assert enabled == "all" or "xla_gpu_per_fusion_autotune_cache_dir" in enabled


def test_profile_e2e_takes_methods_and_dumps_events_in_order(tmp_path):
    """profile_e2e.py profiles benchmarks.e2e's methods by name and writes the GPU events it read, times relative to
    the first event."""
    import gzip
    import json

    from benchmarks import profile_e2e
    from benchmarks.e2e import options

    args = options.parse_args(["--smoke", "--sections", "b1"])
    assert type(profile_e2e._attention(args, "bf16")).__name__ == "BF16Attention"
    assert type(profile_e2e._attention(args, "hyquant")).__name__ == "HybridAttention"
    with pytest.raises(ValueError, match="unknown method"):
        profile_e2e._attention(args, "nope")
    events = [{"name": "a", "tid": 3, "ts": 100.0, "dur": 2.0}, {"name": "b", "tid": 4, "ts": 105.5, "dur": 1.0}]
    path = tmp_path / "sub" / "events.json.gz"
    profile_e2e._dump_events(events, str(path))
    got = json.load(gzip.open(path, "rt"))
    assert got["columns"] == ["name", "stream", "start_us", "dur_us"]
    assert got["events"] == [["a", 3, 0.0, 2.0], ["b", 4, 5.5, 1.0]]


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
    from benchmarks.e2e import options
    from hyquant_jax.decode_launch import DecodeTuning

    attention, _ = options.method_attention(options.parse_args(["--smoke", "--mosaic-blocks-per-sm", "1"]), "hyquant")
    assert attention.decode_tuning == DecodeTuning(mosaic_blocks_per_sm=1)
    attention, _ = options.method_attention(options.parse_args(["--smoke", "--mosaic-splits", "16"]), "hyquant")
    assert attention.decode_tuning == DecodeTuning(mosaic_splits=16)
    attention, _ = options.method_attention(options.parse_args(["--smoke"]), "hyquant")
    assert attention.decode_tuning is None
    for args in (["--mosaic-splits", "0"], ["--mosaic-blocks-per-sm", "0"], ["--mosaic-pages-per-copy", "4"],
                 ["--mosaic-wide"], ["--mosaic-interleave"]):  # out of range, or a removed option
        with pytest.raises(SystemExit):
            options.parse_args(["--smoke", *args])




def test_results_are_named_by_device(tmp_path):
    """Canonical results files are `<benchmark>_<device>`: the device from the run, never a fixed name; a smoke
    run writes into a temporary folder, not into benchmarks/results."""
    from benchmarks.common import RESULTS, default_name, output_folder, slug

    assert slug("NVIDIA H100 80GB HBM3") == "h100" and slug("NVIDIA H200") == "h200"
    assert slug("NVIDIA GH200 480GB") == "gh200" and slug("NVIDIA A100-SXM4-80GB") == "a100"
    assert slug("NVIDIA H200", count=2) == "h200x2" and slug("cpu", "cpu") == "cpu"
    assert slug("Some New GPU 9") == "some_new_gpu_9"
    assert default_name("decode_kernel") == "decode_kernel_cpu"  # this machine
    out = str(tmp_path / "x")
    assert output_folder(None) == RESULTS and output_folder(out) == out and output_folder(None, smoke=True) != RESULTS
    assert os.path.isdir(out)  # --out is created before the run


def test_out_that_cannot_be_written_fails_before_the_run(capsys):
    from benchmarks.common import output_folder

    with pytest.raises(SystemExit) as e:
        output_folder("/proc/results")
    assert e.value.code == 2
    assert capsys.readouterr().err.startswith("error: --out /proc/results: cannot write a file there")


def test_write_json_that_fails_prints_the_record(tmp_path, capsys, monkeypatch):
    import json

    from benchmarks.common import write_json

    assert write_json(str(tmp_path / "a" / "r.json"), {"x": 1}) and json.loads((tmp_path / "a" / "r.json").read_text())
    def full(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    capsys.readouterr()
    assert not write_json(str(tmp_path / "b.json"), {"x": 2})
    out, err = capsys.readouterr()
    assert json.loads(out) == {"x": 2} and "could not write --out" in err and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]  # no temporary file left


def test_ctrl_c_in_a_benchmark_is_one_line(capsys):
    from benchmarks.common import run_script

    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as e:
        run_script(interrupted)
    assert e.value.code == 130 and capsys.readouterr().err == "interrupted\n"
    for returned, code in ((None, 0), ({"result": 1}, 0), (3, 3)):  # a returned int is the exit code
        with pytest.raises(SystemExit) as e:
            run_script(lambda returned=returned: returned)
        assert e.value.code == code


def test_e2e_combine_names_the_device_and_records_each_part(tmp_path):
    import json

    from benchmarks.e2e import options, run

    def part(section, command, device="NVIDIA H100 80GB HBM3"):
        rows = [{"method": "bf16", "prefix": 32768, "batch": 1, "step_ms": 7.0, "tokens_per_s": 142.9, "floor_ms": 6.0,
                 "floor_over_step": 0.86, "speedup_vs_bf16": 1.0, "peak_bytes": 2**34}]
        return {"environment": {"device": device, "platform": "gpu", "command": command, "date": "2026-12-06"},
                "mesh": None, "b1": rows if section == "b1" else [], "batch": rows if section == "batch" else [],
                "prefill": []}

    paths = []
    for section in ("b1", "batch"):
        paths.append(tmp_path / f"{section}.json")
        paths[-1].write_text(json.dumps(part(section, f"benchmarks/e2e.py --sections {section}")))
    args = options.parse_args(["--combine", *map(str, paths), "--out", str(tmp_path), "--no-plot"])
    run.combine(args)
    merged = json.loads((tmp_path / "e2e_h100.json").read_text())
    assert [c["command"] for c in merged["combined_from"]] == ["benchmarks/e2e.py --sections b1",
                                                               "benchmarks/e2e.py --sections batch"]
    assert len(merged["b1"]) == len(merged["batch"]) == 1
    mesh = dict(part("b1", "x"), mesh={"data": 1, "model": 2})
    assert run.default_name(mesh) == "e2e_h100x2"


def test_ab_record_pairs_the_two_trees_rows(tmp_path):
    """report.py --ab: the decode kernel's hybrid times and the e2e step times of both trees, matched by case."""
    import json

    from benchmarks.report import ab_record, ab_table

    env = {"device": "NVIDIA H100 80GB HBM3", "jax": "0.11.2", "date": "2026-12-06", "command": "x"}
    for tag, scale in (("base", 1.0), ("new", 1.02)):
        (tmp_path / tag).mkdir()
        dk = {"env": env, "cases": [{"case": "qwen3-8b B1 32K", "hybrid": {"loop_ms": 0.04 * scale}},
                                    {"case": "qwen3-8b B16 32K", "hybrid": {"error": "oom"}}]}
        e2e = {"environment": env, "b1": [{"method": "hyquant", "prefix": 32768, "batch": 1, "step_ms": 6.5 * scale},
                                          {"method": "bf16", "prefix": 32768, "batch": 1, "error": "x"}],
               "batch": []}
        (tmp_path / tag / "decode_kernel.json").write_text(json.dumps(dk))
        (tmp_path / tag / "e2e_b1.json").write_text(json.dumps(e2e))
    record = ab_record(str(tmp_path / "base"), str(tmp_path / "new"), "archive/experiments-2026-12")
    assert [(r["benchmark"], r["what"]) for r in record["rows"]] == [("decode_kernel", "hybrid qwen3-8b B1 32K"),
                                                                     ("e2e", "hyquant B1 32768")]
    assert "| 1.020 |" in ab_table(record)


def test_serve_benchmark_replays_the_workload_and_records_each_method(tmp_path):
    """benchmarks/serve.py: the seeded workload (lengths in range, Poisson times from 0), a tiny bf16 run whose row
    counts every requested token, and its argument checks."""
    import json

    from benchmarks import serve

    args = serve.parse_args(["--requests", "50", "--prompt-lengths", "10:20", "--rate", "5", "--context", "64",
                             "--max-tokens", "8"])
    arrivals = serve.workload(args, 100)
    assert arrivals == serve.workload(args, 100) and len(arrivals) == 50 and arrivals[0].at == 0
    assert all(10 <= len(a.prompt) <= 20 and max(a.prompt) < 100 for a in arrivals)
    assert all(a.at <= b.at for a, b in zip(arrivals, arrivals[1:])) and 4 < 50 / arrivals[-1].at < 7
    assert serve.main(["--smoke", "--methods", "bf16", "--requests", "3", "--prompt-lengths", "20:40", "--out",
                       str(tmp_path), "--no-plot"]) == 0
    (path,) = tmp_path.glob("serve_*.json")
    (row,) = json.load(open(path))["rows"]
    assert row["method"] == "bf16" and row["requests"] == 3 and row["output_tokens"] == 3 * 8
    assert row["tokens_per_s"] > 0 and row["ttft_s"]["p50"] > 0 and row["slot_bytes"] * 2 == row["cache_bytes"]
    for bad in (["--methods", "fp4"], ["--prompt-lengths", "9:x"], ["--prompt-lengths", "100:5000", "--context",
                                                                     "4096"], ["--requests", "0"]):
        with pytest.raises(SystemExit):
            serve.parse_args(bad)
