#!/usr/bin/env bash
# The README's test command: builds if needed, then runs every test that does
# not need a GPU (labels unit, sim, fuzz). GPU tests: scripts/gpu-check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
[ -f "$BUILD_DIR/CMakeCache.txt" ] || scripts/setup.sh
cmake --build "$BUILD_DIR" -j "$(nproc)"
ctest --test-dir "$BUILD_DIR" -LE gpu --output-on-failure -j "$(nproc)" "$@"
