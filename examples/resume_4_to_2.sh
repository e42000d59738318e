#!/usr/bin/env bash
# End to end: train on 4 ranks, resume on 2 from the mount.
#
#   bash examples/resume_4_to_2.sh [WORKDIR]
#
# 1. trains the tiny model with real DeepSpeed on 4 CPU ranks (ZeRO-1, 3 steps) and saves natively;
#    DeepSpeed's ds_to_universal converts the save (examples/make_tiny_checkpoint.py --dp 4);
# 2. mounts the universal checkpoint as the native checkpoint of a DP=2 run, the layout taken from that
#    run's own ds_config.json: `reshardfs mount WORKDIR/run/universal WORKDIR/mnt --ds-config ...`;
# 3. resumes on 2 ranks with the unmodified engine.load_checkpoint(WORKDIR/mnt) and trains 3 more steps
#    (examples/resume_tiny.py), then unmounts;
# 4. does the same resume through DeepSpeed's own universal loader, and requires identical losses.
# Needs the venv and the build (scripts/setup.sh, scripts/build.sh release) and root for FUSE.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=$(realpath -m "${RESHARDFS_VENV:-/opt/reshardfs/venv}")
BIN=${RESHARDFS_BIN:-$REPO/build/fs/reshardfs}
PY=$VENV/bin/python
WORK=${1:-$(mktemp -d /tmp/reshardfs-4to2.XXXXXX)}
MNT=$WORK/mnt

log() { printf 'resume_4_to_2: %s\n' "$*"; }
cleanup() { if mountpoint -q "$MNT"; then "$BIN" umount "$MNT"; fi; }

mkdir -p "$WORK" "$MNT"
trap cleanup EXIT
log "1. train on 4 ranks and convert -> $WORK/run"
"$PY" "$REPO/examples/make_tiny_checkpoint.py" --out "$WORK/run" --dp 4 --steps 3
"$PY" -c 'import json, sys; sys.path.insert(0, sys.argv[1]); import make_tiny_checkpoint as t; print(json.dumps(t.ds_config(2, 1)))' \
  "$REPO/examples" > "$WORK/ds_config_dp2.json"
log "2. \$ reshardfs mount $WORK/run/universal $MNT --ds-config $WORK/ds_config_dp2.json"
"$BIN" mount "$WORK/run/universal" "$MNT" --ds-config "$WORK/ds_config_dp2.json"
ls "$MNT/$(cat "$MNT/latest")"
log "3. resume on 2 ranks from the mount"
"$PY" "$REPO/examples/resume_tiny.py" --checkpoint "$MNT" --dp 2 --losses "$WORK/losses_mount.json"
"$BIN" umount "$MNT"
log "4. the same resume through DeepSpeed's own load_universal"
"$PY" "$REPO/examples/resume_tiny.py" --checkpoint "$WORK/run/universal" --dp 2 --load-universal \
  --losses "$WORK/losses_load_universal.json"
"$PY" - "$WORK" <<'PY'
import json, sys
work = sys.argv[1]
mount = json.load(open(f"{work}/losses_mount.json"))
reference = json.load(open(f"{work}/losses_load_universal.json"))
print(f"mount:          {mount}\nload_universal: {reference}")
if mount != reference:
    sys.exit("resume_4_to_2: FAIL: the losses differ")
print("resume_4_to_2: PASS: resuming on 2 ranks from the mount trains exactly like DeepSpeed's load_universal")
PY
