#!/usr/bin/env bash
# Configures and builds reshardfs with CMake + Ninja.
#   bash scripts/build.sh [release]   -> build/       RelWithDebInfo, warnings are errors
#   bash scripts/build.sh asan        -> build-asan/  Debug with AddressSanitizer + UBSan, without the CUDA
#                                                     backend (nvcc takes no sanitizer flags) and without the
#                                                     Python extension (the tests import release's)
#   bash scripts/build.sh fuzz        -> build-fuzz/  the libFuzzer harnesses of tests/fuzz only, clang-16 -O1 with
#                                                     ASan + UBSan + coverage and asserts (setup.sh --fuzz installs it)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
JOBS=2

log() { printf 'build: %s\n' "$*"; }
die() { printf 'build: error: %s\n' "$*" >&2; exit 1; }

# A build dir configured by another generator cannot be reused: start it afresh.
drop_foreign_cache() {
  local dir=$1
  if [[ -f $dir/CMakeCache.txt ]] && ! grep -qx 'CMAKE_GENERATOR:INTERNAL=Ninja' "$dir/CMakeCache.txt"; then
    log "$dir was configured with another generator; removing it"
    rm -rf "$dir"
  fi
}

main() {
  local mode=${1:-release} dir flags target=()
  case $mode in
    release)
      dir=$REPO/build
      flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DRESHARDFS_WERROR=ON) ;;
    asan)
      dir=$REPO/build-asan
      flags=(-DCMAKE_BUILD_TYPE=Debug -DRESHARDFS_SANITIZE=ON -DRESHARDFS_WERROR=ON -DRESHARDFS_CUDA=OFF
             -DRESHARDFS_PYTHON=OFF) ;;
    fuzz)
      dir=$REPO/build-fuzz
      target=(--target fuzzers)
      # -O1 and line tables only: half the compile time of -O2 -g, and asserts stay on (no NDEBUG).
      flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang-16 -DCMAKE_CXX_COMPILER=clang++-16
             "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only" -DRESHARDFS_FUZZ=ON -DRESHARDFS_WERROR=ON -DRESHARDFS_CUDA=OFF -DRESHARDFS_PYTHON=OFF
             -DRESHARDFS_BUILD_TESTS=OFF) ;;
    *) die "unknown mode '$mode' (usage: build.sh [release|asan|fuzz])" ;;
  esac
  drop_foreign_cache "$dir"
  log "$mode -> ${dir#"$REPO"/}"
  cmake -S "$REPO" -B "$dir" -G Ninja "${flags[@]}"
  cmake --build "$dir" -j "$JOBS" "${target[@]}"
  log "$mode ok"
}

main "$@"
