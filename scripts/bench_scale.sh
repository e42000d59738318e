#!/usr/bin/env bash
# Scale benchmark (issue 18): what planning and serving cost as the parameter count grows. Not a
# test: it asserts nothing; it prints one markdown table.
#   bash scripts/bench_scale.sh [--layers L[,L...]] [--dp D] [--reshardfs BIN[,BIN...]] [--workdir DIR]
# Defaults: --layers 1111,11111 (10,002 and 100,002 parameters), --dp 4, build/fs/reshardfs,
# --workdir /var/tmp/reshardfs-scale.
#
# Each checkpoint is `make_synthetic_ucp DIR --hidden 8 --layers L --intermediate 16 --vocab 16`
# (9 parameters and 36 files per layer, tiny tensors), kept in WORKDIR/ucp-L and reused. With the
# source in the page cache (one untimed `plan` first), for each binary given (in the order given,
# so two builds compare under the same conditions), it measures:
#   - `reshardfs plan DIR --dp D`: wall seconds, user and system CPU seconds, peak RSS (/usr/bin/time);
#   - `reshardfs mount DIR MNT --dp D -f`: wall seconds until MNT is mounted, and the daemon's
#     VmRSS once mounted (what it keeps to serve) and VmHWM (its peak while planning);
#   - `ls -lR MNT` and `stat` of every file, and reading every served file once (cat), in seconds.
# Needs /dev/fuse; any exit unmounts and stops the server it started.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MAKE_UCP=$REPO/build/tests/tools/make_synthetic_ucp
MOUNT_TIMEOUT_S=600

die() { echo "bench_scale: $*" >&2; exit 1; }
log() { echo "bench_scale: $*" >&2; }

MNT=""
SERVER=""
cleanup() {
  if [[ -n $MNT ]] && mountpoint -q "$MNT"; then fusermount3 -u "$MNT" 2>/dev/null || fusermount3 -u -z "$MNT" || true; fi
  if [[ -n $SERVER ]]; then wait "$SERVER" 2>/dev/null || true; fi
}
trap cleanup EXIT

now_us() { echo "${EPOCHREALTIME/[.,]/}"; }
seconds_since() { awk -v a="$1" -v b="$(now_us)" 'BEGIN { printf "%.2f", (b - a) / 1e6 }'; }
mib() { awk -v k="$1" 'BEGIN { printf "%.0f MiB", k / 1024 }'; }
status_kib() { awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status"; }

main() {
  local layers_arg=1111,11111 dp=4 bins_arg=$REPO/build/fs/reshardfs workdir=/var/tmp/reshardfs-scale
  while (($#)); do
    case $1 in
      --layers) layers_arg=$2; shift 2 ;;
      --dp) dp=$2; shift 2 ;;
      --reshardfs) bins_arg=$2; shift 2 ;;
      --workdir) workdir=$2; shift 2 ;;
      *) die "unknown argument '$1' (see the header of $0)" ;;
    esac
  done
  [[ -r /dev/fuse && -w /dev/fuse ]] || die "needs a usable /dev/fuse"
  [[ -x /usr/bin/time ]] || die "needs /usr/bin/time (Debian package 'time')"
  local -a layers bins
  IFS=, read -ra layers <<<"$layers_arg"
  IFS=, read -ra bins <<<"$bins_arg"
  if [[ ! -x $MAKE_UCP || ! -x ${bins[0]} ]]; then bash "$REPO/scripts/build.sh" release >&2; fi
  for bin in "${bins[@]}"; do [[ -x $bin ]] || die "no executable $bin"; done
  MNT=$workdir/mnt
  mkdir -p "$workdir" "$MNT"
  mountpoint -q "$MNT" && die "$MNT is already mounted"

  echo "| parameters | files | binary | \`plan\` wall, user, peak RSS | \`mount\` | daemon RSS kept (peak) | \`ls -lR\` | \`stat\` all | read all |"
  echo "|---|---|---|---|---|---|---|---|---|"
  for l in "${layers[@]}"; do
    [[ $l =~ ^[1-9][0-9]*$ ]] || die "--layers wants positive integers, not '$l'"
    local ucp=$workdir/ucp-$l
    # make_synthetic_ucp writes latest_universal last: its presence means a complete checkpoint.
    if [[ ! -f $ucp/latest_universal ]]; then
      log "writing a synthetic checkpoint of $l layers to $ucp"
      rm -rf "$ucp"
      "$MAKE_UCP" "$ucp" --hidden 8 --layers "$l" --intermediate 16 --vocab 16 >&2
    fi
    local params files
    params=$(find "$ucp"/*/zero -mindepth 1 -maxdepth 1 -type d | wc -l)
    files=$(find "$ucp/" -type f | wc -l)
    "${bins[0]}" plan "$ucp" --dp "$dp" >/dev/null  # the source into the page cache
    for bin in "${bins[@]}"; do
      local timing
      timing=$( { /usr/bin/time -f "%e %U %S %M" "$bin" plan "$ucp" --dp "$dp" >/dev/null; } 2>&1 | tail -n 1)
      read -r plan_wall plan_user plan_sys plan_kib <<<"$timing"

      local t0
      t0=$(now_us)
      "$bin" mount "$ucp" "$MNT" --dp "$dp" -f >"$workdir/mount.log" 2>&1 &
      SERVER=$!
      until mountpoint -q "$MNT"; do
        kill -0 "$SERVER" 2>/dev/null || die "the server exited: $(tail -n 3 "$workdir/mount.log")"
        (($(now_us) - t0 < MOUNT_TIMEOUT_S * 1000000)) || die "not mounted after $MOUNT_TIMEOUT_S s"
        sleep 0.01
      done
      local mount_s kept peak ls_s stat_s read_s
      mount_s=$(seconds_since "$t0")
      kept=$(status_kib "$SERVER" VmRSS)
      peak=$(status_kib "$SERVER" VmHWM)
      t0=$(now_us); ls -lR "$MNT" >/dev/null; ls_s=$(seconds_since "$t0")
      t0=$(now_us); find "$MNT" -type f -exec stat -c %s {} + >/dev/null; stat_s=$(seconds_since "$t0")
      t0=$(now_us); find "$MNT" -type f -exec cat {} + >/dev/null; read_s=$(seconds_since "$t0")
      fusermount3 -u "$MNT"
      wait "$SERVER" || die "the server failed: $(tail -n 3 "$workdir/mount.log")"
      SERVER=""
      echo "| $params | $files | \`$bin\` | ${plan_wall} s, ${plan_user} + ${plan_sys} s, $(mib "$plan_kib") | ${mount_s} s |" \
        "$(mib "$kept") ($(mib "$peak")) | ${ls_s} s | ${stat_s} s | ${read_s} s |"
    done
  done
}

main "$@"
