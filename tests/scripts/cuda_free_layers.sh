#!/usr/bin/env bash
# The layers below core that must not know CUDA (docs/architecture.md): every
# source and header of common/, config/, state/ and transport/ compiles with a
# cuda.h that stops the compiler, first on the include path (a header no source
# of its layer includes is checked too). Usage: cuda_free_layers.sh CXX SRC_DIR
# [-Idir...] (the include dirs of fmt and spdlog when they are not the system's).
set -euo pipefail
cxx=$1
src=$2
shift 2
fake=$(mktemp -d)
trap 'rm -rf "$fake"' EXIT
echo '#error "this layer must not include cuda.h"' >"$fake/cuda.h"
failed=0
for layer in common config state transport; do
  for file in "$src/csrc/$layer"/*.cc "$src/csrc/$layer"/*.h; do
    if ! out=$("$cxx" -std=c++20 -fsyntax-only -x c++ -DFMT_HEADER_ONLY=1 -DSPDLOG_HEADER_ONLY=1 \
        -I"$fake" -I"$src/csrc" "$@" "$file" 2>&1); then
      echo "FAIL ${file#"$src"/}:"
      grep -m3 -E 'error|required from|included from' <<<"$out" || echo "$out" | head -5
      failed=1
    fi
  done
done
((failed == 0)) && echo "common, config, state and transport need no CUDA header"
exit "$failed"
