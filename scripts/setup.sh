#!/usr/bin/env bash
# Installs what vmmipc needs from Debian/Ubuntu packages (apt-get, through sudo when not
# root), checks for the CUDA driver API headers, then configures and builds into build/
# (or $BUILD_DIR).
#   scripts/setup.sh [--demo | --tests] [cmake configure args...]
#   --demo   only what scripts/demo.sh needs: the packages of the library (cmake ninja-build
#            g++ binutils libfmt-dev libspdlog-dev), and the targets vmmipc, vmmipc-config,
#            vmmipc_peer and vmmipc_sim_cuda (VMMIPC_BUILD_SIM: without GTest too).
#   --tests  every package, and the targets of the suites that need no GPU (cpu_tests: no
#            fuzz targets, no benchmarks; scripts/test.sh).
#   Neither: every package (GTest, Google Benchmark, clang for the fuzz targets) and every
#            target (scripts/test.sh --all, .ci/run).
# Extra arguments go to cmake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
demo=0
tests_only=0
if [ "${1:-}" = "--demo" ]; then
  demo=1
  shift
elif [ "${1:-}" = "--tests" ]; then
  tests_only=1
  shift
fi

packages=(cmake ninja-build g++ binutils libspdlog-dev libfmt-dev)
optional=()
targets=(vmmipc vmmipc-config vmmipc_peer vmmipc_sim_cuda)
configure=(-DVMMIPC_BUILD_SIM=ON)
if ((demo == 0)); then
  packages+=(libgtest-dev libgmock-dev libbenchmark-dev clang)
  configure=()
  # libFuzzer for tests/fuzz, where the distribution packages it apart from clang
  # (Debian 12: libclang-rt-dev -> libclang-rt-14-dev). Without it the fuzz tests skip.
  optional+=(libclang-rt-dev)
  targets=()
fi
missing=()
if command -v dpkg-query >/dev/null; then
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  for p in "${optional[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" && continue
    apt-cache show "$p" >/dev/null 2>&1 && missing+=("$p")
  done
else
  echo "setup: not Debian/Ubuntu (no dpkg-query): installing nothing; vmmipc needs" \
       "${packages[*]} or their equivalents" >&2
fi
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]} (apt-get)"
  sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null; then
      echo "setup: not root and no sudo: install ${missing[*]} as root, then run this again" >&2
      exit 1
    fi
    sudo=(sudo)
  fi
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# The CUDA toolkit headers (cuda.h) are needed to build; libcuda is not.
cuda_h=""
for dir in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /usr; do
  if [ -n "$dir" ] && [ -f "$dir/include/cuda.h" ]; then cuda_h="$dir/include/cuda.h"; break; fi
done
if [ -z "$cuda_h" ]; then
  cat >&2 <<'MSG'
setup: cuda.h not found. vmmipc builds against the CUDA driver API headers.
Install the CUDA toolkit (https://developer.nvidia.com/cuda-downloads), or on
Debian/Ubuntu `apt-get install nvidia-cuda-toolkit`, or set CUDA_HOME to the
toolkit's directory, then run this script again.
MSG
  exit 1
fi
cuda_root=$(dirname "$(dirname "$cuda_h")")
echo "setup: CUDA headers in $cuda_root/include"

# Ninja for a new build folder; one configured before (plain cmake: Unix Makefiles) keeps
# its generator, which cmake refuses to change.
generator=()
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ] && command -v ninja >/dev/null; then
  generator=(-G Ninja)
fi
cmake -S . -B "$BUILD_DIR" "${generator[@]}" -DCUDAToolkit_ROOT="$cuda_root" "${configure[@]}" "$@" \
  >/dev/null
if ((demo)); then
  cmake --build "$BUILD_DIR" -j "$(nproc)" --target "${targets[@]}"
  echo "setup: built the demo's targets in $BUILD_DIR (${targets[*]})"
elif ((tests_only)); then
  cmake --build "$BUILD_DIR" -j "$(nproc)" --target cpu_tests
  echo "setup: built the library and the test suites that need no GPU in $BUILD_DIR"
else
  cmake --build "$BUILD_DIR" -j "$(nproc)"
  echo "setup: built $BUILD_DIR/csrc/libvmmipc.so and everything else"
fi
