"""`HyQuantConfig`: every knob of the hybrid-precision method in one frozen value.

The config is hashable, so it can be a static argument of `jax.jit`. Invalid
values raise `ValueError` naming the field and the allowed range.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np

BITS = (2, 4, 8, 16)
SCHEMES = ("token_sym", "token_asym", "channel_key")
PREFILL_QK_FORMATS = ("int8", "fp8", "bf16")
_POW2_BLOCKS = (16, 32, 64, 128, 256)
# rho is used as the nearest fraction with at most this denominator, so that
# ceil(P * rho) is computed exactly in int32 arithmetic (a float ceil gives 100 * 0.07 = 7.000000000000001 -> 8).
RHO_MAX_DENOMINATOR = 10_000


def setting(default, help: str, *, choices: tuple | None = None, option: str | None = ""):
    """A HyQuantConfig field with its command-line description (field metadata, read by `hyquant_jax.cli`).

    help: what the option does; choices: the values it accepts (None: any of the field's type); option: its
    flag ("": from the field name, e.g. --key-bits; None: not a command-line option). A bool field's option
    is a flag that sets the opposite of its default, and its help says what the flag does.
    """
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices, "option": option})


@dataclasses.dataclass(frozen=True)
class HyQuantConfig:
    """Hybrid-precision attention settings.

    Attributes:
      key_bits, value_bits: bits per element of the low-bit region, one of
        2, 4, 8, or 16 (16 keeps bf16: an ablation switch, no quantization).
      scheme: how low-bit elements are scaled.
        "token_sym": one symmetric scale per token and channel group;
        "token_asym": a scale and a zero point per token and channel group;
        "channel_key" (default): keys get a scale and zero point per channel over
        each block of `block_size` tokens (KIVI-style), values are per-token
        asymmetric. Keys carry per-channel outliers, so this scheme is far more
        accurate: on SmolLM2-135M, 96 greedy tokens agreed with bf16 99.0% of
        the time vs 35.4% for "token_sym" (benchmarks/results/generate_*_cpu.json).
      group_size: channels sharing one per-token scale (None: the whole head).
      window: W, the number of most recent tokens always kept in full precision.
      block_size: tokens that leave the window together. The decode window is a
        ring of `window + block_size` slots; when it is full the oldest block is
        quantized into the low-bit region (one page of `block_size` slots).
      rho: share of the non-window prefix kept in full precision as vertical-line
        (VL) tokens, in [0, 1]. 0 disables VL; otherwise at least one token.
      promote_flushed: when a block is flushed from the window during decode,
        keep its top-rho tokens (by accumulated decode attention mass) as VL.
      prefill_qk: number format of Q.K in the quantized prefill segment.
      prefill_block: query block size of hybrid prefill; each query block sees
        the `window` keys before it and itself in full precision.
    """

    key_bits: int = setting(4, "bits per key element (16 = keep bf16)", choices=BITS)
    value_bits: int = setting(4, "bits per value element (16 = keep bf16)", choices=BITS)
    scheme: str = setting("channel_key", "low-bit scaling scheme (channel_key: per-channel keys per block, "
                                         "per-token values)", choices=SCHEMES)
    # Not a command-line option: the tested HyQuant settings scale whole heads; the KIVI baseline sets it.
    group_size: int | None = setting(None, "channels sharing one per-token scale (None: the whole head)",
                                     option=None)
    window: int = setting(128, "W: recent tokens kept in full precision")
    block_size: int = setting(64, "tokens flushed from the window at once")
    rho: float = setting(0.05, "share of the prefix kept as full-precision VL tokens")
    promote_flushed: bool = setting(True, "never promote flushed tokens to VL", option="--no-promote")
    prefill_qk: str = setting("int8", "number format of Q.K for the quantized segment of hybrid prefill",
                              choices=PREFILL_QK_FORMATS)
    prefill_block: int = setting(64, "query block of hybrid prefill (power of two, 16-256; must divide --window)")

    def __post_init__(self):
        for name in ("key_bits", "value_bits"):
            value = getattr(self, name)
            if not _is_int(value) or value not in BITS:
                raise ValueError(f"HyQuantConfig.{name} must be one of {BITS}, got {value!r}")
        if self.scheme not in SCHEMES:
            raise ValueError(f"HyQuantConfig.scheme must be one of {SCHEMES}, got {self.scheme!r}")
        if self.group_size is not None and (
            not _is_int(self.group_size) or self.group_size < 1 or self.group_size & (self.group_size - 1)
        ):
            raise ValueError(
                f"HyQuantConfig.group_size must be None or a power of two >= 1, got {self.group_size!r}"
            )
        if not _is_int(self.block_size) or self.block_size not in _POW2_BLOCKS:
            raise ValueError(f"HyQuantConfig.block_size must be one of {_POW2_BLOCKS}, got {self.block_size!r}")
        if not _is_int(self.window) or self.window < 0 or self.window % self.block_size:
            raise ValueError(
                f"HyQuantConfig.window must be an int >= 0 and a multiple of block_size={self.block_size}, "
                f"got {self.window!r}"
            )
        if isinstance(self.rho, bool) or not isinstance(self.rho, (int, float)) or not 0.0 <= self.rho <= 1.0:
            raise ValueError(f"HyQuantConfig.rho must be a number in [0, 1], got {self.rho!r}")
        if not isinstance(self.promote_flushed, bool):
            raise ValueError(f"HyQuantConfig.promote_flushed must be a bool, got {self.promote_flushed!r}")
        if self.prefill_qk not in PREFILL_QK_FORMATS:
            raise ValueError(
                f"HyQuantConfig.prefill_qk must be one of {PREFILL_QK_FORMATS}, got {self.prefill_qk!r}"
            )
        if not _is_int(self.prefill_block) or self.prefill_block not in _POW2_BLOCKS:
            raise ValueError(
                f"HyQuantConfig.prefill_block must be one of {_POW2_BLOCKS}, got {self.prefill_block!r}"
            )
        if self.window % self.prefill_block:
            raise ValueError(
                f"HyQuantConfig.window={self.window} must be a multiple of prefill_block={self.prefill_block}"
            )

    @property
    def ring_size(self) -> int:
        """Slots of the full-precision window ring: window + one staging block."""
        return self.window + self.block_size

    @property
    def rho_fraction(self) -> Fraction:
        frac = Fraction(self.rho).limit_denominator(RHO_MAX_DENOMINATOR)
        if frac == 0 and self.rho > 0:
            # A positive rho below 1/20000 would round to 0 and silently disable VL;
            # the docstring promises at least one token, so keep the smallest positive fraction.
            frac = Fraction(1, RHO_MAX_DENOMINATOR)
        return frac

    @property
    def flush_vl_count(self) -> int:
        """Tokens of each flushed block promoted to VL (0 when promotion is off)."""
        if not self.promote_flushed:
            return 0
        return num_vl_tokens(self.block_size, self.rho_fraction)

    def group_count(self, head_dim: int) -> int:
        """Channel groups of a per-token scale for this head_dim (checked)."""
        group = self.group_size or head_dim
        if group > head_dim or head_dim % group:
            raise ValueError(
                f"HyQuantConfig.group_size={self.group_size} must divide head_dim={head_dim}"
            )
        return head_dim // group

    def check_head_dim(self, head_dim: int) -> None:
        """Raise if the packed layout cannot hold this head_dim."""
        for bits in (self.key_bits, self.value_bits):
            if bits < 8 and head_dim % (8 // bits):
                raise ValueError(f"head_dim={head_dim} must be a multiple of {8 // bits} for {bits}-bit packing")
        self.group_count(head_dim)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def num_vl_tokens(prefix_len, rho: Fraction):
    """k = min(P, max(1, ceil(P * rho))) for P > 0, else 0 (Algorithm 1, line 19).

    rho = 0 means no VL at all. Works on Python ints (host) and int32 arrays
    (traced); exact, since rho is a fraction num/den with den <= 10_000.
    """
    num, den = rho.numerator, rho.denominator
    if num == 0:
        return 0 if isinstance(prefix_len, int) else jnp.zeros_like(prefix_len)
    if isinstance(prefix_len, int):
        if prefix_len <= 0:
            return 0
        return min(prefix_len, max(1, math.ceil(Fraction(prefix_len) * rho)))
    p = jnp.maximum(prefix_len, 0)
    # ceil(p * num / den) without overflow: split p into multiples of den and a remainder.
    k = (p // den) * num + ((p % den) * num + den - 1) // den
    return jnp.where(p > 0, jnp.minimum(p, jnp.maximum(1, k)), 0)


def check_config(config, name: str = "config") -> HyQuantConfig:
    """`config` if it is a HyQuantConfig, else a ValueError naming the argument."""
    if not isinstance(config, HyQuantConfig):
        raise ValueError(f"{name} must be a hyquant_jax.HyQuantConfig, got {type(config).__name__}")
    return config


def as_lengths(lengths, batch: int, name: str = "lengths") -> jax.Array:
    """Per-sequence token counts as an integer array [batch]: JAX arrays as they are (traced ones too), lists,
    tuples and NumPy arrays converted to int32; anything else a ValueError naming the argument."""
    if isinstance(lengths, (list, tuple)) or type(lengths).__module__ == "numpy":
        try:
            lengths = jnp.asarray(np.asarray(lengths))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{name} must be integer token counts [B={batch}], got {lengths!r}") from e
    if not hasattr(lengths, "shape") or not hasattr(lengths, "dtype"):
        raise ValueError(f"{name} must be an int array [B={batch}] (or a list of ints), got {type(lengths).__name__}")
    if lengths.shape != (batch,) or not jnp.issubdtype(lengths.dtype, jnp.integer):
        raise ValueError(f"{name} must be int [B]={(batch,)}, got {lengths.dtype} {list(lengths.shape)}")
    return lengths.astype(jnp.int32) if lengths.dtype != jnp.int32 else lengths

