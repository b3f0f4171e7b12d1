#!/bin/bash
# Session 38, call 3 (~9 min). Carry .gpu_run (written first by `python benchmarks/mosaic_ablation_variants.py`).
# Call 2 found the low-bit kernel's B=1 loop within ~25% of its own streaming floor (copy_only), which moved
# pages at only ~2.8 TB/s: is that the TMA boxes' 64-byte rows? (A) the floor and the kernel with the codes
# copied as wide boxes (keys [16, 256] bytes, values [32, 128] with the 128-byte swizzle; `wide`), one
# process. (B) the GPU oracle tests of the kernel with `wide` in place of the module (this copy of the tree
# only). (C) if they pass and `wide` is >= 5% faster at B1 128K: e2e.py's B=1 rows at 32K and 128K with it.
# Run on the GPU box from the repository root: bash benchmarks/gpu_s38_wide.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
variants=()
for name in copy_only copy_only_wide wide_keys wide; do
  variants+=(--variant ".gpu_run/ablation/$name.py")
done
timeout ${A_LIMIT:-150} python3 benchmarks/decode_mgpu_ab.py "${variants[@]}" --cases 1x32768,1x131072,16x32768 \
  --per-sm 2 --out "$OUT" --name mosaic_wide_s38 > "$OUT/mosaic_wide_s38.log" 2>&1
echo "ab rc=$?"
gain=$(python3 - "$OUT/mosaic_wide_s38.log" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
for r in rows:
    print(f"{r['batch']:>3} {r['context']:>7} {r['kernel']:>15} {r['ms']:.4f} diff {r['max_rel_diff_vs_first']:.2e}",
          file=sys.stderr)
ms = {r["kernel"]: r["ms"] for r in rows if (r["batch"], r["context"]) == (1, 131072)}
base = min(ms.get("current", 1e9), ms.get("current_again", 1e9))
print(1 if "wide" in ms and ms["wide"] < 0.95 * base else 0)
PY
)
echo "wide faster at B1 128K: $gain"
cp .gpu_run/ablation/wide.py pallas_kernels/decode_mgpu.py
timeout ${T_LIMIT:-150} python3 -m pytest -m gpu tests/test_decode_mgpu.py -q -x -p no:cacheprovider -rA -k gpu_kernel \
  > "$OUT/mosaic_wide_s38_gpu_tests.log" 2>&1
rc=$?
echo "tests rc=$rc"; grep -E "passed|failed|Error" "$OUT/mosaic_wide_s38_gpu_tests.log" | tail -4 | cut -c1-300
if [ $rc -eq 0 ] && [ "$gain" = "1" ]; then
  timeout ${B_LIMIT:-290} python3 benchmarks/e2e.py --out "$OUT" --name e2e_s38_wide_b1 --sections b1 \
    --methods bf16,hyquant --prefixes 32768,131072 --steps 64 --reps 3 --no-plot > "$OUT/e2e_s38_wide_b1.log" 2>&1
  echo "e2e rc=$?"; grep -A5 "B=1 decode" "$OUT/e2e_s38_wide_b1.log"
fi
git checkout pallas_kernels/decode_mgpu.py 2>/dev/null || true
