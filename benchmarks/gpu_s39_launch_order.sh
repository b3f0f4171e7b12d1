#!/bin/bash
# Session 39, call 2 (~7 min). Session 36's graph profile (B=1 32K, one layer): the ring append (6.7 us, one
# block) runs next to the Mosaic low-bit kernel, the Triton VL/ring launch waits for the append and ends ~7 us
# after the Mosaic kernel, and the merge waits for both. Two launch orders, each forced by a data dependency
# that changes no value (results/decode_order_{append_first,triton_first}.patch; build the trees with
# `bash benchmarks/prepare_patched_tree.sh NAME` and carry .gpu_run):
#   append_first: the Mosaic kernel reads the appended ring's counter, so the append runs before both launches;
#   triton_first: the Mosaic kernel reads the Triton launch's denominators, so the two launches run in turn.
# e2e B=1 at 32K and 128K, bf16 and hyquant in each process, main first.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
VARIANTS=$'.|bf16,hyquant|\n.gpu_run/decode_order_append_first|bf16,hyquant|\n.gpu_run/decode_order_triton_first|bf16,hyquant|' \
  PREFIXES=32768,131072 STEPS=64 REPS=3 RUN_LIMIT=180 NAME=e2e_launch_order_s39 bash benchmarks/gpu_e2e_variants.sh
