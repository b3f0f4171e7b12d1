"""The `hyquant` command line.

  hyquant generate   generate text with a real checkpoint through the hybrid KV cache
  hyquant bench      run a benchmark from benchmarks/ (decode and prefill kernels, end to end, memory, ...)
  hyquant eval       run an evaluation from benchmarks/ (accuracy)
  hyquant demo       the hybrid cache on synthetic attention states
"""

from __future__ import annotations

import argparse
import sys

import jax

from hyquant_jax import __version__
from hyquant_jax.cli import demo, generate, scripts


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line and a pointer to --help (exit code 2), not the usage block
    ahead of the line that matters. Its subcommands' parsers are of this class too."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" to an option's help unless X is None or False (flags, options whose help already
    says what happens without them) or the help already names its default."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="hyquant", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-V", "--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True)
    demo.add_parser(sub, _DefaultsHelpFormatter)
    generate.add_parser(sub, _DefaultsHelpFormatter)
    scripts.add_parsers(sub)
    return parser


# subcommand -> the module whose `run(args)` carries it out
COMMANDS = {"demo": demo, "generate": generate, "bench": scripts, "eval": scripts}


def main(argv: list[str] | None = None) -> int:
    """Run one `hyquant` command: its exit code (2 and a one-line error for bad input, 130 for Ctrl-C)."""
    try:
        args = build_parser().parse_args(argv)
        return COMMANDS[args.command].run(args)
    except ValueError as e:
        print(f"hyquant: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _version() -> str:
    return f"hyquant {__version__} (jax {jax.__version__}, {jax.default_backend()})"
