"""XLA compile options of the jitted prefill and decode, and the jit wrappers that apply them.

On a GPU, XLA records a program's kernels in command buffers (CUDA graphs). Which kernels, in which order, and
whether loops run on the device are XLA options that `jax.jit(compiler_options=...)` sets per program:

* prefill: command buffers without custom calls (`prefill_compiler_options`);
* decode: the graph ordered by data only (CONCURRENT), and device-side loops for loops that stop on data
  (`decode_compiler_options`, `uses_device_loops`); `DeviceLoopJit` picks one of two compiled programs per
  call.

A setting of the same option in XLA_FLAGS (read when this module is imported, `XLA_FLAGS`) wins over these.
On a CPU the options are accepted and change nothing.
Why these: docs/design.md, "Device loops and command buffers".
"""

from __future__ import annotations

import functools
import os

import jax

# The XLA_FLAGS of this process, read at import (as XLA reads them when it starts).
XLA_FLAGS = os.environ.get("XLA_FLAGS", "")

# XLA's command-buffer kinds by default in jax 0.11.2 (read from its DebugOptions)
XLA_COMMAND_BUFFER_KINDS = ("FUSION", "CUBLAS", "CUBLASLT", "CUDNN", "CUSTOM_CALL", "DYNAMIC_SLICE_FUSION",
                            "CONDITIONAL")


def prefill_compiler_options(xla_flags: str) -> dict[str, str]:
    """XLA options of the jitted `prefill`: command buffers (CUDA graphs) without custom calls.

    Custom calls such as the Mosaic GPU prefill kernel then launch directly instead of from a graph, where they
    left the GPU idle between launches. The kinds are XLA's defaults (`XLA_COMMAND_BUFFER_KINDS`) less
    CUSTOM_CALL and CONDITIONAL. A command-buffer setting in `xla_flags` wins (then no options).
    """
    if "xla_gpu_enable_command_buffer" in xla_flags:
        return {}
    kinds = [k for k in XLA_COMMAND_BUFFER_KINDS if k not in ("CUSTOM_CALL", "CONDITIONAL")]
    return {"xla_gpu_enable_command_buffer": ",".join(kinds)}


def decode_compiler_options(xla_flags: str, device_loops: bool = False) -> dict[str, str]:
    """XLA options of the jitted `decode`: the loop body's CUDA graph ordered by data only (CONCURRENT), and
    with `device_loops` WHILE among the command-buffer kinds.

    XLA's default (LHS) chains the graph's kernels in program order; CONCURRENT lets independent kernels
    (e.g. the hybrid decode's two attention launches, or a layer's norm and cache writes next to its
    products) overlap. A branch in every step made that slower for the hybrid cache, hence the branch-free
    inner loop of `decode` (`steps_until_begin`).

    device_loops: a while loop whose trip count XLA cannot know (it stops on data) otherwise runs from the
    host: each step the host reads the condition back, waits for the GPU to drain, then launches the next
    body graph. With WHILE the loops become device-side loops inside one CUDA graph (nothing per step on the
    host). See `uses_device_loops` for when `decode` takes them. A setting of the same option in `xla_flags`
    wins.
    """
    options = {}
    if "xla_gpu_command_buffer_scheduling_mode" not in xla_flags:
        options["xla_gpu_command_buffer_scheduling_mode"] = "CONCURRENT"
    if device_loops and "xla_gpu_enable_command_buffer" not in xla_flags:
        options["xla_gpu_enable_command_buffer"] = ",".join(XLA_COMMAND_BUFFER_KINDS + ("WHILE",))
    return options


def uses_device_loops(attention, eos_ids: tuple[int, ...]) -> bool:
    """Whether `decode`'s loops stop on data: with stop tokens, or with an attention that runs the steps
    between its once-per-step work in an inner loop (`steps_until_begin`: the hybrid cache). XLA knows the
    trip count of the other loops (no stop tokens, one flat loop) and launches their steps from the host
    without reading anything back, which is faster than a device-side loop; the rest run on the device
    (`decode_compiler_options`)."""
    inner = getattr(attention, "inner", attention)  # hyquant_jax.sharding.ShardedAttention wraps one
    return bool(eos_ids) or getattr(inner, "steps_until_begin", None) is not None


class TopLevelJit:
    """`jax.jit(fn, compiler_options=..., **kwargs)` when called at the top level; inside a caller's trace a
    plain `jax.jit(fn, **kwargs)`, since JAX accepts compiler options on top-level jits only (the caller's
    program is compiled with its own options). `lower` lowers the top-level one."""

    def __init__(self, fn, compiler_options: dict, **kwargs):
        self.top = jax.jit(fn, compiler_options=compiler_options, **kwargs)
        self.nested = jax.jit(fn, **kwargs)
        functools.update_wrapper(self, fn)

    def __call__(self, *args, **kwargs):
        traced = any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves((args, kwargs)))
        return (self.nested if traced else self.top)(*args, **kwargs)

    def lower(self, *args, **kwargs):
        return self.top.lower(*args, **kwargs)


def jit_with_options(compiler_options: dict, **kwargs):
    """Decorator: `TopLevelJit(fn, compiler_options, **kwargs)`."""
    return lambda fn: TopLevelJit(fn, compiler_options, **kwargs)


class DeviceLoopJit:
    """A decode loop as two top-level jits, with host-driven or device-side loops (`uses_device_loops` of the
    call's `attention` and `eos_ids` keyword arguments picks one); each compiles on first use. jit_kwargs:
    `jax.jit`'s (static and donated arguments)."""

    def __init__(self, fn, xla_flags: str, **jit_kwargs):
        self.host = TopLevelJit(fn, decode_compiler_options(xla_flags), **jit_kwargs)
        self.device = TopLevelJit(fn, decode_compiler_options(xla_flags, device_loops=True), **jit_kwargs)
        functools.update_wrapper(self, fn)

    def _pick(self, kwargs):
        return self.device if uses_device_loops(kwargs["attention"], kwargs["eos_ids"]) else self.host

    def __call__(self, *args, **kwargs):
        return self._pick(kwargs)(*args, **kwargs)

    def lower(self, *args, **kwargs):
        return self._pick(kwargs).lower(*args, **kwargs)
