"""The `hyquant` command (console script `hyquant_jax.cli:main`): one module per subcommand.

* `main`: the parser and the dispatch to a subcommand.
* `generate`: `hyquant generate`, text from a real checkpoint through the chosen KV cache.
* `demo`: `hyquant demo`, the hybrid cache on synthetic attention states.
* `scripts`: `hyquant bench` / `hyquant eval`, the scripts of benchmarks/.
* `options`: the options several commands share (the HyQuant settings, derived from `HyQuantConfig`).
"""

from hyquant_jax.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
