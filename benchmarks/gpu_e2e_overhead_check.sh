#!/bin/bash
# One GPU call (~7 min) for the overheads around the kernels: (0) the kernel breakdown of one prefill attention
# call at 16K (issue 4: the glue's XLA kernels around the Mosaic kernel, against cuDNN); (1) the kernel breakdown
# of one whole-prompt prefill at 4K, bf16 against hyquant through the Mosaic prefill kernel; (2) the decode step
# at B=1 1K with XLA's optimized HLO dumped, and the `copy` instructions of the decode loop listed (the ~118
# `memcpy32_post` per step).
# Run on the GPU box from the repository root:  bash benchmarks/gpu_e2e_overhead_check.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=. PYTHONUNBUFFERED=1
if [ "${KERNEL_PROFILE:-1}" = 1 ]; then  # KERNEL_PROFILE=0 skips (0)
M=hybrid_e2e_mosaic,hybrid_int8_mgpu_2wg_fast_pp,hybrid_int8_mgpu_kernel,cudnn_bf16
timeout 150 python3 benchmarks/prefill_kernel.py --out "$OUT" --name profile_prefill_16k --no-sweep --no-layers \
    --tuning 128,64,8,3 --lengths 16384 --methods $M --trace $M > "$OUT/profile_prefill_16k.log" 2>&1
echo "prefill kernel profile rc=$?"
python3 - "$OUT/profile_prefill_16k.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["results"]["16384"]
for name, r in rows.items():
    t = r.get("trace") or {}
    print(f"{name}: {r.get('loop_ms', float('nan')):.3f} ms/call in the loop; one call: "
          f"{t.get('kernels_per_step', 0):.0f} kernels, {t.get('kernel_us_per_step', 0):.0f} us")
    for k in t.get("top", [])[:10]:
        print(f"   {k['us_per_step']:8.1f} us x{k['launches_per_step']:.0f} {k['name'][:80]}")
PY
fi
timeout 200 python3 benchmarks/profile_e2e.py --out "$OUT" --name profile_e2e_prefill_4k --sections prefill \
    --prefixes 4096 --methods bf16,hyquant --prefill-backend mosaic --prefill-block 128 --top 40 \
    > "$OUT/profile_e2e_prefill_4k.log" 2>&1
echo "prefill profile rc=$?"; tail -50 "$OUT/profile_e2e_prefill_4k.log"
XLA_FLAGS="--xla_dump_to=/tmp/hlo --xla_dump_hlo_as_text --xla_dump_hlo_pass_re=^$" timeout 200 \
    python3 benchmarks/profile_e2e.py --out "$OUT" --name profile_e2e_decode_1k --prefixes 1024 --methods hyquant \
    --steps 8 --top 40 > "$OUT/profile_e2e_decode_1k.log" 2>&1
echo "decode profile rc=$?"; tail -20 "$OUT/profile_e2e_decode_1k.log"
f=$(ls -S /tmp/hlo/*decode*after_optimizations.txt 2>/dev/null | head -1)
if [ -n "$f" ]; then
    gzip -c "$f" > "$OUT/decode_after_optimizations.txt.gz"
    awk '/^[%a-zA-Z].*\{$|^ENTRY/{comp=$1} / copy\(/{print comp " :: " $0}' "$f" | sed -E 's/, metadata=.*//' \
        > "$OUT/decode_copies.txt"
    echo "copies in the decode module: $(wc -l < "$OUT/decode_copies.txt")"
    cut -d' ' -f1 "$OUT/decode_copies.txt" | sort | uniq -c | sort -rn | head
fi
