#!/usr/bin/env bash
# The GPU check of gpu/'s CUDA backend (issue 6): builds gpu/tools/gpu_check with nvcc alone and
# runs it: a synthetic ~1.5 GiB restore plan into device memory with the CUDA backend, compared
# byte for byte (and by CRC-32) with the host backend, and timed against a pinned cudaMemcpy.
#   bash scripts/gpu_check.sh [GiB]          default 1.5; about a minute on one H200
# It needs no CMake project dependencies (FUSE, spdlog, CLI11 are absent on bare GPU machines):
# only nvcc, its host C++ compiler, libz.so.1, and zlib.h (set ZLIB_INCLUDE to a folder holding
# zlib.h and zconf.h where the system has none). CMake builds the same program as
# build/gpu/reshardfs_gpu_check whenever it finds nvcc.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${GPU_CHECK_BUILD:-$REPO/build-gpu-check}
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
SOURCES=(reshard/base/status.cc reshard/format/dtype.cc reshard/view/gather.cc reshard/view/dtype_convert.cc
  reshard/plan/extent.cc gpu/read_schedule.cc gpu/executor.cc gpu/host_backend.cc gpu/cuda_backend.cu
  gpu/tools/gpu_check.cc)

mkdir -p "$OUT"
start=$SECONDS
"$NVCC" -std=c++20 -O3 -arch=sm_90 -I"$REPO" ${ZLIB_INCLUDE:+-I"$ZLIB_INCLUDE"} -Xcompiler -pthread \
  "${SOURCES[@]/#/$REPO/}" -o "$OUT/gpu_check" -l:libz.so.1
echo "gpu_check.sh: built in $((SECONDS - start)) s with $("$NVCC" --version | tail -n 1)"
"$OUT/gpu_check" --gib "${1:-1.5}" "${@:2}"
