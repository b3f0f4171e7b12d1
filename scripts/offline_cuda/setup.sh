#!/bin/bash
# Tools to compile Mosaic GPU kernels to PTX and SASS on a machine without a GPU (benchmarks/mosaic_sass.py),
# into .offline_cuda/ (git-ignored, ~700 MB unpacked): the CUDA 13 plugin of jax 0.11.2 (its Mosaic GPU
# compiler and runtime library), CUDA 13.0's ptxas (the GPU box has /usr/local/cuda-13.0), nvdisasm, and a
# libcuda stub built from libcuda_stub.c. Needs pip access to PyPI and a C compiler. Run from the repository
# root:  bash scripts/offline_cuda/setup.sh
set -euo pipefail
DEST=.offline_cuda
PIP=${PIP:-.venv/bin/pip}
mkdir -p "$DEST/wheels"
"$PIP" download --no-deps -q -d "$DEST/wheels" jax-cuda13-pjrt==0.11.2 jax-cuda13-plugin==0.11.2 \
    nvidia-cuda-nvcc==13.0.88 nvidia-cuda-nvdisasm==13.2.51
for w in "$DEST"/wheels/*.whl; do python3 -m zipfile -e "$w" "$DEST/root"; done
CUDA="$DEST/root/nvidia/cu13"
chmod +x "$CUDA"/bin/* 2>/dev/null || true
mkdir -p "$DEST/lib"
cc -shared -fPIC -O2 -o "$DEST/lib/libcuda.so.1" scripts/offline_cuda/libcuda_stub.c
"$CUDA/bin/ptxas" --version | tail -1
echo "ready: $DEST"
