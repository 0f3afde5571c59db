#!/usr/bin/env bash
# run_defaults.sh: the defaults of issue 43 against the old ones, in the same run, on one GPU
# (docs/benchmarks.md, "Defaults"). Each part puts its baselines beside it:
#   saver         tests/bench/memory_saver_cycles.py: a memory saver's pause / resume / write
#                 cycles, torch_memory_saver alone, vmmipc's defaults and VMMIPC_FOLLOW=0;
#                 8 GiB with one importer, then 32 GiB with three
#   registration  tests/bench/run_registration.sh: the all-to-all, N = 2, 4, 8, K = 64 x 2 MiB,
#                 modes warm (the defaults), nofollow (VMMIPC_FOLLOW=0) and ahead
#                 (VMMIPC_AHEAD=1), legacy IPC and the driver's floor in each run, a process's
#                 first registration apart from its later ones
#   first-open    tests/bench/first_open_bench.py: the first open of a fresh PyTorch pair, with
#                 the defaults and with VMMIPC_FOLLOW=0 (legacy and the floor in each)
#   rest          tests/bench/rest_footprint.py: fds and threads per rank at rest at N = 8
# Usage: run_defaults.sh --lib LIBVMMIPC --a2a-bin VMMIPC_ALL_TO_ALL --out DIR
#                        [--parts "saver registration first-open rest"] [--budget-s 540]
# Every part's output goes to DIR/<part>.txt; the exit status is the first failing part's.
set -u
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LIB="" A2A="" OUT="" PARTS="saver registration first-open rest" BUDGET=540
while (($#)); do
  case $1 in
    --lib) LIB=$2; shift 2 ;;
    --a2a-bin) A2A=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --parts) PARTS=$2; shift 2 ;;
    --budget-s) BUDGET=$2; shift 2 ;;
    *) echo "run_defaults.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -n $LIB && -n $OUT ]] || { echo "run_defaults.sh: --lib and --out are needed" >&2; exit 2; }
mkdir -p "$OUT" || exit 1
DEADLINE=$(($(date +%s) + BUDGET))
STATUS=0
# part NAME SECONDS COMMAND...: runs it with at most SECONDS (and what is left), output teed.
part() {
  local name=$1 want=$2 left
  shift 2
  left=$((DEADLINE - $(date +%s)))
  ((left < want)) && want=$left
  if ((want < 20)); then
    echo "== $name: not run, the budget is spent" | tee "$OUT/$name.txt"
    return
  fi
  echo "== $name ($want s at most): $*"
  timeout -k 5 "$want" "$@" >"$OUT/$name.txt" 2>"$OUT/$name.log"
  local rc=$?
  tail -40 "$OUT/$name.txt"
  echo "== $name: exit $rc"
  ((rc != 0 && rc != 77 && STATUS == 0)) && STATUS=$rc
}
for p in $PARTS; do
  case $p in
    saver)
      part saver-8g 150 python3 "$HERE/memory_saver_cycles.py" --lib "$LIB" --size-gib 8 \
        --importers 1 --cycles 3 --rounds 2 --out "$OUT/saver-8g"
      part saver-32g 120 python3 "$HERE/memory_saver_cycles.py" --lib "$LIB" --size-gib 32 \
        --importers 3 --cycles 2 --rounds 1 --out "$OUT/saver-32g" ;;
    registration)
      part registration 200 bash "$HERE/run_registration.sh" --bin "$A2A" --lib "$LIB" \
        --out "$OUT/registration" --ranks "2 4 8" --buffers 64 --sizes 2MiB \
        --modes "warm nofollow ahead" --rounds 2 --reps 3 --budget-s 190 ;;
    first-open)
      part first-open-default 60 env LD_PRELOAD="$LIB" python3 "$HERE/first_open_bench.py" \
        --rounds 5
      part first-open-nofollow 60 env LD_PRELOAD="$LIB" VMMIPC_FOLLOW=0 \
        python3 "$HERE/first_open_bench.py" --rounds 5 ;;
    rest)
      part rest 90 python3 "$HERE/rest_footprint.py" --lib "$LIB" --ranks 8 --rounds 2 ;;
    *) echo "run_defaults.sh: unknown part $p" >&2; exit 2 ;;
  esac
done
exit $STATUS
