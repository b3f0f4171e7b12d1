#!/bin/bash
# One GPU call: e2e.py's b1 section under each XLA_FLAGS variant, one process each, merged into OUT/NAME.json
# (rows per variant; a variant XLA rejects or that fails keeps its error). Then, if HLO=1, decode_hlo_copies.py
# (compile only): every kernel-launching instruction of the bf16 and hyquant decode loop bodies.
# Defaults (session 25, ~6 min): bf16 at a 1K prefix under XLA's experimental fusion options (issue 5: can a
# fusion option cut bf16's ~25 small kernels per layer?). VARIANTS (one XLA_FLAGS value per line, "" for none)
# METHODS, PREFIXES and NAME override them, e.g. session 32's launch options (~6 min):
#   VARIANTS=$'\n--xla_gpu_enable_command_buffer=+WHILE\n--xla_gpu_require_exclusive_lock=true' \
#   METHODS=bf16,hyquant PREFIXES=1024,32768 NAME=xla_launch_flags_h200 bash benchmarks/gpu_xla_fusion_flags.sh
# Run from the repository root. CPU check of the script:
#   OUT=/tmp/x E2E_ARGS=--smoke PREFIXES=64 bash benchmarks/gpu_xla_fusion_flags.sh
set -u
OUT=${OUT:-/tmp/out}
NAME=${NAME:-xla_fusion_flags_h200}
if [ -n "${VARIANTS+x}" ]; then
  mapfile -t VARIANTS <<< "$VARIANTS"
else
  VARIANTS=(  # options this jaxlib accepts (an unknown one aborts XLA); the last is the baseline again, for spread
    ""
    "--xla_gpu_experimental_enable_triton_heroless_priority_fusion=true"
    "--xla_gpu_experimental_enable_fusion_block_level_rewriter=true"
    "--xla_gpu_experimental_all_fusions_with_triton=true"
    "--xla_gpu_experimental_enable_same_shape_multi_output_fusion=true"
    "--xla_gpu_experimental_enable_triton_heroless_priority_fusion=true --xla_gpu_experimental_enable_fusion_block_level_rewriter=true --xla_gpu_unsupported_enable_triton_multi_output_fusion=true"
    ""
  )
fi
# The runs and the merged JSON: gpu_e2e_variants.sh, every variant on the working tree with the same methods.
LINES=$(for flags in "${VARIANTS[@]}"; do echo ".|${METHODS:-bf16}|$flags"; done)
OUT="$OUT" NAME="$NAME" VARIANTS="$LINES" E2E_ARGS="${E2E_ARGS:-}" PREFIXES=${PREFIXES:-1024} STEPS=32 REPS=3 RUN_LIMIT=${RUN_LIMIT:-100} \
  bash "$(dirname "$0")/gpu_e2e_variants.sh"
export PYTHONPATH=. PYTHONUNBUFFERED=1
if [ "${HLO:-0}" = 1 ]; then
  timeout ${HLO_LIMIT:-150} python3 benchmarks/decode_hlo_copies.py --out "$OUT" --name decode_hlo_copies_h200 \
      > "$OUT/decode_hlo_copies_h200.log" 2>&1
  echo "hlo rc=$?"; grep "copies" "$OUT/decode_hlo_copies_h200.log" | head -8
fi
