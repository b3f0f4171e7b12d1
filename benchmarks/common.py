"""Shared helpers of the benchmark scripts: timing, environment record, JSON output."""

from __future__ import annotations

import datetime
import functools
import importlib.util
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
import warnings

import jax
import jax.numpy as jnp
from jax import lax

from hyquant_jax.cli.output import ResultFile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root


def environment() -> dict:
    """The run's record: device, versions, date, command line and XLA flags."""
    dev = jax.devices()[0]
    return {"device": dev.device_kind, "platform": dev.platform, **host_environment()}


def host_environment(module: str | None = None, argv: list[str] | None = None) -> dict:
    """`environment` without the device (a process that must not initialise one leaves device and platform to
    its workers); module and argv as in `command_line`."""
    return {
        "jax": jax.__version__,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": command_line(module, argv),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }


def command_line(module: str | None = None, argv: list[str] | None = None) -> str:
    """The command that runs this benchmark again, e.g. `python -m benchmarks.e2e --smoke`: module (default: the
    running `__main__`'s, or its file when it runs as a script) and argv (default: sys.argv[1:])."""
    argv = sys.argv[1:] if argv is None else argv
    if module is None:
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        module = spec.name.removesuffix(".__main__") if spec is not None else None
    head = ["python", "-m", module] if module else [os.path.relpath(sys.argv[0])]
    return " ".join(shlex.quote(a) for a in head + list(argv))


def module_command(module: str, *args: str) -> list[str]:
    """The argv that runs `module` (e.g. "benchmarks.e2e") in a fresh interpreter with args; run it with
    `module_env`'s environment."""
    return [sys.executable, "-m", module, *args]


def module_env(env: dict | None = None) -> dict:
    """env (default: os.environ) with the repository root first on PYTHONPATH, so a `module_command` finds the
    benchmarks package whatever the working folder."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    return env


def device_slug(devices=None) -> str:
    """Short lower-case name of the devices a run uses, for result file names: "h200", "h100", "cpu", ...;
    several devices give e.g. "h200x2"."""
    devices = jax.devices() if devices is None else devices
    return slug(devices[0].device_kind, devices[0].platform, len(devices))


def slug(device_kind: str, platform: str = "gpu", count: int = 1) -> str:
    """`device_slug` from a device's kind ("NVIDIA H100 80GB HBM3"), platform and the number of devices."""
    kind = device_kind.lower() if platform == "gpu" else platform
    for known in ("gh200", "h200", "h100", "h800", "h20", "b200", "a100", "l40s", "l4"):
        if known in kind.replace(" ", "").replace("-", ""):
            kind = known
            break
    else:
        kind = "".join(c if c.isalnum() else "_" for c in kind).strip("_") or "device"
    return kind if count == 1 else f"{kind}x{count}"


def default_name(benchmark: str, devices=None) -> str:
    """The canonical results file stem of a benchmark on these devices: `<benchmark>_<device>`."""
    return f"{benchmark}_{device_slug(devices)}"


RESULTS = os.path.join(ROOT, "benchmarks", "results")


def output_folder(out: str | None, smoke: bool = False) -> str:
    """Where a benchmark writes: --out if given (created and checked, `check_out`); else benchmarks/results, or for
    a --smoke run (a CPU check of the script, whose numbers mean nothing) a fresh temporary folder, so that it
    never overwrites a canonical file."""
    if out is not None:
        return check_out(out)
    if smoke:
        return tempfile.mkdtemp(prefix="hyquant_smoke_")
    return RESULTS


def add_output(q, out):
    """The next iteration's query: q plus a tiny multiple of the output (same shape as q)."""
    return q + (1e-6 * out.astype(jnp.float32)).astype(q.dtype)


def add_output_sum(q, out):
    """The next iteration's query when the output's shape differs from q's: q plus a tiny multiple of its sum."""
    return q + (1e-6 * jnp.sum(out.astype(jnp.float32))).astype(q.dtype)


def jitted_loop(fn, iters: int, feedback=add_output, compiler_options: dict | None = None):
    """jit(loop(q, operands)): `iters` calls of fn(q, *operands) in a fori_loop.

    Each iteration's query is feedback(q, output), so it depends on the previous
    output and XLA can neither hoist nor overlap the calls. compiler_options: XLA options of the loop's jit
    (e.g. {"xla_gpu_command_buffer_scheduling_mode": "CONCURRENT"}).
    """

    @functools.partial(jax.jit, compiler_options=compiler_options)
    def loop(q, operands):
        def body(_, q):
            return feedback(q, fn(q, *operands))

        return lax.fori_loop(0, iters, body, q)

    return loop


def timed(fn, *args, ready=None):
    """(fn(*args), wall seconds until the result is ready): one call, timed from Python. ready(result): the part
    to wait for (default: all of it; a loop that returns many arrays from one program can wait for one)."""
    t0 = time.perf_counter()
    out = fn(*args)
    jax.block_until_ready(out if ready is None else ready(out))
    return out, time.perf_counter() - t0


def call_seconds(fn, *args, reps: int) -> list[float]:
    """Wall seconds of `reps` calls of fn(*args), one after another (`timed`); the outputs are dropped."""
    return [timed(fn, *args)[1] for _ in range(reps)]


def time_in_loop(fn, q, operands, iters: int, reps: int = 5, feedback=add_output,
                 compiler_options: dict | None = None) -> float:
    """Median seconds per call of fn(q, *operands) inside `jitted_loop` (dispatch gaps are excluded)."""
    loop = jitted_loop(fn, iters, feedback, compiler_options)
    timed(loop, q, operands)
    return statistics.median(call_seconds(loop, q, operands, reps=reps)) / iters


def time_per_call(fn, q, operands, reps: int = 30) -> float:
    """Median seconds of one jitted call from Python, with block_until_ready."""
    jitted = jax.jit(fn)
    timed(jitted, q, *operands)
    return statistics.median(call_seconds(jitted, q, *operands, reps=reps))


def pallas_triton_op(name: str):
    """JAX's own Pallas Triton op `jax.experimental.pallas.ops.gpu.<name>` (a baseline), imported without its
    deprecation warning (deprecated in jax 0.11.1); None where jax no longer has it (removed in 0.12.1): the
    baseline then reports an error and the other methods run."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return importlib.import_module(f"jax.experimental.pallas.ops.gpu.{name}")
    except ImportError:
        return None


def write_json(path: str, payload: dict, indent: int = 2, default=None) -> bool:
    """Write payload as JSON, atomically (a temporary file renamed: a run killed mid-write leaves the previous file
    intact); if the write fails, one line on stderr and the record on stdout, and False (`ResultFile`).
    default: json's, for values it cannot encode."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return ResultFile(path, "--out").write(payload, indent=indent, default=default)


def check_out(folder: str) -> str:
    """Before a run: create the --out folder and check that a file can be written in it, so a bad path fails at
    once (one line, exit code 2), not after the run."""
    try:
        os.makedirs(folder, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        print(f"error: --out {folder}: cannot write a file there ({e.strerror or e})", file=sys.stderr)
        sys.exit(2)
    return folder


def run_script(main) -> None:
    """`if __name__ == "__main__"` of a benchmark: exit with main's exit code (0 unless it returns an int), or
    with 130 and one line on Ctrl-C instead of a traceback."""
    try:
        code = main()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = 130
    sys.exit(code if isinstance(code, int) else 0)


def load_module(path: str, name: str):
    """Import the Python file at `path` as a module named `name` (a modified copy of a kernel module, to time
    or compile next to the original). It is registered in `sys.modules` while it runs, as an import would be
    (dataclasses look their module up there)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
