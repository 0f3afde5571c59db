#!/usr/bin/env bash
# The README's test command: installs what the tests need and builds everything
# (scripts/setup.sh: after the demo's setup, the rest: tests, benchmarks, fuzz
# targets), then runs every test that does not need a GPU (labels unit, sim,
# fuzz). GPU tests: scripts/gpu-check.sh. Arguments go to ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
scripts/setup.sh
ctest --test-dir "$BUILD_DIR" -LE gpu --output-on-failure -j "$(nproc)" "$@"
