#!/bin/bash
# Needs the patched tree: `bash benchmarks/prepare_patched_tree.sh decode_fixed_runs`, then run with .gpu_run carried.
# session 35 call 3: nested loops with the fixed-trip-count run (decode_fixed_runs.patch) against main
export PYTHONUNBUFFERED=1
for t in . .gpu_run/decode_fixed_runs; do
  tag=$( [ "$t" = . ] && echo main || echo fixed )
  (cd $t && PYTHONPATH=. timeout 200 python3 benchmarks/step_ablation_probe.py --out $OUT --name step_ablation_s35_$tag \
     --variants static,static_flat,hyquant --prefixes 1024 --steps 64 --reps 3 --no-plot) > $OUT/step_ablation_s35_$tag.log 2>&1
  echo "$tag rc=$?"; grep -E "^ +1024" $OUT/step_ablation_s35_$tag.log
done
(cd .gpu_run/decode_fixed_runs && TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=command_buffer_thunk=3,while_thunk=3 PYTHONPATH=. \
  timeout 120 python3 benchmarks/step_ablation_probe.py --out $OUT/vlog --variants static,static_flat --prefixes 1024 \
  --steps 64 --reps 1 --no-plot) > $OUT/step_ablation_s35_vlog_fixed.txt 2>&1
echo "vlog rc=$?"; python3 benchmarks/vlog_command_buffers.py $OUT/step_ablation_s35_vlog_fixed.txt > $OUT/step_ablation_s35_vlog_fixed_summary.txt 2>&1
grep -o "trip_count=[-0-9]*" $OUT/step_ablation_s35_vlog_fixed.txt | sort | uniq -c; grep -c "condition_result" $OUT/step_ablation_s35_vlog_fixed.txt
gzip $OUT/step_ablation_s35_vlog_fixed.txt; rm -rf $OUT/vlog
