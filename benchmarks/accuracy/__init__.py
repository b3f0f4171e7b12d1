"""Accuracy of HyQuant vs the paper's baselines on SmolLM2-135M: coverage, operator error, perplexity, retrieval.

  python -m benchmarks.accuracy [--quick | --spec] [--sections coverage,operator,perplexity,retrieval,greedy]
  hyquant eval accuracy [--quick]                       (the same script)
  python -m benchmarks.accuracy --summary-only benchmarks/results/accuracy_cpu.json
  python -m benchmarks.accuracy --combine-retrieval PART.json... --out ALL.json   (retrieval run in pieces)

Every method runs through the same model code (`models.Decoder`) and the
model-facing attention implementations, on the jnp reference path (XLA on any
device; float32 matmuls at full precision and float32 P.V, so a GPU run computes
what a CPU run does):

  bf16            exact attention, bf16 KV cache
  hyquant_k4v4    HyQuant (default HyQuantConfig: channel_key scheme, rho 5%, W 128); also _k4v2, _k2v4
  uniform4/8      every cached token per-token symmetric low-bit, no VL, no window
  kivi4/2         per-channel keys (32-token groups), per-token values, 128-token bf16 residual
  sparse_vl       vertical-only sparse: HyQuant's VL set + window kept, every other key dropped

Sections (results/accuracy_<device>.json, PNGs next to it):
  coverage    share of causal attention mass on the top-1% / top-5% key columns and top-5% + a 128-token
              local window per layer (paper Table 1), plus what HyQuant's own VL set + window covers;
              attention heatmaps with the chosen VL columns (paper Fig. 1)
  operator    relative MSE of each layer's decode attention output vs exact float32 attention on q/k/v
              captured from the model (paper Fig. 2 / B.5): the prompt is frozen into each method's cache,
              the next tokens are appended and attended one by one; rho / W / scheme / component sweeps
              (paper Tables 10, 11); the prefill operators at the shorter lengths (paper Fig. 5)
  perplexity  WikiText-2: a prefix through each method's prefill, then tokens teacher-forced through its
              decode path (where the cache compression acts); NLL and perplexity per window
  retrieval   needle (7-digit number), multi-key UUID pairs, variable tracking (RULER-style) at several
              lengths x depths; exact match (the answer string appears in the greedy output)
  greedy      share of greedy tokens identical to bf16 over long essay-summary prompts

Prefills are shared: bf16, the quantized baselines and hyquant_k4v4_exact_prefill prefill exactly (one run
serves all of them), the three HyQuant bit widths share one hybrid prefill; each method then runs its own
Freeze and decode.
--quick runs a reduced version in a few minutes (the CI test). The full default sizes are what 2 CPU cores
finish in about 42 min; the JSON lists every reduction against the full specification (SPEC). --spec runs
the specification's sizes (on one H200: `bash benchmarks/gpu.sh accuracy`, with --dtype float32 as on CPU).
Modules: settings (data, method names, Sizes), options (flags), methods, captures, one module per section
(coverage, operator_error, perplexity, retrieval, generation for greedy), summary (targets, Markdown), run
(the sections in order, --combine-retrieval, --summary-only), tasks (the retrieval and greedy data), plots.
"""
