#!/usr/bin/env bash
# The README's test command: installs what the tests need, builds the library and the test
# suites that need no GPU (scripts/setup.sh --tests: the cpu_tests target) and runs them
# (ctest labels unit and sim), then prints one line per suite and every skip with its reason
# (scripts/test-summary.py); the build's and the tests' full output go to $BUILD_DIR/test-build.log
# and $BUILD_DIR/test.log. Not here, because on a small machine they take long and find little
# that the suites do not: the fuzz targets (a clang build with ASan and UBSan, and their bounded
# runs, label fuzz) and the benchmarks' smoke runs (label bench).
#   scripts/test.sh [--all] [ctest arguments...]
#   --all   build every target (scripts/setup.sh) and run every test that needs no GPU, fuzz
#           and benchmarks included: what .ci/run runs, in each of its build folders.
# GPU tests: scripts/gpu-check.sh. Arguments go to ctest (e.g. -R, -E, -L).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
all=0
if [ "${1:-}" = "--all" ]; then
  all=1
  shift
fi
mkdir -p "$BUILD_DIR"
build_log=$BUILD_DIR/test-build.log
start=$SECONDS
if ((all)); then
  echo "test: building everything into $BUILD_DIR (log: $build_log)"
  setup=(scripts/setup.sh)
  select=(-LE gpu)
else
  echo "test: building the library and the suites that need no GPU into $BUILD_DIR (log: $build_log)"
  setup=(scripts/setup.sh --tests)
  select=(-LE 'gpu|fuzz|bench')
fi
if ! "${setup[@]}" >"$build_log" 2>&1; then
  tail -n 40 "$build_log" >&2
  echo "test: the build failed; its output is in $build_log" >&2
  exit 1
fi
echo "test: built in $((SECONDS - start)) s; running the tests (log: $BUILD_DIR/test.log)"
junit=$(cd "$BUILD_DIR" && pwd)/test-results.xml  # absolute: ctest takes it from the build folder
rm -f "$junit"
rc=0
ctest --test-dir "$BUILD_DIR" "${select[@]}" --output-on-failure -j "$(nproc)" \
  --output-junit "$junit" "$@" >"$BUILD_DIR/test.log" 2>&1 || rc=$?
extra=()
((all)) || extra=(--not-run "fuzz targets and benchmarks' smoke runs: scripts/test.sh --all (.ci/run)")
python3 scripts/test-summary.py "$junit" --log "$BUILD_DIR/test.log" "${extra[@]}" ||
  { [ "$rc" -ne 0 ] || rc=1; }
echo "test: $((SECONDS - start)) s in all"
exit "$rc"
