#!/usr/bin/env bash
# Runs the libFuzzer targets longer than CI does, by hand:
#   tests/fuzz/run.sh [seconds per target (default 300)] [target...]
# Builds them first (BUILD_DIR, default build/; needs clang and
# libclang-rt-NN-dev, see tests/fuzz/CMakeLists.txt). New inputs go to
# $BUILD_DIR/tests/fuzz/corpus/<target>; a crash leaves its input in
# $BUILD_DIR/tests/fuzz/artifacts/ and the script exits non-zero.
# Re-create the committed seeds: FUZZ_WRITE_SEEDS=tests/fuzz/corpus/<target> <binary>.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${BUILD_DIR:-build}
seconds=${1:-300}
shift || true
targets=("$@")
if ((${#targets[@]} == 0)); then
  targets=(fuzz_handle_codec fuzz_wire_request fuzz_wire_reply fuzz_fetch_client
           fuzz_serve_connection)
fi
[ -f "$BUILD_DIR/CMakeCache.txt" ] || scripts/setup.sh
cmake --build "$BUILD_DIR" --target fuzz_targets
out="$BUILD_DIR/tests/fuzz"
status=0
for t in "${targets[@]}"; do
  mkdir -p "$out/corpus/$t" "$out/artifacts"
  echo "== $t: ${seconds} s"
  if ! "$out/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$out/artifacts/$t-" "$out/corpus/$t" "tests/fuzz/corpus/$t" \
      2> >(grep -E 'stat::number_of_executed_units|ERROR|FUZZ_CHECK|SUMMARY|DONE' >&2); then
    echo "== $t: FAILED (input in $out/artifacts/)"
    status=1
  fi
done
exit $status
