"""Evaluation-only code: what the accuracy benchmark (benchmarks/accuracy/) needs on top of the library.

* `causal_prefill`: reference-path prefills whose query chunks read only the keys they can see.
* `sparse_attention`: the vertical-only sparse ablation (`VerticalSparseAttention`).
* `shared_prefill`: prefill once per prefill flavor, then build several methods' decode states from it.
* `teacher_forcing`: next-token NLL of given continuations through a method's decode path; greedy decoding
  and the teacher-forced distributions of one prompt in one loop.
* `operators`: a method's decode attention on captured states against exact attention; coverage.

Nothing in the rest of `hyquant_jax` imports this package.
"""

from hyquant_jax.eval.causal_prefill import (
    choose_vl,
    exact_causal_attention,
    hybrid_prefill,
    hybrid_prefill_causal,
    map_causal_chunks,
)
from hyquant_jax.eval.operators import (
    CaptureAttention,
    capture_qkv,
    column_mass,
    decode_operator,
    decode_operator_reference,
    relative_mse,
)
from hyquant_jax.eval.shared_prefill import (
    FLAVORS,
    PromptKV,
    SharedPrefill,
    decode_state,
    decode_states,
    prefill_flavor,
    run_prefill,
)
from hyquant_jax.eval.sparse_attention import (
    VerticalSparseAttention,
    sparse_prefill_attention,
    vertical_sparse_decode_reference,
    vertical_sparse_prefill_reference,
)
from hyquant_jax.eval.teacher_forcing import greedy_and_forced, teacher_forced_nll

__all__ = [
    "FLAVORS",
    "CaptureAttention",
    "PromptKV",
    "SharedPrefill",
    "VerticalSparseAttention",
    "capture_qkv",
    "choose_vl",
    "column_mass",
    "decode_operator",
    "decode_operator_reference",
    "decode_state",
    "decode_states",
    "exact_causal_attention",
    "greedy_and_forced",
    "hybrid_prefill",
    "hybrid_prefill_causal",
    "map_causal_chunks",
    "prefill_flavor",
    "relative_mse",
    "run_prefill",
    "sparse_prefill_attention",
    "teacher_forced_nll",
    "vertical_sparse_decode_reference",
    "vertical_sparse_prefill_reference",
]
