#!/usr/bin/env bash
# Builds the libFuzzer harnesses of tests/fuzz (build-fuzz/, clang-16 with ASan + UBSan) and runs each one.
#   bash scripts/fuzz.sh [SECONDS] [HARNESS...]      each harness for SECONDS of wall time (default 20)
#   bash scripts/fuzz.sh --runs N [HARNESS...]       each harness for N executions (the long runs)
# Before fuzzing, every committed regression input (tests/fuzz/regressions/<harness>/) is run once: each is an
# input that once crashed or hung a harness. Seeds come from the committed checkpoints and fixtures
# (tests/fuzz/make_seeds.py); the corpus grown by earlier runs is kept in build-fuzz/corpus/<harness>/.
# A crash, leak, sanitizer report, timeout (10 s per input) or RSS above 2 GB fails the harness; its input is
# saved under build-fuzz/findings/<harness>/. Prints one line per harness (executions, coverage, corpus) and
# exits non-zero if any harness failed.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$REPO/build-fuzz
HARNESSES=(fuzz_pickle fuzz_zip fuzz_torch_archive fuzz_param_state fuzz_checkpoint fuzz_config fuzz_safetensors)
declare -A DICTS=([fuzz_pickle]="pickle" [fuzz_zip]="zip" [fuzz_torch_archive]="zip pickle"
  [fuzz_param_state]="zip pickle" [fuzz_checkpoint]="zip pickle" [fuzz_config]="config" [fuzz_safetensors]="safetensors")
SUMMARY=()
FAILED=0

log() { printf 'fuzz: %s\n' "$*"; }
die() { printf 'fuzz: error: %s\n' "$*" >&2; exit 2; }

usage() {
  sed -n '3,4p' "${BASH_SOURCE[0]}" | sed 's/^# *//' >&2
  exit 2
}

# The last value libFuzzer printed for `key` in its log ("cov: 123" or "stat::number_of_executed_units: 456").
stat_of() {
  local key=$1 log_file=$2
  grep -oE "$key:? [0-9]+" "$log_file" | tail -n 1 | grep -oE '[0-9]+$' || echo "?"
}

run_harness() {
  local harness=$1 budget=$2 exe=$BUILD/tests/fuzz/$1 corpus=$BUILD/corpus/$1 findings=$BUILD/findings/$1
  local log_file=$BUILD/$1.log dict=$BUILD/dicts/$1.dict regressions=$REPO/tests/fuzz/regressions/$1 rc=0
  local start=$SECONDS
  mkdir -p "$corpus" "$findings" "$BUILD/dicts"
  local part
  : >"$dict"
  for part in ${DICTS[$harness]}; do cat "$REPO/tests/fuzz/dicts/$part.dict" >>"$dict"; done
  : >"$log_file"
  if [[ -d $regressions ]] && compgen -G "$regressions/*" >/dev/null; then
    log "$harness: the committed regression inputs"
    "$exe" -timeout=10 -rss_limit_mb=2048 "$regressions"/* >>"$log_file" 2>&1 || rc=$?
  fi
  if ((rc == 0)); then
    log "$harness: fuzzing ($budget)"
    # shellcheck disable=SC2086  # $budget is one libFuzzer flag
    "$exe" $budget -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -dict="$dict" \
      -artifact_prefix="$findings/" "$corpus" "$BUILD/seeds/$harness" >>"$log_file" 2>&1 || rc=$?
  fi
  local line
  line=$(printf '%-20s %s  %10s execs  cov %6s  ft %6s  corpus %6s  %5s s' "$harness" \
    "$( ((rc == 0)) && echo PASS || echo FAIL)" "$(stat_of 'stat::number_of_executed_units' "$log_file")" \
    "$(stat_of cov "$log_file")" "$(stat_of ft "$log_file")" "$(find "$corpus" -type f | wc -l)" \
    $((SECONDS - start)))
  SUMMARY+=("$line")
  if ((rc != 0)); then
    FAILED=1
    log "$harness FAILED (exit $rc): the end of ${log_file#"$REPO"/}:"
    tail -n 40 "$log_file" >&2
    log "inputs that failed are in ${findings#"$REPO"/}/; commit each to tests/fuzz/regressions/$harness/ with its fix"
  fi
}

main() {
  local budget="-max_total_time=20" selected=()
  if [[ ${1:-} == --runs ]]; then
    [[ ${2:-} =~ ^[0-9]+$ ]] || usage
    budget="-runs=$2"
    shift 2
  elif [[ ${1:-} =~ ^[0-9]+$ ]]; then
    budget="-max_total_time=$1"
    shift
  fi
  for harness in "$@"; do
    [[ " ${HARNESSES[*]} " == *" $harness "* ]] || die "unknown harness '$harness' (${HARNESSES[*]})"
  done
  selected=("$@")
  ((${#selected[@]})) || selected=("${HARNESSES[@]}")
  bash "$REPO/scripts/setup.sh" --fuzz
  bash "$REPO/scripts/build.sh" fuzz
  rm -rf "$BUILD/seeds"
  python3 "$REPO/tests/fuzz/make_seeds.py" "$BUILD/seeds"
  for harness in "${selected[@]}"; do
    run_harness "$harness" "$budget"
  done
  log "summary ($budget per harness; logs in build-fuzz/<harness>.log):"
  printf 'fuzz:   %s\n' "${SUMMARY[@]}"
  ((FAILED == 0)) || { log "FAILED"; exit 1; }
  log "all harnesses passed"
}

main "$@"
