#!/usr/bin/env bash
# Installs what vmmipc needs from Debian/Ubuntu packages, checks for the CUDA
# driver API headers, then configures and builds into build/ (or $BUILD_DIR).
# Extra arguments go to cmake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}

packages=(cmake ninja-build g++ binutils libgtest-dev libgmock-dev libspdlog-dev libfmt-dev
          libbenchmark-dev clang)
# libFuzzer for tests/fuzz, where the distribution packages it apart from clang
# (Debian 12: libclang-rt-dev -> libclang-rt-14-dev). Without it the fuzz tests skip.
optional=(libclang-rt-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
for p in "${optional[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" && continue
  apt-cache show "$p" >/dev/null 2>&1 && missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
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

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S . -B "$BUILD_DIR" "${generator[@]}" -DCUDAToolkit_ROOT="$cuda_root" "$@" >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)"
echo "setup: built $BUILD_DIR/csrc/libvmmipc.so"
