#!/usr/bin/env bash
# The demo: set up, build, and run reshardfs on the bundled example checkpoint
# (examples/tiny, a real DeepSpeed checkpoint and its universal conversion).
# Until the mount lands, the main job is `reshardfs inspect` of a universal model-states file.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

log() { printf 'demo: %s\n' "$*"; }
die() { printf 'demo: error: %s\n' "$*" >&2; exit 1; }

# The first examples/tiny/universal/**/mp_rank_00_model_states.pt, in sorted order.
example_file() {
  local files
  shopt -s globstar nullglob
  files=("$REPO"/examples/tiny/universal/**/mp_rank_00_model_states.pt)
  ((${#files[@]})) || die "no mp_rank_00_model_states.pt under $REPO/examples/tiny/universal"
  printf '%s\n' "${files[0]}"
}

main() {
  local file
  file=$(example_file)
  bash "$REPO/scripts/setup.sh"
  bash "$REPO/scripts/build.sh" release
  log "\$ build/fs/reshardfs inspect ${file#"$REPO"/}"
  "$REPO/build/fs/reshardfs" inspect "$file"
  log "done: that is the pickle tree and tensor index reshardfs reads from a DeepSpeed checkpoint"
}

main "$@"
