#!/bin/bash
# Session 41: how much does main's hyquant B=1 32K step vary between processes of one GPU call? N e2e.py
# processes of the same tree, one after the other (results/process_variance_s41.json, N=5).
# Found: 5.63 ms in the first (it compiles), 5.52-5.58 in the four that load its executable from the shared JAX
# compilation cache (e2e.worker_env); across calls main took 5.69-5.70 ms (results/e2e_after_operand*_s41.json).
# As run, each process also got --autotune-cache with its own folder; all five stayed empty, because JAX
# overrides that XLA flag with a folder inside its compilation cache (results/autotune_cache_probe_s41.log), and
# the option was removed.
#   bash benchmarks/gpu_s41_process_variance.sh   (~30 s a process once the first has compiled)
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
for i in $(seq 0 $((${N:-5} - 1))); do
  PYTHONPATH=. timeout 150 python3 benchmarks/e2e.py --out "$OUT/runs" --name "p$i" --sections b1 --methods hyquant \
    --prefixes 32768 --steps 64 --reps 4 --no-plot ${E2E_ARGS:-} >> "$OUT/process_variance_s41.log" 2>&1
  echo "p$i rc=$? $(grep -A2 '^B=1' "$OUT/process_variance_s41.log" | tail -1)"
done
python3 - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
runs = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(out, "runs", "p*.json")))]
json.dump({"note": "main, hyquant B=1 32K, one process after the other in one GPU call (session 41)",
           "runs": [{"b1": r["b1"], "environment": r["environment"]} for r in runs]},
          open(os.path.join(out, "process_variance_s41.json"), "w"), indent=1)
PY
rm -rf "$OUT/runs"
