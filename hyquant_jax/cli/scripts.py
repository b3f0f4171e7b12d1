"""`hyquant bench` and `hyquant eval`: run a script of benchmarks/ (`python -m benchmarks.NAME`) from the source
checkout this package runs from, or list them (benchmarks/README.md says what each measures)."""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
from pathlib import Path

# The documented scripts of benchmarks/.
BENCHMARKS = ("decode_kernel", "prefill_kernel", "chunked_prefill_attention", "e2e", "serve", "decode_memory",
              "read_bandwidth", "report")
EVALUATIONS = ("accuracy", "ruler_eval")
COMMANDS = {"bench": ("a benchmark", BENCHMARKS, "e2e --help"), "eval": ("an evaluation", EVALUATIONS,
                                                                         "accuracy --quick")}


def add_parsers(subparsers) -> None:
    """The `bench` and `eval` subcommands."""
    for name, (what, _, example) in COMMANDS.items():
        p = subparsers.add_parser(
            name, help=f"run {what} script from benchmarks/ (no NAME: list them)",
            description=f"Run `python -m benchmarks.NAME` from this source checkout with the remaining arguments (for "
                        f"example `hyquant {name} {example}`). Without NAME, list the available scripts.")
        p.add_argument("name", nargs="?", help="script name (a module of benchmarks/)")
        p.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments passed to the script")


def run(args: argparse.Namespace) -> int:
    """List the scripts of `args.command` (no name) or run one; its exit code."""
    return run_script(args.command, args.name, args.script_args)


def benchmarks_dir() -> Path:
    """benchmarks/ of the source checkout this package runs from."""
    return Path(__file__).resolve().parents[2] / "benchmarks"


def _scripts(kind: str) -> dict[str, Path]:
    """{name: the file whose docstring describes it}: benchmarks/NAME.py, or benchmarks/NAME/__init__.py for a
    script that is a package."""
    folder = benchmarks_dir()
    if not folder.is_dir():
        raise ValueError(f"no benchmarks/ folder next to the package ({folder}); `hyquant {kind}` needs a source "
                         "checkout (pip install -e .)")
    found = {}
    for name in COMMANDS[kind][1]:
        for path in (folder / f"{name}.py", folder / name / "__init__.py"):
            if path.is_file():
                found[name] = path
                break
    return found


def run_script(kind: str, name: str | None, script_args: list[str]) -> int:
    """Run `python -m benchmarks.NAME` of `kind` ("bench" or "eval") with `script_args`, or list them when name
    is None."""
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
    script = subprocess.Popen([sys.executable, "-m", f"benchmarks.{name}", *script_args], cwd=root, env=env)
    while True:
        try:
            return script.wait()
        except KeyboardInterrupt:
            # The Ctrl-C reached the script too (one process group): it stops in its own way (writes nothing
            # half, says "interrupted", exit code 130) and its exit code is this command's.
            continue


def _first_doc_line(path: Path) -> str:
    try:
        doc = ast.get_docstring(ast.parse(path.read_text()))
    except SyntaxError:
        return ""
    return (doc or "").strip().splitlines()[0] if doc else ""
