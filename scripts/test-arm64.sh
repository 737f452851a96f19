#!/usr/bin/env bash
# edgellm on aarch64, emulated: an arm64 Debian root under qemu-user (built once, then kept),
# the project installed in it, and its kernel tests plus an end-to-end generation on a tiny
# fixture model, run with the CPU model set to each Raspberry Pi class core in turn
# (QEMU_CPU and NUMBA_CPU_NAME: Pi 3 = cortex-a53, Pi 4 = cortex-a72, Pi 5 = cortex-a76).
#
# usage: scripts/test-arm64.sh [--smoke | --full | --tests "FILE ..."] [--cpus "CPU ..."]
#                              [--setup-only]
#   (default)     per CPU: the kernel tests (KERNEL_TESTS) + one generation
#   --smoke       per CPU: SMOKE_TESTS (path selection, the spin barrier) + one generation
#   --full        per CPU: the whole test suite (python -m pytest) + one generation
#   --tests LIST  per CPU: these test files (or pytest node ids) + one generation
#   --cpus LIST   CPU names (default "cortex-a53 cortex-a72 cortex-a76")
#   --parallel    run the CPUs at the same time (each emulated process uses ~one core)
#   --setup-only  build (or check) the root and install the project, run nothing
#
# Needs root (debootstrap, chroot, binfmt_misc) and Debian's and PyPI's registries on the
# first run. Kept between runs in $EDGELLM_ARM64_ROOT (default /var/cache/edgellm-arm64):
# the root (~0.9 GB, ~5 min to build), its venv, and numba's kernel cache, which is keyed
# by CPU name, so each core compiles the kernels once. Emulation runs 10-15x slower than
# native: the run-time figures here say nothing about a Pi's speed, only that it computes.
# DEBIAN_MIRROR overrides the mirror. Remove the root with `rm -rf` once no run is using it
# (this script unmounts what it mounted on exit).
#
# Each CPU model's run logs its wall time and the CPU seconds it used: on a shared machine
# the wall time mostly measures the other jobs. Measured (x86-64 host, 2 cores, busy): the
# kernel tests (265) and the generation took ~15 min of CPU for one CPU model with its
# kernel cache empty (the kernels compile under emulation), 5-8 min with part of it cached.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
ROOT=${EDGELLM_ARM64_ROOT:-/var/cache/edgellm-arm64}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
ROOT_VERSION=1  # bump when the root's contents below change
CPUS="cortex-a53 cortex-a72 cortex-a76"
MODE=kernel
SETUP_ONLY=0
PARALLEL=0
KERNEL_TESTS="tests/test_kernels_linear.py tests/test_kernels_asm.py tests/test_fused.py
              tests/test_kquant_superblock.py tests/test_layout.py tests/test_interleave.py
              tests/test_portable.py"
SMOKE_TESTS="tests/test_portable.py"

while [ $# -gt 0 ]; do
  case $1 in
    --smoke) MODE=smoke ;;
    --full) MODE=full ;;
    --tests) MODE=tests; TESTS=$2; shift ;;
    --cpus) CPUS=$2; shift ;;
    --setup-only) SETUP_ONLY=1 ;;
    --parallel) PARALLEL=1 ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "test-arm64: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

log() { printf '[arm64 %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "error: $*"; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot, binfmt_misc)"

# --- host tools and the binfmt handler that runs arm64 binaries through qemu -------------
if ! command -v qemu-aarch64-static >/dev/null || ! command -v debootstrap >/dev/null; then
  log "installing qemu-user-static, binfmt-support, debootstrap"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user-static binfmt-support \
    debootstrap >/dev/null
fi
mountpoint -q /proc/sys/fs/binfmt_misc || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true
[ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || die "no binfmt_misc handler for aarch64"

mkdir -p "$(dirname "$ROOT")"
exec 9>"$ROOT.lock"
flock 9  # one run at a time per root

MOUNTED=()
cleanup() {
  local m
  for m in "${MOUNTED[@]}"; do umount -l "$m" 2>/dev/null || true; done
  rm -f "${TIMES:-}"
}
trap cleanup EXIT
trap 'exit 130' INT  # so that the EXIT trap unmounts on ^C and kill too
trap 'exit 143' TERM
mount_in() {  # mount_in ROOTDIR: /proc and a /dev/shm for the chroot
  local r=$1
  mkdir -p "$r/proc" "$r/dev/shm"
  mountpoint -q "$r/proc" || { mount -t proc proc "$r/proc"; MOUNTED+=("$r/proc"); }
  mountpoint -q "$r/dev/shm" || { mount -t tmpfs -o size=256m shm "$r/dev/shm"; MOUNTED+=("$r/dev/shm"); }
}
in_root() {  # in_root ROOTDIR [VAR=VALUE ...] CMD...: run CMD in the arm64 root, clean env
  local r=$1; shift
  chroot "$r" /usr/bin/env -i PATH=/opt/venv/bin:/usr/bin:/bin HOME=/root LANG=C.UTF-8 \
    PIP_CERT=/etc/ssl/certs/host-ca-bundle.crt PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 "$@"
}

# --- the root: debootstrap, a venv with the project's dependencies -----------------------
MARK="$ROOT/.edgellm-root-v$ROOT_VERSION"
if [ ! -e "$MARK" ]; then
  START=$SECONDS
  NEW="$ROOT.new"
  for m in "$NEW/dev/shm" "$NEW/proc"; do umount -l "$m" 2>/dev/null || true; done
  rm -rf "$NEW"
  log "building the arm64 root in $NEW (~5 minutes)"
  debootstrap --arch=arm64 --variant=minbase --foreign \
    --include=python3,python3-venv,python3-pip,python3-dev,ca-certificates,libgomp1 \
    bookworm "$NEW" "$MIRROR" >"$ROOT.debootstrap.log" 2>&1 \
    || die "debootstrap failed: see $ROOT.debootstrap.log"
  cp /usr/bin/qemu-aarch64-static "$NEW/usr/bin/"
  chroot "$NEW" /debootstrap/debootstrap --second-stage >>"$ROOT.debootstrap.log" 2>&1 \
    || die "debootstrap second stage failed: see $ROOT.debootstrap.log"
  cp /etc/ssl/certs/ca-certificates.crt "$NEW/etc/ssl/certs/host-ca-bundle.crt"
  mount_in "$NEW"
  log "creating the venv and installing the dependencies"
  in_root "$NEW" python3 -m venv /opt/venv
  # the project's dependencies (pyproject.toml) and its build backend, for
  # --no-build-isolation installs of the project on every run
  in_root "$NEW" pip install -q "setuptools>=68" wheel "numba>=0.60" "llvmlite>=0.43" \
    "numpy>=1.24" "safetensors>=0.4" "tokenizers>=0.20" "jinja2>=3.1" "gguf>=0.10" \
    "tqdm>=4.60" "pytest>=7" "hypothesis>=6"
  cleanup; MOUNTED=()
  rm -rf "$ROOT"
  mv "$NEW" "$ROOT"
  touch "$MARK"
  log "root ready in $((SECONDS - START)) s"
fi
mount_in "$ROOT"

# --- the project: a copy of the work tree, installed into the venv ------------------------
log "copying $REPO into the root and installing it"
rm -rf "$ROOT/src/edgellm"
mkdir -p "$ROOT/src/edgellm"
tar -C "$REPO" --exclude=.git --exclude=__pycache__ --exclude='*.egg-info' --exclude=build \
  --exclude=.pytest_cache --exclude=.hypothesis -cf - . | tar -C "$ROOT/src/edgellm" -xf -
START=$SECONDS
# Editable: the tests and the `edgellm` command run the same files, at a path and mtime
# (tar keeps them) that stay put between runs, which is what numba's kernel cache keys on.
# The root holds the dependencies the kernel tests need; --full also installs the test
# extra's (the server's, the API clients': more downloads, under emulation).
if [ "$MODE" = full ]; then
  in_root "$ROOT" pip install -q --no-build-isolation -e "/src/edgellm[test]" >/dev/null
else
  in_root "$ROOT" pip install -q --no-build-isolation --no-deps -e /src/edgellm >/dev/null
fi
log "installed in $((SECONDS - START)) s ($(in_root "$ROOT" python3 -c \
  'import numba, numpy, platform; print(platform.machine(), "numba", numba.__version__, "numpy", numpy.__version__)'))"
[ "$SETUP_ONLY" = 1 ] && exit 0

# A tiny fixture model for the generation, converted once per run (numpy only).
in_root "$ROOT" sh -c 'cd /tmp && convert-model /src/edgellm/tests/fixtures/tiny/llama \
  /tmp/tiny-q4_0.edgellm --quant q4_0 -q'

TIMES=$(mktemp)
cpu_seconds() {  # CPU_S = CPU seconds (user + system) used by this shell's finished children
  times >"$TIMES"  # (in this shell: a pipe or $(...) is a subshell, without those children)
  CPU_S=$(tail -1 "$TIMES" | awk '{ s = 0; for (i = 1; i <= NF; i++) { split($i, t, "m");
    sub("s", "", t[2]); s += t[1] * 60 + t[2] }; printf "%d", s }')
}

run_cpu() {  # run_cpu CPU TESTS...: the tests (if any) and a generation on that core model
  local cpu=$1; shift
  local env=(QEMU_CPU="$cpu" NUMBA_CPU_NAME="$cpu" NUMBA_NUM_THREADS=2)
  local start=$SECONDS cpu0 out
  cpu_seconds; cpu0=$CPU_S
  if [ $# -gt 0 ]; then
    log "$cpu: python -m pytest $*"
    in_root "$ROOT" "${env[@]}" sh -c "cd /src/edgellm && python -m pytest -q -p no:cacheprovider $*"
    cpu_seconds
    log "$cpu: tests passed in $((SECONDS - start)) s ($((CPU_S - cpu0)) s of CPU)"
  fi
  log "$cpu: edgellm generate (tiny llama fixture, q4_0, 2 threads: the fused parallel step)"
  out=$(in_root "$ROOT" "${env[@]}" sh -c 'cd /tmp && edgellm generate -m /tmp/tiny-q4_0.edgellm \
      -p "Once upon a time" -n 16 --temp 0 -t 2 --verbose')
  [ -n "$out" ] || die "$cpu: empty generation"
  in_root "$ROOT" "${env[@]}" python3 -c '
import numba
from edgellm.runtime import numba_setup
from edgellm.runtime import simd
assert simd.SIMD_PATH == "portable", simd.SIMD_PATH
print("simd path", simd.SIMD_PATH, "| numba cpu", numba.config.CPU_NAME, "| threading layer",
      numba_setup.THREADING_LAYER)'
  log "$cpu: generated $(printf %q "$out")"
  cpu_seconds
  log "$cpu: passed in $((SECONDS - start)) s ($((CPU_S - cpu0)) s of CPU; the" \
    "machine's load average: $(cut -d' ' -f1-3 /proc/loadavg))"
}

TOTAL=$SECONDS
pids=()
for cpu in $CPUS; do
  case $MODE in
    kernel) tests=$KERNEL_TESTS ;;
    full) tests=tests ;;
    smoke) tests=$SMOKE_TESTS ;;
    tests) tests=$TESTS ;;
  esac
  if [ "$PARALLEL" = 1 ]; then
    run_cpu "$cpu" $tests > >(sed -u "s/^/[$cpu] /") 2>&1 &
    pids+=($!)
  else
    run_cpu "$cpu" $tests
  fi
done
for p in "${pids[@]}"; do wait "$p" || die "a CPU run failed (see above)"; done
cpu_seconds
log "all passed ($MODE, $CPUS) in $((SECONDS - TOTAL)) s ($CPU_S s of CPU in all)"
