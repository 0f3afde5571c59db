#!/usr/bin/env bash
# run_registration.sh: what registering peer buffers costs, by vmmipc mode, beside legacy IPC
# and the driver's floor (docs/benchmarks.md, "Registration"). For N ranks in {2, 4, 8} on one
# GPU, vmmipc_all_to_all --floor runs K per-rank buffers in {1, 8, 64} x {2 MiB, 20 MiB}, each run
# measuring legacy IPC, vmmipc and the floor (import + map + access with the fds in hand) in the
# same rank processes; the runs rotate through the modes of vmmipc, ROUNDS times, so that the
# host's drift falls on all alike:
#   warm      the defaults (follow, warm connections)
#   cold      VMMIPC_WARM_CONNECTIONS=0: a new connection per open
#   nofollow  VMMIPC_FOLLOW=0: legacy IPC's semantics, vmmipc's default before issue 43
#   ahead     VMMIPC_AHEAD=1: gets announced, runs mapped ahead in the importers' gaps; the
#             application's open adopts them
#   background VMMIPC_BACKGROUND_EXPORT=1: each chunk exported by a thread soon after its map,
#             so that the get is a lookup (the gap between allocation and gets: --gap-ms)
# tests/bench/registration_report.py then prints, per (N, K, size), the medians over the rounds
# and the ratios to legacy and to the floor; a process's first registration apart from the later
# ones (--no-warmup: the first repetition of K=first --buffers in each run is the ranks' first
# registration of each kind); and the vmmipc_fetch_bench line of the fetch alone beside a bare
# round trip (the floor of a fetch on a kept connection).
#
# Usage: run_registration.sh --bin A2A_BIN --lib LIBVMMIPC --out DIR [--fetch-bin FETCH_BIN]
#                            [--rounds R] [--reps R] [--budget-s S] [--ranks "2 4 8"]
#                            [--modes "warm cold nofollow ahead"] [--sizes 2MiB,20MiB]
#                            [--buffers 1,8,64] [--gap-ms MS] [--python PY]
# Exit: 0 when every run saw right data; 1 otherwise (a missed ratio is a result, not a failure).
set -u

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BIN="" LIB="" OUT="" FETCH_BIN="" ROUNDS=3 REPS=3 BUDGET=240 RANKS="2 4 8" PYTHON=python3
MODES="warm cold" SIZES=2MiB,20MiB BUFFERS=1,8,64 GAP_MS=0
while (($#)); do
  case $1 in
    --bin) BIN=$2; shift 2 ;;
    --lib) LIB=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --fetch-bin) FETCH_BIN=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --budget-s) BUDGET=$2; shift 2 ;;
    --ranks) RANKS=$2; shift 2 ;;
    --python) PYTHON=$2; shift 2 ;;
    --modes) MODES=$2; shift 2 ;;
    --sizes) SIZES=$2; shift 2 ;;
    --buffers) BUFFERS=$2; shift 2 ;;
    --gap-ms) GAP_MS=$2; shift 2 ;;
    *) echo "run_registration.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [[ -z $BIN || -z $LIB || -z $OUT ]]; then
  echo "usage: run_registration.sh --bin A2A_BIN --lib LIBVMMIPC --out DIR [options]" >&2
  exit 2
fi
[[ -x $BIN ]] || { echo "run_registration.sh: $BIN is not built" >&2; exit 1; }
[[ -f $LIB ]] || { echo "run_registration.sh: $LIB is not built" >&2; exit 1; }
mkdir -p "$OUT" || exit 1
rm -f "$OUT"/reg-*.json "$OUT"/reg-*.log "$OUT"/fetch.json
START=$(date +%s)
DEADLINE=$((START + BUDGET))
FAILED=0
for mode in $MODES; do
  case $mode in
    warm | cold | nofollow | ahead | background) ;;
    *) echo "run_registration.sh: unknown mode $mode (warm, cold, nofollow, ahead, background)" >&2
       exit 2 ;;
  esac
done
CLEAN_ENV=(-u VMMIPC_RANK -u LOCAL_RANK -u RANK -u VMMIPC_STATS -u VMMIPC_WARM_CONNECTIONS
  -u VMMIPC_FOLLOW -u VMMIPC_AHEAD -u VMMIPC_PREFETCH -u VMMIPC_BACKGROUND_EXPORT)

if [[ -n $FETCH_BIN ]]; then
  timeout -k 5 60 "$FETCH_BIN" --rounds=9 --fetches=300 --json="$OUT/fetch.json" \
    || { echo "registration: FAILED: vmmipc_fetch_bench"; FAILED=1; }
fi

# One launcher run: NAME, then the mode's environment, then the launcher's arguments.
run() {
  local name=$1 how=$2 n=$3 left
  left=$((DEADLINE - $(date +%s) - 10))
  if ((left < 20)); then
    echo "registration: $name not run: the time budget (${BUDGET}s) is spent"
    return
  fi
  local mode=()
  case $how in
    cold) mode=(VMMIPC_WARM_CONNECTIONS=0) ;;
    nofollow) mode=(VMMIPC_FOLLOW=0) ;;
    ahead) mode=(VMMIPC_AHEAD=1) ;;
    background) mode=(VMMIPC_BACKGROUND_EXPORT=1) ;;
  esac
  timeout -k 5 "$left" env "${CLEAN_ENV[@]}" "${mode[@]}" LD_PRELOAD="$LIB" "$BIN" \
    --ranks "$n" --gpus 1 --per-rank-buffers "$BUFFERS" --chunk-size "$SIZES" --floor \
    --chunks-per-buffer 1 --reps "$REPS" --timeout-s 60 --budget-s $((left > 30 ? left - 20 : 10)) \
    --no-warmup --gap-ms "$GAP_MS" \
    --json "$OUT/$name.json" >"$OUT/$name.txt" 2>"$OUT/$name.log" </dev/null
  local rc=$?
  echo "registration: $name: exit $rc"
  ((rc != 0 && rc != 124 && rc != 137)) && FAILED=1
}

for ((round = 1; round <= ROUNDS; ++round)); do
  for n in $RANKS; do
    # Which mode goes first rotates with the round.
    read -r -a order <<<"$MODES"
    for ((i = 0; i < ${#order[@]}; ++i)); do
      mode=${order[(i + round) % ${#order[@]}]}
      run "reg-n$n-$mode-r$round" "$mode" "$n"
    done
  done
done
"$PYTHON" "$HERE/registration_report.py" --out "$OUT" || FAILED=1
echo "registration: total $(($(date +%s) - START))s"
exit "$FAILED"
