#!/usr/bin/env bash
# Installs what reshardfs needs on Debian 12 (run as root). Idempotent: when everything is there
# it only checks and returns in a second or two.
#   - Debian packages: the C++ toolchain and libraries, fuse3, python3 (>= 3.10) with its headers and
#     pybind11 (the reshardfs._C extension).
#   - The Python venv at ${RESHARDFS_VENV:-/opt/reshardfs/venv} with the pinned torch, DeepSpeed
#     and test packages; rebuilt only when scripts/requirements*.txt change (a stamp holds their
#     sha256). It is built beside its final place and moved in only once it works.
#   - /dev/fuse (a warning only: building and the unit tests do not need it).
#   - With --fuzz: clang-16 and libFuzzer, for the harnesses of tests/fuzz (scripts/fuzz.sh).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=$(realpath -m "${RESHARDFS_VENV:-/opt/reshardfs/venv}")
BOOTSTRAP="$REPO/scripts/requirements-bootstrap.txt"
REQUIREMENTS=("$BOOTSTRAP" "$REPO/scripts/requirements-torch.txt" "$REPO/scripts/requirements.txt")
STAMP=.reshardfs-requirements.sha256
DEB_PACKAGES=(build-essential cmake ninja-build pkg-config git libfuse3-dev fuse3 libspdlog-dev catch2
  libcli11-dev nlohmann-json3-dev zlib1g-dev libzstd-dev python3 python3-dev pybind11-dev)
FUZZ_DEB_PACKAGES=(clang-16 libfuzzer-16-dev libclang-rt-16-dev)
APT_UPDATED=0

log() { printf 'setup: %s\n' "$*"; }
warn() { printf 'setup: WARNING: %s\n' "$*" >&2; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

is_installed() {
  dpkg -s "$1" 2>/dev/null | grep -qx 'Status: install ok installed'
}

apt_install() {
  local missing=() pkg
  for pkg in "$@"; do
    is_installed "$pkg" || missing+=("$pkg")
  done
  ((${#missing[@]})) || return 0
  [[ $(id -u) == 0 ]] || die "missing Debian packages (${missing[*]}); run as root"
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if ((!APT_UPDATED)); then
    apt-get update -q
    APT_UPDATED=1
  fi
  apt-get install -y -q --no-install-recommends "${missing[@]}"
}

check_python() {
  command -v python3 >/dev/null || die "no python3 on PATH"
  python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
    die "$(command -v python3) is $(python3 -V 2>&1); reshardfs needs Python >= 3.10"
  # Debian's python3 makes venvs only with python3-venv (it ships ensurepip); pyenv's always can.
  python3 -c 'import ensurepip' 2>/dev/null || apt_install python3-venv
}

requirements_sha() {
  cat "${REQUIREMENTS[@]}" | sha256sum | cut -d' ' -f1
}

# The name==version pins of the requirement files, normalised as `pip freeze` prints them.
pins() {
  sed -e 's/#.*//' -e 's/[[:space:]]//g' "${REQUIREMENTS[@]}" | grep -v '^-' | grep . |
    tr 'A-Z_' 'a-z-'
}

# A venv built by the recipe from the current files: torch and deepspeed import, pins all match.
venv_matches_pins() {
  local venv=$1 frozen pin
  [[ -x $venv/bin/python ]] || return 1
  DS_ACCELERATOR=cpu "$venv/bin/python" -c 'import torch, deepspeed' >/dev/null 2>&1 || return 1
  frozen=$("$venv/bin/python" -m pip freeze 2>/dev/null | tr 'A-Z_' 'a-z-') || return 1
  while read -r pin; do
    grep -qxF "$pin" <<<"$frozen" || { log "venv lacks $pin"; return 1; }
  done < <(pins)
}

build_venv() {
  local sha=$1 partial="$VENV.partial"
  log "building the Python venv in $partial (torch + DeepSpeed; a few minutes on first run)"
  rm -rf "$partial" "$VENV.old"
  mkdir -p "$(dirname "$VENV")"
  python3 -m venv --prompt "$(basename "$VENV")" "$partial"
  "$partial/bin/pip" install -q -r "$BOOTSTRAP"
  # Copies, not links into uv's cache: the venv must outlive the cache.
  local uv=("$partial/bin/uv" pip install --python "$partial/bin/python" --link-mode copy)
  "${uv[@]}" -r "${REQUIREMENTS[1]}"
  "${uv[@]}" setuptools wheel packaging
  # DeepSpeed builds against the installed torch, without its optional C++ ops (JIT-built when a test needs one).
  DS_BUILD_OPS=0 "${uv[@]}" --no-build-isolation -r "${REQUIREMENTS[2]}"
  venv_matches_pins "$partial" || die "the new venv in $partial does not match the pins"
  # Paths to the temporary place: bytecode (Python recompiles it on first import) and the
  # interpreter named by the scripts in bin/.
  find "$partial" -name __pycache__ -type d -prune -exec rm -rf {} +
  { grep -rlIF -- "$partial" "$partial/bin" "$partial/pyvenv.cfg" || true; } | xargs -r sed -i "s|$partial|$VENV|g"
  echo "$sha" >"$partial/$STAMP"
  if [[ -e $VENV ]]; then mv "$VENV" "$VENV.old"; fi
  mv "$partial" "$VENV"
  rm -rf "$VENV.old"
}

ensure_venv() {
  local sha
  sha=$(requirements_sha)
  if [[ -f $VENV/$STAMP && $(<"$VENV/$STAMP") == "$sha" && -x $VENV/bin/python ]]; then
    log "venv $VENV is up to date"
  elif [[ ! -f $VENV/$STAMP ]] && venv_matches_pins "$VENV"; then
    log "adopting the existing venv $VENV (it matches the pins)"
    echo "$sha" >"$VENV/$STAMP"
  else
    build_venv "$sha"
  fi
}

check_fuse() {
  [[ -c /dev/fuse ]] && return 0
  if command -v modprobe >/dev/null; then modprobe fuse 2>/dev/null || true; fi
  [[ -c /dev/fuse ]] ||
    warn "/dev/fuse is missing: mounting will fail (building and tests do not need it). On a container, pass --device /dev/fuse --cap-add SYS_ADMIN."
}

main() {
  local start=$SECONDS packages=("${DEB_PACKAGES[@]}")
  case ${1:-} in
    "") ;;
    --fuzz) packages+=("${FUZZ_DEB_PACKAGES[@]}") ;;
    *) die "usage: setup.sh [--fuzz]" ;;
  esac
  apt_install "${packages[@]}"
  check_python
  ensure_venv
  check_fuse
  log "ok ($((SECONDS - start)) s): venv $VENV"
}

main "$@"
