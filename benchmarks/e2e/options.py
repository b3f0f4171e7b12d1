"""The command line of the end-to-end benchmark: its flags (the description is the package's docstring),
the model shape and each method's attention."""

from __future__ import annotations

import argparse
import dataclasses

from benchmarks.cases import MODELS, SMOKE_MODEL

METHODS = ("bf16", "hyquant", "kivi4", "kivi2", "uniform4")


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv=None):
    import benchmarks.e2e

    p = argparse.ArgumentParser(prog="python -m benchmarks.e2e", description=benchmarks.e2e.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="folder for the JSON and the plot (default: benchmarks/results; a "
                                                 "temporary folder with --smoke)")
    p.add_argument("--name", default=None, help="file stem of the JSON and PNG (default: e2e_<device>, e.g. e2e_h100, "
                                                "e2e_h200x2 with a mesh of two)")
    p.add_argument("--sections", default="b1,batch,prefill", help="comma list of b1, batch, prefill")
    p.add_argument("--methods", default="bf16,hyquant,kivi4", help=f"comma list from {METHODS}")
    p.add_argument("--prefixes", default="1024,2048,4096,8192,16384,32768,131072",
                   help="cached tokens per sequence for the B=1 decode section")
    p.add_argument("--batch-prefix", type=int, default=32768, help="cached tokens per sequence of the batch sweep")
    p.add_argument("--batches", default="1,4,8,16,32,48,64",
                   help="batch sizes of the sweep, ascending; with --until-oom it goes on past the last one in "
                        "steps of the last gap until out of memory or --max-batch")
    p.add_argument("--until-oom", action=argparse.BooleanOptionalAction, default=True,
                   help="continue the batch sweep past --batches until out of memory")
    p.add_argument("--max-batch", type=int, default=512, help="stop the batch sweep here even without OOM")
    p.add_argument("--prefill-prefixes", default="4096,32768", help="prompt lengths of the prefill section")
    p.add_argument("--prefill-chunk", type=int, default=0,
                   help="prefill section: run the prompt in chunks of this many tokens (chunked prefill, "
                        "`generate(prefill_chunk=...)`; must divide every --prefill-prefixes); 0: the whole prompt "
                        "in one call")
    p.add_argument("--chunk-impl", default="auto", choices=("auto", "xla", "triton"),
                   help="chunked prefill's attention for bf16 and hyquant (their `chunk_impl`): XLA's online "
                        "softmax over key blocks, the fused Pallas kernel (`pallas_kernels/prefix.py`), or auto "
                        "(the library's default: the kernel on a GPU); rows record the one that ran")
    p.add_argument("--steps", type=int, default=64, help="decode steps per timed loop")
    p.add_argument("--reps", type=int, default=3, help="timed loops per config (median)")
    p.add_argument("--model", default="qwen3-8b", choices=sorted(MODELS),
                   help="model shape (random bf16 weights): qwen3-8b (36 layers) or qwen3-32b (64 layers, hidden 5120, "
                        "64/8 heads, FFN 25600)")
    p.add_argument("--mesh", default=None, metavar="data=D,model=M",
                   help="shard over D*M GPUs: batch over D, weights and KV heads over M (M must divide the 8 KV heads)")
    p.add_argument("--layers", type=int, default=None,
                   help="override the layer count (faster compiles; results then are not the full model's)")
    from hyquant_jax.backends import BACKENDS  # jax import only: no device is initialised

    p.add_argument("--backend", default="auto", choices=BACKENDS,
                   help="HyQuant decode backend (auto: Pallas on GPU; mosaic decodes as pallas)")
    p.add_argument("--prefill-backend", default=None, choices=BACKENDS,
                   help="HyQuant prefill backend (default: --backend; mosaic needs a --prefill-block multiple of 64)")
    p.add_argument("--prefill-block", type=int, default=64, help="HyQuantConfig.prefill_block (must divide --window)")
    p.add_argument("--mosaic-blocks-per-sm", type=int, default=None,
                   help="HyQuant decode: the Mosaic low-bit kernel's blocks per multiprocessor (DecodeTuning; "
                        "default: the library's, 2)")
    p.add_argument("--mosaic-splits", type=int, default=None,
                   help="HyQuant decode: a fixed split count per (sequence, KV head) for the Mosaic low-bit kernel "
                        "(DecodeTuning.mosaic_splits, overrides --mosaic-blocks-per-sm; default: "
                        "decode_launch.mosaic_splits)")
    p.add_argument("--key-bits", type=int, default=4)
    p.add_argument("--value-bits", type=int, default=4)
    from hyquant_jax.config import SCHEMES, HyQuantConfig  # jax import only: no device is initialised

    p.add_argument("--scheme", default=HyQuantConfig.scheme, choices=SCHEMES)
    p.add_argument("--window", type=int, default=128)
    p.add_argument("--rho", type=float, default=0.05)
    p.add_argument("--bandwidth-tbs", type=float, default=4.8, help="HBM bandwidth for the byte floor (H200: 4.8)")
    p.add_argument("--layer-kernels", default="auto", choices=("auto", "xla"),
                   help="decode steps' norms and RoPE: Pallas kernels where they fit (auto) or XLA ops")
    p.add_argument("--stop-token", action="store_true",
                   help="decode with a stop token that never occurs (id = vocab size) as `generate` decodes with "
                        "EOS ids: the loops then stop on data, so XLA does not know their trip count")
    p.add_argument("--fresh-states", action="store_true",
                   help="give every timed loop a copy of the states in new buffers (the previous ones kept "
                        "alive), as each request's prefill gives `generate` new caches: XLA then updates its "
                        "CUDA graphs for new addresses in every timed call")
    p.add_argument("--in-place", action="store_true",
                   help="time `generate.decode_in_place` (first, lengths and the previous call's tokens and step "
                        "count donated too) instead of `decode`: every buffer of a call, inputs and outputs, then "
                        "stays where the previous call's was, as a server keeping its decode buffers would")
    p.add_argument("--mem-fraction", default="0.95", help="XLA_PYTHON_CLIENT_MEM_FRACTION of the workers")
    p.add_argument("--smoke", action="store_true", help="tiny model and prefixes: a CPU check that the script runs")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--combine", nargs="+", metavar="JSON", default=None,
                   help="run nothing: merge the rows of these result files (of earlier, partial runs) into "
                        "OUT/NAME.json and redraw the plot")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # internal: JSON spec of one worker
    args = p.parse_args(argv)
    if args.smoke:
        args.prefixes, args.batch_prefix, args.batches = "256,512", 512, "1,2"
        args.prefill_prefixes, args.steps, args.reps, args.until_oom = "256", 4, 1, False
    for m in args.methods.split(","):
        if m not in METHODS:
            p.error(f"--methods: unknown method {m!r}; choose from {METHODS}")
    for s in args.sections.split(","):
        if s not in ("b1", "batch", "prefill"):
            p.error(f"--sections: unknown section {s!r}")
    bad = [n for n in ints(args.prefill_prefixes) if args.prefill_chunk and n % args.prefill_chunk]
    if args.prefill_chunk < 0 or bad:
        p.error(f"--prefill-chunk must be 0 or divide every --prefill-prefixes, got {args.prefill_chunk} for {bad}")
    for flag, value in (("--mosaic-blocks-per-sm", args.mosaic_blocks_per_sm), ("--mosaic-splits", args.mosaic_splits)):
        if value is not None and value < 1:
            p.error(f"{flag} must be >= 1, got {value}")
    if args.mesh:
        from hyquant_jax.sharding import check_model_fits, parse_mesh_shape  # no device is initialised

        try:
            check_model_fits(model_config(args), parse_mesh_shape(args.mesh)["model"])
        except ValueError as e:
            p.error(f"--mesh: {e}")
    return args


def model_config(args):
    from models import ModelConfig

    shape = dict(SMOKE_MODEL if args.smoke else MODELS[args.model])
    if args.layers:
        shape["num_layers"] = args.layers
    return ModelConfig(**shape)


def method_attention(args, method):
    import jax.numpy as jnp

    from hyquant_jax import HyQuantConfig, make_attention

    hq = HyQuantConfig(key_bits=args.key_bits, value_bits=args.value_bits, scheme=args.scheme, window=args.window,
                       rho=args.rho, prefill_block=args.prefill_block)
    tuning = None
    knobs = dict(mosaic_blocks_per_sm=args.mosaic_blocks_per_sm, mosaic_splits=args.mosaic_splits)
    if any(v is not None for v in knobs.values()):
        from hyquant_jax.decode_launch import DecodeTuning

        tuning = DecodeTuning(**{k: v for k, v in knobs.items() if v is not None})
    attention = make_attention(method, hq, backend=args.backend, prefill_backend=args.prefill_backend,
                               cache_dtype=jnp.bfloat16, decode_tuning=tuning)
    if hasattr(attention, "chunk_impl"):  # bf16 and hyquant (the quantized baselines' chunks stay XLA)
        attention = dataclasses.replace(attention, chunk_impl=args.chunk_impl)
    return attention, hq
