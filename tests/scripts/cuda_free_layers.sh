#!/usr/bin/env bash
# The layers below core that must not know CUDA (docs/architecture.md): every
# source and header of common/, config/, ledger/ and transport/ compiles with a
# cuda.h that stops the compiler, first on the include path (a header no source
# of its layer includes is checked too). Usage: cuda_free_layers.sh CXX SRC_DIR
# [-Idir...] (the include dirs of fmt and spdlog when they are not the system's).
# The files are checked nproc at a time: one by one, on a loaded 2-core CI
# machine, the ~90 syntax checks took longer than the test's 300 s bound. fmt
# and spdlog are parsed as declarations only (not FMT_HEADER_ONLY): their
# implementations include no CUDA header, and parsing them in every file was a
# third of the test's time.
set -euo pipefail
cxx=$1
src=$2
shift 2
fake=$(mktemp -d)
trap 'rm -rf "$fake"' EXIT
echo '#error "this layer must not include cuda.h"' >"$fake/cuda.h"
check_one() {  # file: prints FAIL and the first errors when it does not compile
  local out
  if ! out=$("$CXX" -std=c++20 -fsyntax-only -x c++ -I"$FAKE" -I"$SRC/csrc" $EXTRA "$1" 2>&1); then
    echo "FAIL ${1#"$SRC"/}:"
    grep -m3 -E 'error|required from|included from' <<<"$out" || echo "$out" | head -5
  fi
}
export -f check_one
export CXX=$cxx SRC=$src FAKE=$fake EXTRA="$*"
report=$(for layer in common config ledger transport; do
           find "$src/csrc/$layer" -name "*.cc" -print0 -o -name "*.h" -print0
         done | xargs -0 -n 1 -P "$(nproc)" bash -c 'check_one "$0"')
if [ -n "$report" ]; then
  echo "$report"
  exit 1
fi
echo "common, config, ledger and transport need no CUDA header"
