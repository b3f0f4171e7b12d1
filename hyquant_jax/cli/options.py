"""Options that several `hyquant` commands share: the HyQuant settings, derived from `HyQuantConfig`'s fields,
and the check of --backend against this machine (`api.check_backend`).

Each HyQuantConfig field declares its option next to itself (`hyquant_jax.config.setting`: help text, choices,
flag), so a new field appears on the command line without an edit here. The options default to None, so that
`hyquant generate` can tell a setting given on the command line (refused for the baselines) from one left
alone; their help states HyQuantConfig's default.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing

from hyquant_jax import api
from hyquant_jax.config import HyQuantConfig


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
