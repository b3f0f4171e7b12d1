"""The `hyquant` command line."""

from __future__ import annotations

import argparse
import json
import sys

from hyquant_jax.config import BITS, SCHEMES, HyQuantConfig


def _add_config_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("HyQuant settings")
    g.add_argument("--key-bits", type=int, default=4, choices=BITS, help="bits per key element (16 = keep bf16)")
    g.add_argument("--value-bits", type=int, default=4, choices=BITS, help="bits per value element (16 = keep bf16)")
    g.add_argument("--scheme", default="token_sym", choices=SCHEMES, help="low-bit scaling scheme")
    g.add_argument("--window", type=int, default=128, help="W: recent tokens kept in full precision")
    g.add_argument("--block-size", type=int, default=64, help="tokens flushed from the window at once")
    g.add_argument("--rho", type=float, default=0.05, help="share of the prefix kept as full-precision VL tokens")
    g.add_argument("--no-promote", action="store_true", help="never promote flushed tokens to VL")


def _config(args) -> HyQuantConfig:
    return HyQuantConfig(key_bits=args.key_bits, value_bits=args.value_bits, scheme=args.scheme,
                         window=args.window, block_size=args.block_size, rho=args.rho,
                         promote_flushed=not args.no_promote)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hyquant", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="hybrid KV cache on synthetic attention states: bytes and error vs exact",
                          description="Freeze a synthetic prompt with planted vertical-line keys into a "
                                      "HybridKVCache, decode tokens through it, and print KV bytes (bf16 vs "
                                      "hybrid) and the decode-attention error vs exact and uniform low-bit.")
    demo.add_argument("--prompt-len", type=int, default=2048, help="prompt tokens frozen into the cache")
    demo.add_argument("--steps", type=int, default=256, help="decode steps (the window slides)")
    demo.add_argument("--batch", type=int, default=2)
    demo.add_argument("--q-heads", type=int, default=8)
    demo.add_argument("--kv-heads", type=int, default=2)
    demo.add_argument("--head-dim", type=int, default=128)
    demo.add_argument("--backend", default="auto", choices=("auto", "reference", "pallas", "interpret"))
    demo.add_argument("--json", help="also write the result to this JSON file")
    _add_config_args(demo)

    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            from hyquant_jax.demo import run_demo

            result = run_demo(prompt_len=args.prompt_len, steps=args.steps, batch=args.batch,
                              q_heads=args.q_heads, kv_heads=args.kv_heads, head_dim=args.head_dim,
                              config=_config(args), backend=args.backend)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(result, f, indent=2)
    except ValueError as e:
        print(f"hyquant: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
