#!/bin/bash
# One GPU call (~5 min) for issue 5's overheads: (1) the kernel breakdown of one whole-prompt prefill at 4K,
# bf16 against hyquant through the Mosaic prefill kernel; (2) the decode step at B=1 1K with XLA's optimized
# HLO dumped, and the `copy` instructions of the decode loop listed (the ~118 `memcpy32_post` per step).
# Run on the GPU box from the repository root:  bash benchmarks/gpu_e2e_overhead_check.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=. PYTHONUNBUFFERED=1
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
