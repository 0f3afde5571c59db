#!/usr/bin/env bash
# The README's demo: builds what it needs (scripts/setup.sh --demo: the library, the
# simulated driver and the peer program, not the tests), then shows the driver refusing
# legacy CUDA IPC on VMM memory without vmmipc (CUDA_ERROR_INVALID_VALUE, which the
# simulated driver reproduces), and two processes sharing that memory through legacy
# CUDA IPC with libvmmipc.so preloaded, on
# the GPU when there is one, else on the project's simulated driver. It runs
# the pair twice to show that the importer's address is the same in fresh runs.
# DEMO_LIB=PATH preloads that library instead of the build's (CI: the one a
# `pip install .` put in its virtual environment, from `python -m vmmipc --lib`).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
if [ -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake --build "$BUILD_DIR" -j "$(nproc)" --target vmmipc vmmipc_peer vmmipc_sim_cuda >/dev/null
else
  scripts/setup.sh --demo
fi

lib="${DEMO_LIB:-$PWD/$BUILD_DIR/csrc/libvmmipc.so}"
[ -f "$lib" ] || { echo "demo: no library at $lib" >&2; exit 1; }
peer="$PWD/$BUILD_DIR/tests/e2e/vmmipc_peer"
if "$peer" probe >/dev/null 2>&1; then
  where="the GPU (real CUDA driver)"
  driver_path="${LD_LIBRARY_PATH:-}"
else
  where="the simulated CUDA driver (no GPU here; host memory stands in for device memory)"
  driver_path="$PWD/$BUILD_DIR/sim"
fi
chunk=$((2 << 20))

# One peer process, driven through two fifos: ask NAME CMD prints the answer.
work=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work"' EXIT
declare -A to_peer from_peer
start_peer() {  # name rank [library to preload: the build's by default, "" for none]
  local name=$1 rank=$2 preload=${3-$lib}
  mkfifo "$work/$name.in" "$work/$name.out"
  env LD_PRELOAD="$preload" LD_LIBRARY_PATH="$driver_path" VMMIPC_RANK="$rank" \
    VMMIPC_LOG_LEVEL="${VMMIPC_LOG_LEVEL:-warn}" "$peer" <"$work/$name.in" >"$work/$name.out" &
  pids+=($!)
  exec {fd_in}>"$work/$name.in" {fd_out}<"$work/$name.out"
  to_peer[$name]=$fd_in
  from_peer[$name]=$fd_out
}
stop_peer() {  # name
  echo exit >&"${to_peer[$1]}"
  exec {to_peer[$1]}>&- {from_peer[$1]}<&-
  rm -f "$work/$1.in" "$work/$1.out"
}
answer() {  # name command: the answer as it is ("ok ..." or "err <CUresult> <name>")
  echo "$2" >&"${to_peer[$1]}"
  local answer
  IFS= read -r -t 30 answer <&"${from_peer[$1]}" || answer="err no answer"
  echo "$answer"
}
ask() {  # name command: the answer's values; anything but ok ends the demo
  local answer
  answer=$(answer "$1" "$2")
  [[ $answer == ok* ]] || { echo "demo: '$2' failed: $answer" >&2; exit 1; }
  echo "${answer#ok}" | sed 's/^ //'
}

echo "vmmipc demo on $where"
[ -z "${DEMO_LIB:-}" ] || echo "library: $lib"

# The driver's own answer first: no preload, VMM memory, legacy IPC's get.
start_peer BARE 0 ""
ask BARE init >/dev/null
bare_pid=$(ask BARE pid)
bare_base=$(ask BARE "alloc_vmm buf $chunk 2")
read -r status code name <<<"$(answer BARE "get $bare_base")"
stop_peer BARE
wait
pids=()
echo
if [ "$status" = err ] && [ -n "$name" ]; then
  refused="$name ($code): the driver refuses VMM memory for legacy IPC"
else
  refused="'$status $code $name' (this driver did not refuse it)"
fi
echo "without vmmipc (pid $bare_pid, no LD_PRELOAD): cuMemCreate + cuMemMap at $bare_base, cuIpcGetMemHandle -> $refused"
for run in 1 2; do
  start_peer EXPORTER 0
  ask EXPORTER init >/dev/null
  exporter_pid=$(ask EXPORTER pid)
  base=$(ask EXPORTER "alloc_vmm buf $chunk 2")
  ask EXPORTER "fill $base $((2 * chunk)) 7" >/dev/null
  handle=$(ask EXPORTER "get $base")
  start_peer IMPORTER 1
  ask IMPORTER init >/dev/null
  importer_pid=$(ask IMPORTER pid)
  ptr=$(ask IMPORTER "open $handle")
  ask IMPORTER "check $ptr $((2 * chunk)) 7" >/dev/null
  ask IMPORTER "fill $ptr $((2 * chunk)) 8" >/dev/null
  ask EXPORTER "check $base $((2 * chunk)) 8" >/dev/null
  if [ "$run" = 1 ]; then
    echo
    echo "exporter (pid $exporter_pid, VMMIPC_RANK=0): cuMemCreate + cuMemMap, 2 chunks of 2 MiB at $base"
    echo "cuIpcGetMemHandle($base) -> 64-byte VMM2 handle:"
    echo "  $handle"
    echo "  $(ask IMPORTER "decode $handle")"
    echo "importer (pid $importer_pid, VMMIPC_RANK=1): cuIpcOpenMemHandle -> $ptr"
    echo "  = import zone 0x300000000000 + slot 0 x 1 TiB + (address - region base)"
    echo "importer read the exporter's 4 MiB across the chunk boundary: ok"
    echo "importer wrote 4 MiB through its mapping; the exporter read them back: ok"
    first=$ptr
  else
    echo
    echo "second run, fresh processes: importer got $ptr"
    if [ "$ptr" = "$first" ]; then
      echo "same address as the first run: pointers baked into CUDA graphs stay valid"
    else
      echo "demo: addresses differ between runs ($first vs $ptr)" >&2
      exit 1
    fi
  fi
  ask IMPORTER "close $ptr" >/dev/null
  stop_peer IMPORTER
  stop_peer EXPORTER
  wait
  pids=()
done
