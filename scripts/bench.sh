#!/usr/bin/env bash
# Read benchmark of a mounted checkpoint against its ceilings (issue 4). Not a test: it asserts
# nothing; it prints one markdown table and writes it to --out, and a chart of the read rates
# against their ceilings beside it (--out with .png for .md; scripts/bench_chart.py).
#   bash scripts/bench.sh [--size-gb X] [--dp D] [--zero-stage S] [--lp-dtype T] [--repeat K]
#                         [--out FILE] [--workdir DIR]
# Defaults: --size-gb 1, --dp 4, the checkpoint's own ZeRO stage and lp dtype (ZeRO-1, bf16),
# --repeat 3, --out build/bench.md, --workdir /var/tmp/reshardfs-bench.
#
# The checkpoint is a synthetic Llama-like universal checkpoint (tests/tools/make_synthetic_ucp)
# kept in WORKDIR/ucp-<X>gb and reused by later runs of the same size. Measured, each the best of
# K rounds, with the page cache dropped (`sync; echo 3 > /proc/sys/vm/drop_caches`) before every
# cold read:
#   - mount time: from starting `reshardfs mount ... -f` until the mountpoint is mounted, with
#     cold caches (and the bytes the daemon read from disk meanwhile) and with the source cached;
#   - GB/s (bytes / wall seconds) reading every file the target serves (what `reshardfs plan
#     --json` lists): cold; source cached but a new mount (the read path itself, no disk); warm
#     (a re-read, served by the kernel page cache: files are opened with keep_cache);
#   - the same reads of the checkpoint's own .pt files (the disk and page-cache ceilings), and of
#     a `reshardfs serve-null` mount of as many files and bytes (the FUSE transport ceiling);
#   - read amplification (plan --json: source bytes / tensor bytes), daemon peak RSS (VmHWM read
#     just before unmount) and daemon CPU seconds per GB served.
# Readers: 1 = one `cat` of every file in turn; N = nproc processes, each reading one Nth of the
# files' concatenation (whole files with `cat`, a file cut by a stripe edge with `dd`), so the
# readers stay balanced however few and uneven the files are.
# Needs root (drop_caches) and /dev/fuse; any exit unmounts and stops the server it started.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=$(realpath -m "${RESHARDFS_VENV:-/opt/reshardfs/venv}")
RESHARDFS=$REPO/build/fs/reshardfs
MAKE_UCP=$REPO/build/tests/tools/make_synthetic_ucp
MOUNT_TIMEOUT_S=120
READERS=$(nproc)

log() { printf 'bench: %s\n' "$*" >&2; }
die() { printf 'bench: error: %s\n' "$*" >&2; exit 1; }

# ---- the one running server (mount or serve-null) ---------------------------------------------

MNT=""
DAEMON_PID=""

stop_server() {
  [[ -n $DAEMON_PID ]] || return 0
  if mountpoint -q "$MNT"; then fusermount3 -u "$MNT" 2>/dev/null || fusermount3 -u -z "$MNT" 2>/dev/null || true; fi
  # A server still running 10 s after its unmount is killed (by its own pid only).
  for _ in $(seq 100); do kill -0 "$DAEMON_PID" 2>/dev/null || break; sleep 0.1; done
  kill "$DAEMON_PID" 2>/dev/null || true
  wait "$DAEMON_PID" 2>/dev/null || true
  DAEMON_PID=""
}
trap stop_server EXIT
trap 'exit 130' INT TERM  # so the EXIT trap runs on a signal too

# start_server LOG ARGV...: runs `ARGV -f` in the background and returns once MNT is mounted,
# leaving the seconds that took in MOUNT_S (not printed: a $(...) subshell would own the server).
MOUNT_S=""
start_server() {
  local log_file=$1 t0=${EPOCHREALTIME/[.,]/}
  shift
  "$@" -f >"$log_file" 2>&1 &
  DAEMON_PID=$!
  until mountpoint -q "$MNT"; do
    kill -0 "$DAEMON_PID" 2>/dev/null || { DAEMON_PID=""; die "server exited before mounting: $(tail -n 1 "$log_file")"; }
    ((${EPOCHREALTIME/[.,]/} - t0 < MOUNT_TIMEOUT_S * 1000000)) || die "not mounted after $MOUNT_TIMEOUT_S s: $*"
    sleep 0.002
  done
  MOUNT_S=$(seconds_since "$t0")
}

# PEAK_HWM_KB: the largest peak resident set (VmHWM) of any daemon, read just before unmount.
PEAK_HWM_KB=0
peak_hwm() {
  local kb
  kb=$(awk '/^VmHWM:/ { print $2 }' "/proc/$DAEMON_PID/status")
  ((kb <= PEAK_HWM_KB)) || PEAK_HWM_KB=$kb
}

# The daemon's CPU time so far (seconds).
daemon_cpu_s() {
  local -a f
  read -r -a f <"/proc/$DAEMON_PID/stat"  # comm is "reshardfs": no space shifts the fields
  awk -v ticks=$((f[13] + f[14])) -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.3f", ticks / hz }'
}

# ---- reading ----------------------------------------------------------------------------------

WORK=""  # where file sets are described (define_set) and server logs kept

# seconds_since T0: wall seconds since T0, a ${EPOCHREALTIME/[.,]/} reading (microseconds).
seconds_since() { awk -v us=$((${EPOCHREALTIME/[.,]/} - $1)) 'BEGIN { printf "%.4f", us / 1e6 }'; }
drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }

# define_set NAME < "size<TAB>path" lines: NAME.files, the file list; NAME.bytes, their total;
# NAME.stripes, the READERS stripes of the files' concatenation as
# "reader<TAB>offset<TAB>length<TAB>whole<TAB>path" pieces, in file order.
# (awk is mawk on Debian: its %d stops at 2^31, so byte counts print with %.0f.)
define_set() {
  local lines
  lines=$(cat)
  if [[ -z $lines ]]; then
    : >"$WORK/$1.files"; : >"$WORK/$1.stripes"; echo 0 >"$WORK/$1.bytes"
    return
  fi
  cut -f 2- <<<"$lines" >"$WORK/$1.files"
  awk -F '\t' '{ s += $1 } END { printf "%.0f\n", s }' <<<"$lines" >"$WORK/$1.bytes"
  awk -F '\t' -v n="$READERS" '
    function edge(k) { return int(k * total / n) }  # stripe k is [edge(k), edge(k + 1))
    { size[NR] = $1; path[NR] = $2; total += $1 }
    END {
      start = 0
      for (i = 1; i <= NR; i++) {
        for (off = 0; off < size[i]; off = end - start) {
          k = int((start + off) * n / total)
          while (k + 1 < n && edge(k + 1) <= start + off) k++
          while (k > 0 && edge(k) > start + off) k--
          end = edge(k + 1) < start + size[i] ? edge(k + 1) : start + size[i]
          printf "%d\t%.0f\t%.0f\t%d\t%s\n", k, off, end - start - off, off == 0 && end == start + size[i], path[i]
        }
        start += size[i]
      }
    }' <<<"$lines" >"$WORK/$1.stripes"
}

# read_stripe K SET: reader K's pieces of SET; runs of whole files go to one `cat`.
read_stripe() {
  local k off len whole path
  local -a run=()
  while IFS=$'\t' read -r k off len whole path; do
    [[ $k == "$1" ]] || continue
    if ((whole)); then run+=("$path"); continue; fi
    ((${#run[@]} == 0)) || cat "${run[@]}" >/dev/null
    run=()
    dd if="$path" of=/dev/null bs=128K iflag=skip_bytes,count_bytes skip="$off" count="$len" status=none
  done <"$WORK/$2.stripes"
  ((${#run[@]} == 0)) || cat "${run[@]}" >/dev/null
}

# read_set SET READERS: reads every file of SET to /dev/null; prints the wall seconds.
read_set() {
  local -a files
  mapfile -t files <"$WORK/$1.files"
  local t0=${EPOCHREALTIME/[.,]/} k
  if (($2 == 1)); then
    cat "${files[@]}" >/dev/null
  else
    for ((k = 0; k < $2; k++)); do read_stripe "$k" "$1" & done
    wait
  fi
  seconds_since "$t0"
}

# ---- results: the best (smallest) of the rounds, by name --------------------------------------

declare -A BEST
record() { [[ -n ${BEST[$1]:-} ]] && awk -v a="${BEST[$1]}" -v b="$2" 'BEGIN { exit !(a <= b) }' || BEST[$1]=$2; }
gbps() { awk -v b="$1" -v s="${BEST[$2]}" 'BEGIN { printf "%.2f", b / s / 1e9 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

# ---- one round of each kind -------------------------------------------------------------------

round_ucp() {
  drop_caches; record ucp_cold_1 "$(read_set ucp 1)"
  record ucp_warm_1 "$(read_set ucp 1)"
  record ucp_warm_n "$(read_set ucp "$READERS")"
  drop_caches; record ucp_cold_n "$(read_set ucp "$READERS")"
}

# round_mount UCP TARGET...: four mounts: one with cold caches, then three with the source cached.
round_mount() {
  local ucp=$1 cpu0
  shift
  drop_caches
  start_server "$WORK/mount.log" "$RESHARDFS" mount "$ucp" "$MNT" "$@"
  record mount_cold "$MOUNT_S"
  record mount_read_bytes "$(awk '/^read_bytes:/ { print $2 }' "/proc/$DAEMON_PID/io")"
  cpu0=$(daemon_cpu_s)
  record fs_cold_1 "$(read_set fs 1)"
  record cpu_cold "$(awk -v a="$cpu0" -v b="$(daemon_cpu_s)" 'BEGIN { print b - a }')"
  record fs_warm_1 "$(read_set fs 1)"
  record fs_warm_n "$(read_set fs "$READERS")"
  drop_caches; record fs_cold_n "$(read_set fs "$READERS")"
  peak_hwm
  stop_server
  # Now the whole source is cached, and a new mount starts with none of its own pages cached.
  read_set ucp 1 >/dev/null
  start_server "$WORK/mount.log" "$RESHARDFS" mount "$ucp" "$MNT" "$@"
  record mount_warm "$MOUNT_S"
  cpu0=$(daemon_cpu_s)
  record fs_hot_1 "$(read_set fs 1)"
  record cpu_hot "$(awk -v a="$cpu0" -v b="$(daemon_cpu_s)" 'BEGIN { print b - a }')"
  peak_hwm
  stop_server
  start_server "$WORK/mount.log" "$RESHARDFS" mount "$ucp" "$MNT" "$@"
  record fs_hot_n "$(read_set fs "$READERS")"
  peak_hwm
  stop_server
  # The model-states files (lp weights converted from fp32) and the optimizer-state files (plain
  # copies) read apart, each for the first time on this mount, with the daemon's CPU time for each.
  start_server "$WORK/mount.log" "$RESHARDFS" mount "$ucp" "$MNT" "$@"
  local kind
  for kind in model optim; do
    [[ -s $WORK/fs_$kind.files ]] || continue
    cpu0=$(daemon_cpu_s)
    record "fs_hot_$kind" "$(read_set "fs_$kind" 1)"
    record "cpu_hot_$kind" "$(awk -v a="$cpu0" -v b="$(daemon_cpu_s)" 'BEGIN { print b - a }')"
  done
  peak_hwm
  stop_server
}

# round_null SIZE FILES
round_null() {
  start_server "$WORK/null.log" "$RESHARDFS" serve-null "$MNT" --size "$1" --files "$2"
  drop_caches; record null_cold_1 "$(read_set null 1)"
  record null_warm_1 "$(read_set null 1)"
  record null_warm_n "$(read_set null "$READERS")"
  drop_caches; record null_cold_n "$(read_set null "$READERS")"
  stop_server
}

# ---- main -------------------------------------------------------------------------------------

main() {
  local size_gb=1 dp=4 repeat=3 out=$REPO/build/bench.md workdir=/var/tmp/reshardfs-bench
  local -a target=()
  while (($#)); do
    case $1 in
      --size-gb) size_gb=$2; shift 2 ;;
      --dp) dp=$2; shift 2 ;;
      --zero-stage | --lp-dtype) target+=("$1" "$2"); shift 2 ;;
      --repeat) repeat=$2; shift 2 ;;
      --out) out=$2; shift 2 ;;
      --workdir) workdir=$2; shift 2 ;;
      *) die "unknown argument '$1' (usage: bench.sh [--size-gb X] [--dp D] [--zero-stage S] [--lp-dtype T] [--repeat K] [--out FILE] [--workdir DIR])" ;;
    esac
  done
  target=(--dp "$dp" "${target[@]}")
  [[ $repeat =~ ^[1-9][0-9]*$ ]] || die "--repeat wants a positive integer, not '$repeat'"
  ((EUID == 0)) || die "needs root, to drop the page cache before cold reads"
  [[ -r /dev/fuse && -w /dev/fuse ]] || die "needs a usable /dev/fuse"
  if [[ ! -x $RESHARDFS || ! -x $MAKE_UCP ]]; then bash "$REPO/scripts/build.sh" release >&2; fi

  local ucp=$workdir/ucp-${size_gb}gb made_note=$workdir/ucp-${size_gb}gb.txt
  WORK=$workdir
  MNT=$workdir/mnt
  mkdir -p "$workdir" "$MNT"
  mountpoint -q "$MNT" && die "$MNT is already mounted"
  # make_synthetic_ucp writes latest_universal last: its presence means a complete checkpoint.
  if [[ ! -f $ucp/latest_universal || ! -f $made_note ]]; then
    log "writing a ${size_gb} GB synthetic checkpoint to $ucp"
    rm -rf "$ucp"
    "$MAKE_UCP" "$ucp" --size-gb "$size_gb" >"$made_note"
  fi
  local made
  made=$(<"$made_note")  # "<dir>: hidden H, layers L, ..., written in S s"
  made=${made#*: }

  # plan --json, one line each: served bytes, target, total and per-rank read amplification;
  # then "size<TAB>path" of every served file.
  "$RESHARDFS" plan "$ucp" "${target[@]}" --json >"$WORK/plan.json"
  local -a plan_lines
  mapfile -t plan_lines < <(python3 - "$WORK/plan.json" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
t, total = plan["target"], plan["total"]
print(total["size"])
print("TP %d x DP %d, ZeRO-%d, lp %s" % (t["tp"], t["dp"], t["zero_stage"], t["lp_dtype"]))
print("%.3f" % (total["source_bytes"] / total["tensor_bytes"]))
print(", ".join("t%d/d%d %.3f" % (r["tp_rank"], r["dp_rank"], r["read_amplification"]) for r in plan["ranks"]))
for f in plan["files"]:
    print("%d\t%s" % (f["size"], f["path"]))
PY
  )
  ((${#plan_lines[@]} > 4)) || die "no served files in $WORK/plan.json"
  local served_bytes=${plan_lines[0]} target_desc=${plan_lines[1]} amp_total=${plan_lines[2]} amp_ranks=${plan_lines[3]}
  local nfiles=$((${#plan_lines[@]} - 4))
  local served_list kind
  served_list=$(printf '%s\n' "${plan_lines[@]:4}" | sed "s|\t|\t$MNT/|")
  define_set fs <<<"$served_list"
  for kind in model optim; do
    awk -F '\t' -v k="_${kind}_states.pt" 'substr($2, length($2) - length(k) + 1) == k' <<<"$served_list" \
      | define_set "fs_$kind"
  done
  find "$ucp" -type f -name '*.pt' -printf '%s\t%p\n' | sort -t $'\t' -k 2 | define_set ucp
  local ucp_count null_size=$((served_bytes / nfiles)) i
  ucp_count=$(wc -l <"$WORK/ucp.files")
  for ((i = 0; i < nfiles; i++)); do printf '%d\t%s/null_%d\n' "$null_size" "$MNT" "$i"; done | define_set null

  local load_before r
  load_before=$(cut -d ' ' -f 1 /proc/loadavg)
  for ((r = 1; r <= repeat; r++)); do
    log "round $r of $repeat: the checkpoint's own files, the mount, serve-null"
    round_ucp
    round_mount "$ucp" "${target[@]}"
    round_null "$null_size" "$nfiles"
  done

  local gb_served n=$READERS
  gb_served=$(awk -v b="$served_bytes" 'BEGIN { printf "%.3f", b / 1e9 }')
  declare -A g  # GB/s, by measurement: bytes of its set / best seconds
  for i in "${!BEST[@]}"; do
    if [[ $i =~ ^(ucp|null|fs)_(cold|warm|hot)_(1|n)$ ]]; then
      g[$i]=$(gbps "$(<"$WORK/${BASH_REMATCH[1]}.bytes")" "$i")
    elif [[ $i =~ ^fs_hot_(model|optim)$ ]]; then
      g[$i]=$(gbps "$(<"$WORK/fs_${BASH_REMATCH[1]}.bytes")" "$i")
    fi
  done

  mkdir -p "$(dirname "$out")"
  # shellcheck disable=SC2016  # the backquotes are markdown
  {
    printf '## reshardfs read benchmark, %s\n\n' "$(date -Iseconds)"
    printf -- '- machine: %s CPUs (%s), kernel %s, %s GiB RAM; 1-min load average %s before, %s after\n' \
      "$(nproc)" "$(awk -F ': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)" "$(uname -r)" \
      "$(awk '/^MemTotal:/ { printf "%.0f", $2 / 1048576 }' /proc/meminfo)" "$load_before" \
      "$(cut -d ' ' -f 1 /proc/loadavg)"
    printf -- '- checkpoint: synthetic Llama UCP (%s); %d .pt files, %s GB\n' "$made" "$ucp_count" \
      "$(awk -v b="$(<"$WORK/ucp.bytes")" 'BEGIN { printf "%.3f", b / 1e9 }')"
    printf -- '- target: `%s` (%s): %d files, %s GB served\n' "${target[*]}" "$target_desc" "$nfiles" "$gb_served"
    printf -- '- best of %d rounds. Readers: 1 = one `cat` of all files; %d = %d processes, one stripe of the files each. ' \
      "$repeat" "$n" "$n"
    printf 'GB/s = bytes / wall seconds (1 GB = 1e9 B). Cold = after `drop_caches`.\n\n'
    printf '| measurement | readers | result | ceiling | ratio |\n|---|---|---|---|---|\n'
    printf '| mount time, cold page cache | | %.3f s | | |\n' "${BEST[mount_cold]}"
    printf '| mount time, source cached | | %.3f s | | |\n' "${BEST[mount_warm]}"
    printf '| bytes the daemon read from disk while mounting, cold | | %.1f MB | | |\n' \
      "$(awk -v b="${BEST[mount_read_bytes]}" 'BEGIN { print b / 1e6 }')"
    for r in 1 n; do
      printf '| read through mount, cold | %s | %s GB/s | null FUSE cold %s GB/s (disk: %s GB/s) | %s |\n' "${r/n/$n}" \
        "${g[fs_cold_$r]}" "${g[null_cold_$r]}" "${g[ucp_cold_$r]}" "$(ratio "${g[fs_cold_$r]}" "${g[null_cold_$r]}")"
    done
    for r in 1 n; do
      printf '| read through mount, source cached, new mount | %s | %s GB/s | null FUSE cold %s GB/s | %s |\n' \
        "${r/n/$n}" "${g[fs_hot_$r]}" "${g[null_cold_$r]}" "$(ratio "${g[fs_hot_$r]}" "${g[null_cold_$r]}")"
    done
    for r in 1 n; do
      printf '| read through mount, warm (re-read) | %s | %s GB/s | page cache %s GB/s | %s |\n' "${r/n/$n}" \
        "${g[fs_warm_$r]}" "${g[ucp_warm_$r]}" "$(ratio "${g[fs_warm_$r]}" "${g[ucp_warm_$r]}")"
    done
    for r in 1 n; do
      printf '| checkpoint files with cat, cold (disk) | %s | %s GB/s | | |\n' "${r/n/$n}" "${g[ucp_cold_$r]}"
      printf '| checkpoint files with cat, warm (page cache) | %s | %s GB/s | | |\n' "${r/n/$n}" "${g[ucp_warm_$r]}"
    done
    for r in 1 n; do
      printf '| null FUSE (serve-null), cold | %s | %s GB/s | | |\n' "${r/n/$n}" "${g[null_cold_$r]}"
      printf '| null FUSE (serve-null), warm | %s | %s GB/s | | |\n' "${r/n/$n}" "${g[null_warm_$r]}"
    done
    printf '| read amplification, total (source / tensor bytes) | | %s | 1.000 | |\n' "$amp_total"
    printf '| read amplification, per rank | | %s | | |\n' "$amp_ranks"
    printf '| daemon peak RSS (VmHWM, largest of all mounts) | | %.1f MiB | | |\n' \
      "$(awk -v k="$PEAK_HWM_KB" 'BEGIN { print k / 1024 }')"
    printf '| daemon CPU per GB served, cold / source cached | 1 | %.2f / %.2f s | | |\n' \
      "$(awk -v c="${BEST[cpu_cold]}" -v g="$gb_served" 'BEGIN { print c / g }')" \
      "$(awk -v c="${BEST[cpu_hot]}" -v g="$gb_served" 'BEGIN { print c / g }')"
    for kind in model optim; do
      [[ -n ${g[fs_hot_$kind]:-} ]] || continue
      printf '| %s-states files alone, source cached, new mount | 1 | %s GB/s, daemon CPU %.2f s/GB | null FUSE cold %s GB/s | %s |\n' \
        "$kind" "${g[fs_hot_$kind]}" \
        "$(awk -v c="${BEST[cpu_hot_$kind]}" -v b="$(<"$WORK/fs_$kind.bytes")" 'BEGIN { print c / (b / 1e9) }')" \
        "${g[null_cold_1]}" "$(ratio "${g[fs_hot_$kind]}" "${g[null_cold_1]}")"
    done
  } | tee "$out"
  log "table written to $out"

  # The chart (scripts/bench_chart.py): every read rate beside its ceiling.
  {
    for r in 1 n; do
      printf 'cold, %s reader(s)\t%s\tnull FUSE, cold\t%s\n' "${r/n/$n}" "${g[fs_cold_$r]}" "${g[null_cold_$r]}"
    done
    for r in 1 n; do
      printf 'source cached, new mount, %s reader(s)\t%s\tnull FUSE, cold\t%s\n' "${r/n/$n}" "${g[fs_hot_$r]}" \
        "${g[null_cold_$r]}"
    done
    for r in 1 n; do
      printf 'warm re-read, %s reader(s)\t%s\tpage cache\t%s\n' "${r/n/$n}" "${g[fs_warm_$r]}" "${g[ucp_warm_$r]}"
    done
    for kind in model optim; do
      [[ -n ${g[fs_hot_$kind]:-} ]] || continue
      printf '%s-states files, source cached\t%s\tnull FUSE, cold\t%s\n' "$kind" "${g[fs_hot_$kind]}" "${g[null_cold_1]}"
    done
  } >"$WORK/chart.tsv"
  "$VENV/bin/python" "$REPO/scripts/bench_chart.py" "$WORK/chart.tsv" "${out%.md}.png" \
    "reshardfs read rates against their ceilings, $(date -I), $(nproc) CPUs, ${gb_served} GB served (${target[*]})"
}

main "$@"
