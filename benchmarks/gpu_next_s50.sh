#!/bin/bash
# Prepared in session 50 (its device time was spent on gpu_next_s48.sh) for the next GPU session: the fused
# chunked-prefill attention kernel (`pallas_kernels/prefix.py`, `chunk_impl="pallas"`), checked so far only in
# Pallas interpret mode on the CPU. One GPU call per PART (H100 or H200; the JSONs record the device).
# PART=k (~5 min): the kernel's GPU tests (compiled Triton kernel at the Qwen3-8B head shape against the XLA
#   path and the float64 oracle), then one layer's attention over a 32K prompt's 2048-token chunks (XLA key
#   blocks / all slots / the kernel at its default launch and five others, with the kernel's difference from
#   XLA on the last chunk), then e2e's
#   chunked 32K prefill with each chunk attention (session 50 measured 3.9 s chunked with XLA against 1.3 s
#   whole). If the kernel is correct and faster, make it the default (`chunk_impl`) and re-time.
# PART=l (~6 min): the same at a 128K prompt: e2e's chunked prefill, kernel then XLA (one timed run each).
# PART=m (~8 min): session 51's check of the new default (see below).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
case "${PART:-k}" in
k)
  PYTHONPATH=. timeout 200 python3 -m pytest -q -m gpu tests/test_prefix_kernel.py > "$OUT/prefix_kernel_gpu_tests.log" 2>&1
  echo "tests rc=$?"; tail -3 "$OUT/prefix_kernel_gpu_tests.log"
  PYTHONPATH=. timeout 200 python3 benchmarks/chunked_prefill_attention.py --out "$OUT" \
    --name chunked_prefill_attention_pallas --prompt 32768 --chunk 2048 --reps 3 --pallas \
    --pallas-launches "128,64,8,2;128,64,4,2;64,64,4,3;128,128,8,2;64,32,4,2" \
    > "$OUT/chunked_prefill_attention_pallas.log" 2>&1
  echo "attention rc=$?"; tail -11 "$OUT/chunked_prefill_attention_pallas.log"
  for impl in pallas xla; do
    PYTHONPATH=. timeout 150 python3 benchmarks/e2e.py --out "$OUT" --name e2e_chunked_prefill_$impl --sections prefill \
      --methods bf16,hyquant --prefill-prefixes 32768 --prefill-chunk 2048 --chunk-impl $impl --reps 2 --no-plot \
      > "$OUT/e2e_chunked_prefill_$impl.log" 2>&1
    echo "e2e $impl rc=$?"; grep -A3 "^prefill" "$OUT/e2e_chunked_prefill_$impl.log"
  done
  ;;
l)
  for impl in pallas xla; do
    PYTHONPATH=. timeout 280 python3 benchmarks/e2e.py --out "$OUT" --name e2e_chunked_prefill_128k_$impl \
      --sections prefill --methods hyquant --prefill-prefixes 131072 --prefill-chunk 2048 --chunk-impl $impl \
      --reps 1 --no-plot > "$OUT/e2e_chunked_prefill_128k_$impl.log" 2>&1
    echo "e2e 128K $impl rc=$?"; grep -A2 "^prefill" "$OUT/e2e_chunked_prefill_128k_$impl.log"
  done
  ;;
m)
  # Prepared in session 51 (no device lent after its first call), after the kernel became chunk_impl "auto"'s
  # choice on the GPU: its GPU tests (with "auto", and block_q 128 against the references: if they pass and the
  # sweep confirms 128 rows faster, make 128 the default), the launch sweep around the default, e2e's chunked
  # 32K and 128K prefill with the defaults, 128K with XLA's chunk attention (hyquant), the whole 128K prompt.
  PYTHONPATH=. timeout 200 python3 -m pytest -q -m gpu tests/test_prefix_kernel.py > "$OUT/prefix_kernel_gpu_tests_s51.log" 2>&1
  echo "tests rc=$?"; tail -1 "$OUT/prefix_kernel_gpu_tests_s51.log"
  PYTHONPATH=. timeout 200 python3 benchmarks/chunked_prefill_attention.py --out "$OUT" \
    --name chunked_prefill_attention_pallas_s51 --prompt 32768 --chunk 2048 --reps 3 --pallas \
    --pallas-launches "64,64,4,2;128,64,4,3;128,64,8,3;128,32,4,2;128,64,4,2" \
    > "$OUT/chunked_prefill_attention_pallas_s51.log" 2>&1
  echo "attention rc=$?"; tail -10 "$OUT/chunked_prefill_attention_pallas_s51.log"
  PYTHONPATH=. timeout 150 python3 benchmarks/e2e.py --out "$OUT" --name e2e_chunked_prefill_auto_s51 --sections prefill \
    --methods bf16,hyquant --prefill-prefixes 32768 --prefill-chunk 2048 --reps 2 --no-plot \
    > "$OUT/e2e_chunked_prefill_auto_s51.log" 2>&1
  echo "e2e 32K rc=$?"; grep -A3 "^prefill" "$OUT/e2e_chunked_prefill_auto_s51.log"
  PYTHONPATH=. timeout 200 python3 benchmarks/e2e.py --out "$OUT" --name e2e_chunked_prefill_128k_auto_s51 \
    --sections prefill --methods bf16,hyquant --prefill-prefixes 131072 --prefill-chunk 2048 --reps 1 --no-plot \
    > "$OUT/e2e_chunked_prefill_128k_auto_s51.log" 2>&1
  echo "e2e 128K auto rc=$?"; grep -A3 "^prefill" "$OUT/e2e_chunked_prefill_128k_auto_s51.log"
  PYTHONPATH=. timeout 200 python3 benchmarks/e2e.py --out "$OUT" --name e2e_chunked_prefill_128k_xla_s51 \
    --sections prefill --methods hyquant --prefill-prefixes 131072 --prefill-chunk 2048 --chunk-impl xla --reps 1 \
    --no-plot > "$OUT/e2e_chunked_prefill_128k_xla_s51.log" 2>&1
  echo "e2e 128K xla rc=$?"; grep -A2 "^prefill" "$OUT/e2e_chunked_prefill_128k_xla_s51.log"
  PYTHONPATH=. timeout 120 python3 benchmarks/e2e.py --out "$OUT" --name e2e_whole_prefill_128k_s51 \
    --sections prefill --methods bf16,hyquant --prefill-prefixes 131072 --reps 1 --no-plot \
    > "$OUT/e2e_whole_prefill_128k_s51.log" 2>&1
  echo "e2e 128K whole rc=$?"; grep -A3 "^prefill" "$OUT/e2e_whole_prefill_128k_s51.log"; tail -3 "$OUT/e2e_whole_prefill_128k_s51.log"
  ;;
esac
