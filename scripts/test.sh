#!/usr/bin/env bash
# Sets up, builds (release and ASan) and runs every test suite:
#   ctest in build/ and build-asan/ (C++ unit tests; ASan proves bad input never crashes),
#   then pytest tests/integration with the venv's Python against both builds.
# Runs all suites, prints one summary line per suite, and exits non-zero if any suite failed or
# ran no test at all.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=$(realpath -m "${RESHARDFS_VENV:-/opt/reshardfs/venv}")
PYTEST_TIMEOUT_S=300  # per test
SUMMARY=()
FAILED=0

log() { printf 'test: %s\n' "$*"; }

record() {  # suite status detail
  SUMMARY+=("$(printf '%-18s %s  %s' "$1" "$2" "$3")")
  [[ $2 == PASS ]] || FAILED=1
}

run_ctest() {
  local dir=$1 rc=0 detail
  log "ctest in $dir/"
  (cd "$REPO/$dir" && ctest --output-on-failure --no-tests=error -j 2) 2>&1 | tee "$REPO/$dir/ctest.log" || rc=$?
  detail=$(grep -E 'tests passed|No tests were found' "$REPO/$dir/ctest.log" | tail -n 1 || true)
  if ((rc == 0)); then record "ctest $dir/" PASS "$detail"; else record "ctest $dir/" FAIL "${detail:-exit $rc}"; fi
}

run_pytest() {
  local rc=0 detail log_file=$REPO/build/pytest.log
  log "pytest tests/integration"
  # Bytecode goes to build/pycache, out of the source tree; setup.sh ships the venv without any,
  # so without a cache every DeepSpeed process the tests launch would compile torch and DeepSpeed
  # again (about 8 s of CPU each on 2 cores).
  (cd "$REPO" && PYTHONPYCACHEPREFIX="$REPO/build/pycache" "$VENV/bin/python" -m pytest tests/integration \
    -p no:cacheprovider -ra --timeout="$PYTEST_TIMEOUT_S") 2>&1 | tee "$log_file" || rc=$?
  detail=$(grep -E '^=+ .* in [0-9.]+s' "$log_file" | tail -n 1 | sed -E 's/^=+ (.*) =+$/\1/' || true)
  case $rc in
    0) record pytest PASS "$detail" ;;
    5) record pytest FAIL "no tests ran" ;;
    *) record pytest FAIL "${detail:-exit $rc}" ;;
  esac
}

main() {
  local start=$SECONDS
  bash "$REPO/scripts/setup.sh"
  bash "$REPO/scripts/build.sh" release
  bash "$REPO/scripts/build.sh" asan
  export RESHARDFS_BUILD_DIR=$REPO/build RESHARDFS_ASAN_BUILD_DIR=$REPO/build-asan
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
  run_ctest build
  run_ctest build-asan
  run_pytest
  log "summary ($((SECONDS - start)) s):"
  printf 'test:   %s\n' "${SUMMARY[@]}"
  ((FAILED == 0)) || { log "FAILED"; exit 1; }
  log "all suites passed"
}

main "$@"
