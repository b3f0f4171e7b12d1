"""The `hyquant` command line.

  hyquant generate   generate text with a real checkpoint through the hybrid KV cache
  hyquant bench      run a benchmark from benchmarks/ (decode and prefill kernels, end to end, memory, ...)
  hyquant eval       run an evaluation from benchmarks/ (accuracy)
  hyquant demo       the hybrid cache on synthetic attention states
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from hyquant_jax.backends import BACKENDS
from hyquant_jax.config import BITS, SCHEMES, HyQuantConfig

# The HyQuant settings' defaults (HyQuantConfig's): the options default to None so that `hyquant generate` can
# tell a setting given on the command line (refused for the baselines) from one left alone.
CONFIG_DEFAULTS = {"key_bits": 4, "value_bits": 4, "scheme": HyQuantConfig.scheme, "window": 128, "block_size": 64,
                   "rho": 0.05, "prefill_qk": "int8", "prefill_block": 64}


def _add_config_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("HyQuant settings (--attention hyquant)")
    d = CONFIG_DEFAULTS
    g.add_argument("--key-bits", type=int, default=None, choices=BITS,
                   help=f"bits per key element (16 = keep bf16) (default: {d['key_bits']})")
    g.add_argument("--value-bits", type=int, default=None, choices=BITS,
                   help=f"bits per value element (16 = keep bf16) (default: {d['value_bits']})")
    g.add_argument("--scheme", default=None, choices=SCHEMES,
                   help=f"low-bit scaling scheme (channel_key: per-channel keys per block, per-token values) "
                        f"(default: {d['scheme']})")
    g.add_argument("--window", type=int, default=None,
                   help=f"W: recent tokens kept in full precision (default: {d['window']})")
    g.add_argument("--block-size", type=int, default=None,
                   help=f"tokens flushed from the window at once (default: {d['block_size']})")
    g.add_argument("--rho", type=float, default=None,
                   help=f"share of the prefix kept as full-precision VL tokens (default: {d['rho']})")
    g.add_argument("--no-promote", action="store_true", help="never promote flushed tokens to VL")
    g.add_argument("--prefill-qk", default=None, choices=("int8", "fp8", "bf16"),
                   help=f"number format of Q.K for the quantized segment of hybrid prefill (default: "
                        f"{d['prefill_qk']})")
    g.add_argument("--prefill-block", type=int, default=None,
                   help=f"query block of hybrid prefill (power of two, 16-256; must divide --window) (default: "
                        f"{d['prefill_block']})")


def _config(args) -> HyQuantConfig:
    """The HyQuantConfig of the options (their defaults where not given); a bad value is a ValueError naming it."""
    values = {name: getattr(args, name, None) for name in CONFIG_DEFAULTS}
    values = {name: CONFIG_DEFAULTS[name] if v is None else v for name, v in values.items()}
    return HyQuantConfig(promote_flushed=not args.no_promote, **values)


class _DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" to an option's help unless X is None or False (flags, options whose help already
    says what happens without them) or the help already names its default."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hyquant", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-V", "--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="hybrid KV cache on synthetic attention states: bytes and error vs exact",
                          formatter_class=_DefaultsHelpFormatter,
                          description="Freeze a synthetic prompt with planted vertical-line keys into a "
                                      "HybridKVCache, decode tokens through it, and print KV bytes (bf16 vs "
                                      "hybrid) and the decode-attention error vs exact and uniform low-bit.")
    demo.add_argument("--prompt-len", type=int, default=2048, help="prompt tokens frozen into the cache")
    demo.add_argument("--steps", type=int, default=256, help="decode steps (the window slides)")
    demo.add_argument("--batch", type=int, default=2, help="sequences")
    demo.add_argument("--q-heads", type=int, default=8, help="query heads")
    demo.add_argument("--kv-heads", type=int, default=2, help="KV heads (must divide --q-heads)")
    demo.add_argument("--head-dim", type=int, default=128, help="head dimension")
    demo.add_argument("--backend", default="auto", choices=BACKENDS, help="attention backend (hyquant_jax.backends)")
    demo.add_argument("--json", help="also write the result to this JSON file")
    _add_config_args(demo)

    gen = sub.add_parser(
        "generate", help="generate text with a real model through the HyQuant KV cache",
        formatter_class=_DefaultsHelpFormatter,
        description="Load a checkpoint (default: SmolLM2-135M-Instruct), wrap the prompt in its chat template, "
                    "generate with the chosen KV cache (HyQuant by default), streaming the text of one prompt as it "
                    "decodes, and print tokens/s and the KV-cache bytes (bf16 vs the chosen cache); with "
                    "--compare-bf16 also the share of generated tokens identical to a bf16 run. Without a GPU "
                    "everything runs on the XLA reference path. Example: hyquant generate -p \"What is the capital "
                    "of France?\" -n 16")
    from hyquant_jax.generate_cli import add_generate_args

    add_generate_args(gen)
    _add_config_args(gen)

    for name, what in (("bench", "a benchmark"), ("eval", "an evaluation")):
        p = sub.add_parser(
            name, help=f"run {what} script from benchmarks/ (no NAME: list them)",
            description=f"Run benchmarks/NAME.py from this source checkout with the remaining arguments (for "
                        f"example `hyquant {name} {'accuracy --quick' if name == 'eval' else 'e2e --help'}`). Without "
                        "NAME, list the available scripts.")
        p.add_argument("name", nargs="?", help="script name without .py")
        p.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command in ("bench", "eval"):
            return _run_script(args.command, args.name, args.script_args)
        if args.command == "generate":
            from hyquant_jax.generate_cli import run_generate

            run_generate(args, _config(args))
            return 0
        if args.command == "demo":
            from hyquant_jax.demo import run_demo
            from hyquant_jax.generate_cli import _check_backend

            config = _config(args)
            _check_backend(args.backend)
            if args.json and not Path(args.json).resolve().parent.is_dir():
                raise ValueError(f"--json {args.json}: the folder {Path(args.json).parent} does not exist")
            result = run_demo(prompt_len=args.prompt_len, steps=args.steps, batch=args.batch,
                              q_heads=args.q_heads, kv_heads=args.kv_heads, head_dim=args.head_dim,
                              config=config, backend=args.backend)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(result, f, indent=2)
    except ValueError as e:
        print(f"hyquant: error: {e}", file=sys.stderr)
        return 2
    return 0


def _version() -> str:
    import jax

    from hyquant_jax import __version__

    return f"hyquant {__version__} (jax {jax.__version__}, {jax.default_backend()})"


def benchmarks_dir() -> Path:
    """benchmarks/ of the source checkout this package runs from."""
    return Path(__file__).resolve().parent.parent / "benchmarks"


# The documented scripts of benchmarks/ (benchmarks/README.md says what each measures).
BENCHMARKS = ("decode_kernel", "prefill_kernel", "chunked_prefill_attention", "e2e", "decode_memory", "read_bandwidth",
              "report")
EVALUATIONS = ("accuracy",)


def _scripts(kind: str) -> dict[str, Path]:
    folder = benchmarks_dir()
    if not folder.is_dir():
        raise ValueError(f"no benchmarks/ folder next to the package ({folder}); `hyquant {kind}` needs a source "
                         "checkout (pip install -e .)")
    names = EVALUATIONS if kind == "eval" else BENCHMARKS
    return {name: folder / f"{name}.py" for name in names if (folder / f"{name}.py").is_file()}


def _run_script(kind: str, name: str | None, script_args: list[str]) -> int:
    scripts = _scripts(kind)
    if name is None:
        print(f"hyquant {kind}: available scripts in {benchmarks_dir()}:")
        for stem, path in scripts.items():
            doc = _first_doc_line(path)
            print(f"  {stem:26s} {doc}")
        return 0
    if name not in scripts:
        raise ValueError(f"no {kind} script named {name!r}; available: {sorted(scripts)}")
    root = str(benchmarks_dir().parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    return subprocess.call([sys.executable, str(scripts[name]), *script_args], cwd=root, env=env)


def _first_doc_line(path: Path) -> str:
    import ast

    try:
        doc = ast.get_docstring(ast.parse(path.read_text()))
    except SyntaxError:
        return ""
    return (doc or "").strip().splitlines()[0] if doc else ""


if __name__ == "__main__":
    sys.exit(main())
