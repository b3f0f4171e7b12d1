"""`hyquant serve`: an OpenAI-compatible HTTP server over the continuous-batching engine (`hyquant_jax.serving`).

Every option is checked before the model loads; the decode step compiles before the server accepts requests.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import jax.numpy as jnp

from hyquant_jax.api import load
from hyquant_jax.cli.options import (
    add_config_args,
    add_model_args,
    check_backend,
    config_from_args,
    given_config_options,
    use_compile_cache,
)
from hyquant_jax.model_attention import make_attention
from hyquant_jax.serving.engine import Engine
from hyquant_jax.serving.server import serve

HELP = "serve a checkpoint over an OpenAI-compatible HTTP API (continuous batching over the hybrid cache)"
DESCRIPTION = (
    "Serve /v1/completions, /v1/chat/completions (stream: true as server-sent events), /v1/models and /health. "
    "Requests run in --max-slots cache slots of --context tokens each (prompt + max_tokens); up to --max-queue "
    "more wait, beyond that a request gets 429. Needs the serve extra (pip install 'hyquant-jax[serve]'). "
    "Example: hyquant serve --port 8000, then point an OpenAI client at http://127.0.0.1:8000/v1.")


def add_parser(subparsers, formatter_class) -> None:
    """The `serve` subcommand: its own options, then the HyQuant settings."""
    p = subparsers.add_parser("serve", help=HELP, description=DESCRIPTION, formatter_class=formatter_class)
    add_model_args(p)
    p.add_argument("--model-name", default=None,
                   help="the name clients pass as `model` (default: the checkpoint's file or folder name)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (0.0.0.0 exposes the server to the network: set --api-key then)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=os.environ.get("HYQUANT_API_KEY"),
                   help="require `Authorization: Bearer KEY` on every request (default: $HYQUANT_API_KEY; none: "
                        "no check)")
    p.add_argument("--max-slots", type=int, default=8, help="requests decoded together (cache slots)")
    p.add_argument("--context", type=int, default=None,
                   help="tokens per slot, prompt + max_tokens (default: the model's max_position, at most 4096)")
    p.add_argument("--max-queue", type=int, default=64, help="requests that may wait for a slot")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"),
                   help="uvicorn's log level")
    add_config_args(p)


def check_serve_args(args: argparse.Namespace) -> None:
    """The options that can be checked before the model loads: ValueErrors naming the option."""
    for name in ("max_slots", "prefill_chunk"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.max_queue < 0:
        raise ValueError(f"--max-queue must be >= 0, got {args.max_queue}")
    if args.context is not None and args.context < 2:
        raise ValueError(f"--context must be >= 2 (a prompt token and a generated one), got {args.context}")
    if not 0 <= args.port < 65536:
        raise ValueError(f"--port must be in [0, 65535], got {args.port}")
    if args.api_key is not None and not args.api_key.strip():
        raise ValueError("--api-key must not be empty")
    if args.attention != "hyquant":
        given = given_config_options(args) + (["--backend"] if args.backend is not None else [])
        if given:
            raise ValueError(f"{', '.join(given)} set the hybrid cache and apply to --attention hyquant only, not "
                             f"--attention {args.attention}")
    check_backend(args.backend or "auto")
    try:  # the serve extra, optional for the package: imported here to say so before the model loads
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise ValueError(f"hyquant serve needs the serve extra: pip install 'hyquant-jax[serve]' ({e})") from e


def run(args: argparse.Namespace) -> int:
    """`hyquant serve` from parsed options (runs until interrupted; bad options raise ValueError)."""
    config = config_from_args(args)
    check_serve_args(args)
    use_compile_cache(args)
    model = load(args.model, dtype=args.dtype, progress=True)
    attention = make_attention(args.attention, config if args.attention == "hyquant" else None,
                               backend=args.backend or "auto", cache_dtype=jnp.bfloat16)
    engine = Engine(model.decoder, attention, tokenizer=model.tokenizer, max_slots=args.max_slots,
                    context=args.context, max_queue=args.max_queue, prefill_chunk=args.prefill_chunk,
                    bucket=min(64, args.prefill_chunk), pad_id=model.tokenizer.pad_id or 0, on_compile=_say)
    name = args.model_name or (Path(args.model).name if args.model else model.name.removesuffix(" (default)"))
    serve(engine, name, host=args.host, port=args.port, api_key=args.api_key, log_level=args.log_level)
    return 0


def _say(message: str) -> None:
    print(f"hyquant serve: {message}", file=sys.stderr, flush=True)
