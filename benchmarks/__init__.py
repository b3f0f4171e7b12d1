"""The benchmarks of hyquant-jax, run as modules from the repository root: `python -m benchmarks.NAME`
(benchmarks/README.md lists them). Shapes live in `cases`, timing and the results record in `common`."""
