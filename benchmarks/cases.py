"""The shapes the benchmarks run, in one place: the end-to-end benchmark's models, the attention heads the
kernel benchmarks use, and the decode kernel's cases and cache configuration."""

from __future__ import annotations

from hyquant_jax.config import HyQuantConfig

# (query heads, KV heads, head dim) of one attention layer
QWEN3_8B_HEADS = (32, 8, 128)
SMOLLM2_HEADS = (9, 3, 64)

# Model shapes of the end-to-end benchmark (random bf16 weights): `models.ModelConfig` fields.
QWEN3_8B = dict(architecture="qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_layers=36,
                num_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1e6, qk_norm=True,
                tie_embeddings=False, max_position=262144)
QWEN3_32B = dict(QWEN3_8B, hidden_size=5120, intermediate_size=25600, num_layers=64, num_heads=64)
MODELS = {"qwen3-8b": QWEN3_8B, "qwen3-32b": QWEN3_32B}
SMOKE_MODEL = dict(QWEN3_8B, vocab_size=512, hidden_size=128, intermediate_size=256, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=64, max_position=65536)  # --smoke: a CPU check of a script

# The decode kernel's cases: (name, batch, query heads, KV heads, head dim, context).
DECODE_CASES = [
    *((f"qwen3-8b B1 {n}K", 1, *QWEN3_8B_HEADS, n * 1024) for n in (1, 4, 8, 16, 32, 128)),
    ("qwen3-8b B16 32K", 16, *QWEN3_8B_HEADS, 32768),
    ("smollm2 B1 8K", 1, *SMOLLM2_HEADS, 8192),
]
DECODE_SMOKE_CASES = [("smoke B2 1K", 2, 8, 2, 64, 1024)]  # --smoke: a CPU check of a script
# The hybrid cache the decode kernel benchmarks time: K4V4, rho 5%, window 128.
DECODE_CONFIG = HyQuantConfig(key_bits=4, value_bits=4, rho=0.05, window=128)


def qwen3_8b_case(batch: int, context: int, name: str | None = None) -> tuple:
    """A decode case with Qwen3-8B's heads: (name, batch, query heads, KV heads, head dim, context)."""
    return (name or f"qwen3-8b B{batch} {context // 1024}K", batch, *QWEN3_8B_HEADS, context)
