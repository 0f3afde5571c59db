#!/usr/bin/env bash
# The Python wheel as a user gets it: `pip install .` into a fresh virtual
# environment (pyproject.toml: scikit-build-core, fetched by pip, builds
# libvmmipc.so with CMake, Release, no tests), then what it installed:
# `python -m vmmipc --lib` points inside the package, the library and
# vmmipc-config beside it need only libc/libstdc++/libgcc_s, `python -m vmmipc
# --config` answers from that vmmipc-config, `vmmipc-run --check` on the
# simulated driver ends in WARN (exit 2) with that library, the run mode's
# LD_PRELOAD, preload_env(), --deepep's hook, and the demo preloading the
# installed library.
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
if ! "$py" -m pip install --quiet . >"$work/pip.log" 2>&1; then
  cat "$work/pip.log" >&2
  fail "pip install . failed"
fi

lib=$("$py" -m vmmipc --lib) || fail "python -m vmmipc --lib failed"
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
[ "$lib" = "$site/vmmipc/libvmmipc.so" ] ||
  fail "python -m vmmipc --lib: $lib, expected $site/vmmipc/libvmmipc.so"
[ -f "$lib" ] || fail "$lib does not exist"
[ -x "$work/venv/bin/vmmipc-run" ] || fail "no vmmipc-run console script"
tool=$site/vmmipc/vmmipc-config
[ -x "$tool" ] || fail "no executable vmmipc-config beside the library in the package"
if command -v readelf >/dev/null; then
  for binary in "$lib" "$tool"; do
    needed=$(readelf -d "$binary" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort | tr '\n' ' ')
    [ "$needed" = "libc.so.6 libgcc_s.so.1 libstdc++.so.6 " ] ||
      fail "the wheel's $(basename "$binary") needs: $needed"
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
