#!/usr/bin/env bash
# Sets up, builds (release and ASan) and runs every test suite, in one of two tiers:
#   bash scripts/test.sh          the default tier (the README's test command; .ci/run calls it): ctest in build/
#                                 and build-asan/ (C++ unit tests; ASan proves bad input never crashes), then
#                                 pytest tests/integration with a smoke set of real DeepSpeed launches, compared
#                                 against the committed goldens of DeepSpeed's reference runs (tests/goldens);
#                                 then the libFuzzer harnesses of tests/fuzz, 20 s each (scripts/fuzz.sh, after
#                                 its clang build: ~5 min here). Fails when a suite ran fewer tests than
#                                 tests/tier_floor.txt says.
#   bash scripts/test.sh --full   every test: the whole real-DeepSpeed matrix, reference runs live, and every
#                                 golden re-recorded and compared byte for byte with the committed one; the
#                                 fuzz harnesses 60 s each.
# Runs all suites, prints one summary line per suite (result, tests run, wall time) and the pytest log's slowest
# tests (build/pytest.log), and exits non-zero if any suite failed or ran no test at all.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=$(realpath -m "${RESHARDFS_VENV:-/opt/reshardfs/venv}")
PYTEST_TIMEOUT_S=300  # per test
FUZZ_SECONDS=20  # per harness; --full: 60
FLOOR_FILE=tests/tier_floor.txt
TIER=default
SUMMARY=()
declare -A RAN=()
FAILED=0

log() { printf 'test: %s\n' "$*"; }

record() {  # suite status tests-run seconds detail; the suite's RAN key is its name without spaces or slashes
  local key=${1//\//}
  RAN[${key// /-}]=$3
  SUMMARY+=("$(printf '%-18s %s  %5s tests  %5s s  %s' "$1" "$2" "$3" "$4" "$5")")
  [[ $2 == PASS ]] || FAILED=1
}

run_ctest() {
  local dir=$1 rc=0 detail ran start=$SECONDS
  log "ctest in $dir/"
  (cd "$REPO/$dir" && ctest --output-on-failure --no-tests=error -j 2) 2>&1 | tee "$REPO/$dir/ctest.log" || rc=$?
  detail=$(grep -E 'tests passed|No tests were found' "$REPO/$dir/ctest.log" | tail -n 1 || true)
  ran=$(sed -nE 's/.* out of ([0-9]+)$/\1/p' <<<"$detail")
  if ((rc == 0)); then
    record "ctest $dir/" PASS "${ran:-0}" $((SECONDS - start)) "$detail"
  else
    record "ctest $dir/" FAIL "${ran:-0}" $((SECONDS - start)) "${detail:-exit $rc}"
  fi
}

run_pytest() {
  local rc=0 detail ran start=$SECONDS log_file=$REPO/build/pytest.log tier_flag=()
  [[ $TIER == full ]] && tier_flag=(--full)
  log "pytest tests/integration ($TIER tier)"
  # Bytecode goes to build/pycache, out of the source tree; setup.sh ships the venv without any,
  # so without a cache every DeepSpeed process the tests launch would compile torch and DeepSpeed
  # again (import deepspeed: 9 s of CPU without, 3.7 s with, measured here). An inherited
  # PYTHONDONTWRITEBYTECODE would keep the cache from ever being written.
  (cd "$REPO" && unset PYTHONDONTWRITEBYTECODE &&
    PYTHONPYCACHEPREFIX="$REPO/build/pycache" "$VENV/bin/python" -m pytest tests/integration \
    "${tier_flag[@]}" -p no:cacheprovider -ra --durations=40 --timeout="$PYTEST_TIMEOUT_S") 2>&1 |
    tee "$log_file" || rc=$?
  detail=$(grep -E '^=+ .* in [0-9.]+s' "$log_file" | tail -n 1 | sed -E 's/^=+ (.*) =+$/\1/' || true)
  ran=$(( $(sed -nE 's/.*\b([0-9]+) passed.*/\1/p' <<<"$detail" || true) + 0 ))
  ran=$(( ran + $(sed -nE 's/.*\b([0-9]+) failed.*/\1/p' <<<"$detail" || true) + 0 ))
  case $rc in
    0) record pytest PASS "$ran" $((SECONDS - start)) "$detail" ;;
    5) record pytest FAIL 0 $((SECONDS - start)) "no tests ran" ;;
    *) record pytest FAIL "$ran" $((SECONDS - start)) "${detail:-exit $rc}" ;;
  esac
}

run_fuzz() {
  local rc=0 ran start=$SECONDS log_file=$REPO/build-fuzz/fuzz.log
  log "fuzz: every harness for $FUZZ_SECONDS s (fuzz.sh installs clang-16 and builds build-fuzz/ first)"
  mkdir -p "$REPO/build-fuzz"
  bash "$REPO/scripts/fuzz.sh" "$FUZZ_SECONDS" 2>&1 | tee "$log_file" || rc=$?
  ran=$(grep -cE '^fuzz: +fuzz_[a-z_]+ +PASS' "$log_file" || true)
  if ((rc == 0)); then
    record fuzz PASS "$ran" $((SECONDS - start)) "harnesses, $FUZZ_SECONDS s each (build-fuzz/fuzz.log)"
  else
    record fuzz FAIL "$ran" $((SECONDS - start)) "exit $rc (build-fuzz/fuzz.log)"
  fi
}

# The default tier must not shrink silently: each suite runs at least the number tests/tier_floor.txt names.
check_floor() {
  local suite floor
  while read -r suite floor _; do
    [[ -z $suite || $suite == \#* ]] && continue
    if ((${RAN[$suite]:-0} < floor)); then
      log "FLOOR: $suite ran ${RAN[$suite]:-0} tests, fewer than the $floor that $FLOOR_FILE names"
      FAILED=1
    fi
  done <"$REPO/$FLOOR_FILE"
}

timed() {  # what command...: runs it and adds its wall time to the summary
  local what=$1 start=$SECONDS
  shift
  "$@"
  SUMMARY+=("$(printf '%-18s %s  %5s        %5s s' "$what" done "" $((SECONDS - start)))")
}

usage() {
  echo "usage: bash scripts/test.sh [--full]" >&2
  exit 2
}

main() {
  local start=$SECONDS
  case ${1:-} in
    "") ;;
    --full) TIER=full FUZZ_SECONDS=60 ;;
    *) usage ;;
  esac
  (($# <= 1)) || usage
  timed setup bash "$REPO/scripts/setup.sh"
  timed "build release" bash "$REPO/scripts/build.sh" release
  timed "build asan" bash "$REPO/scripts/build.sh" asan
  export RESHARDFS_BUILD_DIR=$REPO/build RESHARDFS_ASAN_BUILD_DIR=$REPO/build-asan
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
  run_ctest build
  run_ctest build-asan
  run_pytest
  run_fuzz
  [[ $TIER == default ]] && check_floor
  local total=$(( ${RAN[ctest-build]:-0} + ${RAN[ctest-build-asan]:-0} + ${RAN[pytest]:-0} + ${RAN[fuzz]:-0} ))
  log "summary, $TIER tier ($((SECONDS - start)) s, $total tests):"
  printf 'test:   %s\n' "${SUMMARY[@]}"
  ((FAILED == 0)) || { log "FAILED"; exit 1; }
  log "all suites passed"
}

main "$@"
