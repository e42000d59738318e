#!/usr/bin/env bash
# The demo: set up, build, and mount the bundled example (examples/tiny/universal, a real
# DeepSpeed ZeRO-1 DP=2 checkpoint converted by ds_to_universal) as the native checkpoint of a
# DP=4 bf16 run; list the served files, load one with torch, unmount.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=$(realpath -m "${RESHARDFS_VENV:-/opt/reshardfs/venv}")
MNT=""

log() { printf 'demo: %s\n' "$*"; }

cleanup() {
  if [[ -n $MNT ]]; then
    mountpoint -q "$MNT" && "$REPO/build/fs/reshardfs" umount "$MNT"
    rmdir "$MNT"
  fi
}

main() {
  bash "$REPO/scripts/setup.sh"
  bash "$REPO/scripts/build.sh" release
  local bin=$REPO/build/fs/reshardfs ucp=$REPO/examples/tiny/universal
  MNT=$(mktemp -d /tmp/reshardfs-demo.XXXXXX)
  trap cleanup EXIT

  log "\$ reshardfs plan examples/tiny/universal --dp 4 --lp-dtype bf16"
  "$bin" plan "$ucp" --dp 4 --lp-dtype bf16
  log "\$ reshardfs mount examples/tiny/universal $MNT --dp 4 --lp-dtype bf16"
  "$bin" mount "$ucp" "$MNT" --dp 4 --lp-dtype bf16
  log "\$ ls -lR $MNT"
  ls -lR "$MNT"
  log "loading $MNT/global_step3/bf16_zero_pp_rank_3_mp_rank_00_optim_states.pt with torch.load"
  "$VENV/bin/python" - "$MNT" <<'PY'
import sys, torch
mnt = sys.argv[1]
sd = torch.load(f"{mnt}/global_step3/bf16_zero_pp_rank_3_mp_rank_00_optim_states.pt", weights_only=False)
osd = sd["optimizer_state_dict"]
for g, t in enumerate(osd["single_partition_of_fp32_groups"]):
    state = osd["base_optimizer_state"]["state"][g]
    print(f"  group {g}: fp32 partition {tuple(t.shape)}, exp_avg {tuple(state['exp_avg'].shape)}, "
          f"step {float(state['step'])}, padding {osd['group_paddings'][g]}")
model = torch.load(f"{mnt}/global_step3/mp_rank_00_model_states.pt", weights_only=False)
print("  module:", {k: (str(v.dtype), tuple(v.shape)) for k, v in model["module"].items()})
print("  dp_world_size:", model["dp_world_size"], " global_steps:", model["global_steps"])
PY
  log "done: DeepSpeed's engine.load_checkpoint($MNT) in a DP=4 bf16 run resumes from these files"
}

main "$@"
