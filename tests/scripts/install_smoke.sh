#!/usr/bin/env bash
# The install tree as a user gets it: `cmake --install BUILD --prefix P`, then
# the library and vmmipc-config without debug info (it is in .debug/ beside them,
# linked by .gnu_debuglink), P/bin/vmmipc-run --check (no driver: it must find the
# installed library, fail on the driver only and say what to do next), its options
# settled by P/bin/vmmipc-config, the run
# mode's LD_PRELOAD, --deepep's Python hook,
# pkg-config, a CMake project that does find_package(vmmipc), and the same
# after moving the tree.
#   install_smoke.sh BUILD_DIR [CMAKE]
set -euo pipefail
build=$(cd "$1" && pwd)
cmake=${2:-cmake}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "install_smoke: $*" >&2; exit 1; }

"$cmake" --install "$build" --prefix "$work/p" >/dev/null
lib=$(find "$work/p" -name libvmmipc.so -type f | head -1)
[ -n "$lib" ] || fail "no libvmmipc.so installed"
libdir=${lib%/libvmmipc.so}
for f in bin/vmmipc-run bin/vmmipc-config share/vmmipc/python/vmmipc/deepep.py \
         share/vmmipc/python/vmmipc/run.py share/vmmipc/python/vmmipc/settled.py \
         share/vmmipc/python/vmmipc/probe.py \
         share/vmmipc/python/vmmipc/__main__.py share/vmmipc/python/sitecustomize.py \
         share/doc/vmmipc/README.md share/doc/vmmipc/docs/configuration.md \
         share/doc/vmmipc/docs/bench-h200.png; do
  [ -e "$work/p/$f" ] || fail "$f not installed"
done
[ -x "$work/p/bin/vmmipc-run" ] || fail "bin/vmmipc-run is not executable"
[ -x "$work/p/bin/vmmipc-config" ] || fail "bin/vmmipc-config is not executable"
# Debug info apart (cmake/VmmipcInstall.cmake), unless the build turned that off.
if command -v readelf >/dev/null &&
   ! grep -q "^VMMIPC_INSTALL_SPLIT_DEBUG:BOOL=OFF" "$build/CMakeCache.txt"; then
  for f in "$lib" "$work/p/bin/vmmipc-config"; do
    ! grep -q "\.debug_info" <<<"$(readelf -S --wide "$f")" || fail "$f has its debug info"
    debug=$(dirname "$f")/.debug/$(basename "$f").debug
    if [ -f "$debug" ]; then
      grep -q "\.debug_info" <<<"$(readelf -S --wide "$debug" 2>/dev/null)" ||
        fail "$debug has no debug info"
      grep -q "$(basename "$debug")" <<<"$(readelf --string-dump=.gnu_debuglink "$f")" ||
        fail "$f does not link $debug"
    fi
  done
  echo "install_smoke: installed libvmmipc.so $(du -k "$lib" | cut -f1) KiB (built:" \
       "$(du -k "$build/csrc/libvmmipc.so" | cut -f1) KiB)"
fi
[ -f "$libdir/pkgconfig/vmmipc.pc" ] || fail "vmmipc.pc not installed"
[ -f "$libdir/cmake/vmmipc/vmmipcConfig.cmake" ] || fail "vmmipcConfig.cmake not installed"

check_tree() {  # prefix
  local p=$1 out rc=0
  out=$(env -u LD_PRELOAD VMMIPC_CUDA_LIBRARY=libcuda-that-does-not-exist.so.1 \
        "$p/bin/vmmipc-run" --check) || rc=$?
  [ "$rc" = 1 ] || fail "--check in $p exited $rc, expected 1 (no driver): $out"
  grep -q "^\[  ok\] library  *$p/.*libvmmipc.so (loads with LD_PRELOAD)" <<<"$out" ||
    fail "--check did not find the installed library: $out"
  grep -q "^VERDICT: FAIL: cannot share memory here: no CUDA driver" <<<"$out" ||
    fail "--check verdict: $out"
  # No simulator in an install tree: the wheel's demo or the source tree's.
  grep -q "^\[next\] try it .*python -m vmmipc demo) or a source tree (scripts/demo.sh)" \
    <<<"$out" || fail "--check's next step: $out"
  # The installed vmmipc-config settles the options (BUILD_DIR: no source tree to fall back on).
  out=$(env -u LD_PRELOAD BUILD_DIR=/nonexistent "$p/bin/vmmipc-run" --log-level INFO --print-env)
  grep -q "^export VMMIPC_LOG_LEVEL=info$" <<<"$out" || fail "--log-level in $p: $out"
  # shellcheck disable=SC2016  # expanded by the child shell, after vmmipc-run set it
  out=$(env -u LD_PRELOAD "$p/bin/vmmipc-run" -- sh -c 'echo "$LD_PRELOAD"')
  [[ $out == "$p"/*/libvmmipc.so || $out == "$p"/lib/libvmmipc.so ]] ||
    fail "run mode preloaded '$out'"
  out=$(env -u LD_PRELOAD -u PYTHONPATH "$p/bin/vmmipc-run" --deepep -- python3 -c \
        'import sys, sitecustomize as s; print(any(type(f).__name__ == "_ImportHook" for f in sys.meta_path), s.__file__)')
  [[ $out == "True $p/share/vmmipc/python/sitecustomize.py" ]] ||
    fail "--deepep did not activate the installed Python hook: $out"
  if command -v pkg-config >/dev/null; then
    local pcdir; pcdir=$(dirname "$(find "$p" -name vmmipc.pc | head -1)")
    out=$(PKG_CONFIG_PATH=$pcdir pkg-config --libs vmmipc)
    [[ $out == *-lvmmipc* ]] || fail "pkg-config --libs: $out"
    local dir=${out#-L}; dir=${dir%% *}
    [ -f "$dir/libvmmipc.so" ] || fail "pkg-config's -L$dir has no libvmmipc.so"
    [ "vmmipc-run $(PKG_CONFIG_PATH=$pcdir pkg-config --modversion vmmipc)" \
      = "$("$p/bin/vmmipc-run" --version)" ] || fail "pkg-config version"
  fi
}
check_tree "$work/p"

# A project that links the library through the CMake package.
mkdir "$work/consumer"
cat >"$work/consumer/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.22)
project(consumer LANGUAGES C)
find_package(vmmipc 0.1 REQUIRED)
add_executable(consumer main.c)
target_link_libraries(consumer PRIVATE vmmipc::vmmipc)
if(NOT EXISTS "${vmmipc_LIBRARY}" OR NOT EXISTS "${vmmipc_RUN_EXECUTABLE}")
  message(FATAL_ERROR "vmmipc_LIBRARY or vmmipc_RUN_EXECUTABLE missing")
endif()
CMAKE
echo 'int main(void) { return 0; }' >"$work/consumer/main.c"
"$cmake" -S "$work/consumer" -B "$work/consumer/build" -DCMAKE_PREFIX_PATH="$work/p" >/dev/null ||
  fail "find_package(vmmipc) failed"
"$cmake" --build "$work/consumer/build" >/dev/null || fail "linking vmmipc::vmmipc failed"

# Relocatable: the same checks after moving the whole tree.
mv "$work/p" "$work/moved"
check_tree "$work/moved"
echo "install_smoke: ok ($work/p, then moved)"
