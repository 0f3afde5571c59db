#!/usr/bin/env bash
# The Python wheel as a user gets it: scripts/build-wheel.sh builds it (pip wheel .:
# scikit-build-core, fetched by pip, builds libvmmipc.so with CMake, Release, stripped, no
# tests, with the simulator and the demo's peer) and checks it with auditwheel; it is
# installed into a fresh virtual environment as a binary wheel (no build, no compiler).
# Then what it installed: `python -m vmmipc --lib` points inside the package, the library
# and vmmipc-config beside it need only libc/libstdc++/libgcc_s and no binary has a
# RUNPATH, `python -m vmmipc --config` answers from that vmmipc-config, `vmmipc-run
# --check` on the simulated driver ends in WARN (exit 2) with that library, without a
# driver it does not load the package's simulator and says how to run the demo, the run
# mode's LD_PRELOAD, preload_env(), --deepep's hook, `python -m vmmipc demo` on the
# package's simulator, and the demo script preloading the installed library.
#   wheel_smoke.sh [BUILD_DIR]   (a build with the simulated driver and vmmipc_peer; default build)
# Needs python3 with venv and pip, and PyPI (CI: .ci/run). Not a ctest: it downloads.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=$(cd "${1:-build}" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "wheel_smoke: $*" >&2; exit 1; }

python3 -m venv "$work/venv" ||
  fail "python3 -m venv failed (Debian/Ubuntu: apt-get install python3-venv)"
py=$work/venv/bin/python
if ! scripts/build-wheel.sh "$work/dist" >"$work/build.log" 2>&1; then
  cat "$work/build.log" >&2
  fail "scripts/build-wheel.sh failed"
fi
grep -A3 "is consistent with" "$work/build.log" || true  # auditwheel show's verdict
wheel=$(ls "$work"/dist/vmmipc-*.whl)
[[ $(basename "$wheel") == vmmipc-*-py3-none-manylinux_*_x86_64.whl ||
   $(basename "$wheel") == vmmipc-*-py3-none-manylinux_*_aarch64.whl ]] ||
  fail "not a manylinux wheel: $(basename "$wheel")"
# A binary wheel: pip neither builds nor fetches anything for it.
"$py" -m pip install --quiet --no-index --no-deps --only-binary :all: "$wheel" ||
  fail "pip install $(basename "$wheel") failed"

lib=$("$py" -m vmmipc --lib) || fail "python -m vmmipc --lib failed"
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
[ "$lib" = "$site/vmmipc/libvmmipc.so" ] ||
  fail "python -m vmmipc --lib: $lib, expected $site/vmmipc/libvmmipc.so"
[ -f "$lib" ] || fail "$lib does not exist"
[ -x "$work/venv/bin/vmmipc-run" ] || fail "no vmmipc-run console script"
tool=$site/vmmipc/vmmipc-config
[ -x "$tool" ] || fail "no executable vmmipc-config beside the library in the package"
sim=$site/vmmipc/_sim
[ -f "$sim/libcuda.so.1" ] && [ -x "$sim/vmmipc_peer" ] ||
  fail "no simulated driver and peer in $sim"
if command -v readelf >/dev/null; then
  for binary in "$lib" "$tool"; do
    needed=$(readelf -d "$binary" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort | tr '\n' ' ')
    [ "$needed" = "libc.so.6 libgcc_s.so.1 libstdc++.so.6 " ] ||
      fail "the wheel's $(basename "$binary") needs: $needed"
  done
  # Nothing may lead the loader into the package: the simulator is found only when asked.
  for binary in "$lib" "$tool" "$sim/libcuda.so.1" "$sim/vmmipc_peer"; do
    ! readelf -d "$binary" | grep -E "\((RPATH|RUNPATH)\)" ||
      fail "the wheel's $(basename "$binary") has a search path"
  done
fi
# The configuration, from the package's vmmipc-config (no source tree to fall back on).
out=$(env -u LD_PRELOAD BUILD_DIR=/nonexistent LOCAL_RANK=3 "$py" -m vmmipc --config) ||
  fail "python -m vmmipc --config failed"
"$py" -c 'import json, sys
rank = json.load(sys.stdin)["rank"]
sys.exit((rank["rank"], rank["source"]) != (3, "LOCAL_RANK"))' <<<"$out" ||
  fail "python -m vmmipc --config: $out"
out=$("$py" -m vmmipc --print-env)
[ "$out" = "export LD_PRELOAD=$lib" ] || fail "python -m vmmipc --print-env: $out"

# --check on the simulated driver: the installed library, and WARN for the simulator.
rc=0
out=$(env -u LD_PRELOAD LD_LIBRARY_PATH="$build/sim" "$work/venv/bin/vmmipc-run" --check) || rc=$?
[ "$rc" = 2 ] || fail "vmmipc-run --check exited $rc, expected 2 (WARN: the simulated driver): $out"
grep -q "^\[  ok\] library  *$lib (loads with LD_PRELOAD)" <<<"$out" ||
  fail "--check did not use the installed library: $out"
grep -q "^VERDICT: WARN: " <<<"$out" || fail "--check verdict: $out"

# Without a driver: the package's simulator is not loaded, and the demo is offered.
if ! env -u LD_PRELOAD -u LD_LIBRARY_PATH "$py" -c 'import ctypes; ctypes.CDLL("libcuda.so.1")' \
    2>/dev/null; then
  rc=0
  out=$(env -u LD_PRELOAD -u LD_LIBRARY_PATH "$work/venv/bin/vmmipc-run" --check) || rc=$?
  [ "$rc" = 1 ] || fail "vmmipc-run --check without a driver exited $rc, expected 1: $out"
  grep -q "^\[FAIL\] CUDA driver  *libcuda.so.1 cannot be loaded" <<<"$out" ||
    fail "--check without a driver loaded one: $out"
  grep -q "^\[next\] try it .*$py -m vmmipc demo$" <<<"$out" ||
    fail "--check without a driver does not offer the wheel's demo: $out"
fi
out=$(env -u LD_PRELOAD "$py" -m vmmipc demo --simulated) ||
  fail "python -m vmmipc demo failed: $out"
grep -q "same address as the first run" <<<"$out" || fail "python -m vmmipc demo: $out"

# The run mode, preload_env() and --deepep's hook, all from the installed package.
# shellcheck disable=SC2016  # expanded by the child shell
out=$(env -u LD_PRELOAD "$work/venv/bin/vmmipc-run" -- sh -c 'echo "$LD_PRELOAD"')
[ "$out" = "$lib" ] || fail "vmmipc-run preloaded '$out'"
# shellcheck disable=SC2016  # expanded by the child shell
out=$(env -u LD_PRELOAD "$py" -c 'import subprocess, vmmipc
print(subprocess.run(["sh", "-c", "echo $LD_PRELOAD"], env=vmmipc.preload_env(),
                     capture_output=True, text=True).stdout.strip())
print(vmmipc.preload_env({"LD_PRELOAD": "/x/libother.so"})["LD_PRELOAD"])')
[ "$out" = "$lib"$'\n'"$lib:/x/libother.so" ] || fail "vmmipc.preload_env(): LD_PRELOAD '$out'"
out=$(env -u LD_PRELOAD -u PYTHONPATH "$work/venv/bin/vmmipc-run" --deepep -- "$py" -c \
  'import sys, sitecustomize as s; print(any(type(f).__name__ == "_ImportHook" for f in sys.meta_path), s.__file__)')
[ "$out" = "True $site/vmmipc/_site/sitecustomize.py" ] ||
  fail "--deepep did not activate the wheel's hook: $out"

# The demo, preloading the installed library (its peer program comes from the build).
DEMO_LIB=$lib BUILD_DIR=$(realpath --relative-to=. "$build") scripts/demo.sh ||
  fail "the demo failed with the installed library"
echo "wheel_smoke: ok ($lib)"
