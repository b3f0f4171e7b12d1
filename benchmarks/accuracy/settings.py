"""The accuracy benchmark's fixed settings: where the data is, the method names, the ablation grids, and
`Sizes` (how much of each section runs: FULL, SPEC, QUICK)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository root


def _data_dir() -> Path:
    """Evaluation data: $HYQUANT_DATA, else ../shared/data beside the checkout, else /work/shared/data
    (where this workplace keeps it, so a clone elsewhere, e.g. in CI, still finds it)."""
    if os.environ.get("HYQUANT_DATA"):
        return Path(os.environ["HYQUANT_DATA"])
    for candidate in (ROOT.parent / "shared" / "data", Path("/work/shared/data")):
        if candidate.exists():
            return candidate
    return ROOT.parent / "shared" / "data"


DATA = _data_dir()


DEFAULT_WIKITEXT = DATA / "wikitext-2-raw" / "wiki.test.raw"


DEFAULT_ESSAYS = DATA / "paul_graham_essays"


SECTIONS = ("coverage", "operator", "perplexity", "retrieval", "greedy")


MAIN_METHODS = ("bf16", "hyquant_k4v4", "hyquant_k4v2", "hyquant_k2v4", "uniform4", "uniform8", "kivi4", "kivi2",
                "sparse_vl")


# HyQuant's decode cache after an exact prefill (+ VTI): what `generate` does for prompts longer than
# prefill_chunk; separates the hybrid prefill's share of the error from the cache's.
EXACT_PREFILL = "hyquant_k4v4_exact_prefill"


KNOWN_METHODS = MAIN_METHODS + (EXACT_PREFILL,)


RHOS = (0.0, 0.02, 0.05, 0.10)


WINDOWS = (0, 64, 128, 256)


SCHEMES = ("token_sym", "token_asym", "channel_key")


COMPONENTS = {"uniform (W 0, rho 0)": (0, 0.0), "window only (W 128)": (128, 0.0),
              "VL only (rho 5%)": (0, 0.05), "VL + window": (128, 0.05)}


PREFILL_METHODS = ("hyquant", "sage_int8", "sparse_vl")


# float32 matmuls in full float32 on every device: jax's default on GPUs is TF32 (10-bit mantissa), on CPU
# it is float32 already, so this makes a GPU run the computation a CPU run is.
MATMUL_PRECISION = "highest"


PREFILL_CHUNK = 512  # query rows per causal prefill chunk: hyquant_jax.eval.SharedPrefill's default


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How much of each section to run. FULL takes ~42 min on 2 CPU cores; SPEC is the full specification (--spec)."""

    coverage_lengths: tuple[int, ...] = (2048, 8192)
    coverage_windows: int = 2
    heatmap_length: int = 2048
    operator_lengths: tuple[int, ...] = (1024, 2048, 4096, 8192)
    operator_windows: int = 2
    operator_queries: int = 32
    sweep_lengths: tuple[int, ...] = (1024, 2048, 4096, 8192)
    prefill_error_lengths: tuple[int, ...] = (1024, 2048)
    ppl_prefix: int = 4096
    ppl_tokens: int = 512
    ppl_windows: int = 3
    ppl_methods: tuple[str, ...] = MAIN_METHODS + (EXACT_PREFILL,)
    retrieval_lengths: tuple[int, ...] = (2048, 4096, 8192)
    retrieval_depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    retrieval_samples: int = 1
    retrieval_tasks: tuple[str, ...] = ("needle", "multikey", "vartrack")
    retrieval_needle_only_from: int = 8192
    retrieval_methods: tuple[str, ...] = ("bf16", EXACT_PREFILL, "uniform4", "kivi4")
    greedy_prompts: int = 2
    greedy_length: int = 2048
    greedy_tokens: int = 256
    greedy_methods: tuple[str, ...] = MAIN_METHODS


FULL = Sizes()


SPEC = dataclasses.replace(FULL, retrieval_samples=10, retrieval_needle_only_from=0,
                           retrieval_methods=MAIN_METHODS[:-1], greedy_prompts=3, coverage_windows=3)


QUICK = Sizes(coverage_lengths=(1024,), coverage_windows=1, heatmap_length=1024, operator_lengths=(1024,),
              operator_windows=1, operator_queries=16, sweep_lengths=(1024,), prefill_error_lengths=(512,),
              ppl_prefix=768, ppl_tokens=48, ppl_windows=2, ppl_methods=("bf16", "hyquant_k4v4", "uniform4"),
              retrieval_lengths=(768,), retrieval_depths=(0.0, 1.0), retrieval_samples=1,
              retrieval_tasks=("needle",), retrieval_needle_only_from=0, retrieval_methods=("bf16", "hyquant_k4v4"),
              greedy_prompts=2, greedy_length=768, greedy_tokens=12, greedy_methods=("bf16", "hyquant_k4v4"))
