#!/usr/bin/env bash
# run_all_to_all.sh: the all-to-all registration matrix of vmmipc_all_to_all (docs/benchmarks.md).
#   N ranks in {2, 4, 8}, on one GPU and (when there are two) on two; in each run, with the same
#   rank processes: K per-rank buffers in {1, 8, 64} x chunk size {2 MiB, 20 MiB} (one chunk per
#   buffer), R repetitions (3) with fresh buffers each. One launcher run per (N, GPUs):
#   OUT/all-to-all-nN-gG.{txt,log,json} (table, ranks' stderr, results); then
#   scripts/all-to-all-report.py -> OUT/all-to-all.md and the targets on stdout.
#   The runs that decide a target go first (N=2 on one GPU, N=8 on two), so a short budget keeps
#   them; a run that does not fit what is left is reported as not run.
#
# Usage: run_all_to_all.sh --bin BIN --lib LIBVMMIPC --out DIR [--reps R] [--budget-s S]
#                          [--max-gpus G] [--python PY] [--smoke]
#   --smoke  the simulated-driver check (ctest sim.bench_all_to_all_smoke): bad arguments exit 2,
#            a small matrix with the preload on two simulated GPUs (set SIMCUDA_DEVICE_COUNT=2),
#            the VMM part unsupported without it, a wrong tag fails the run; report --strict.
# The driver is whatever libcuda.so.1 the loader finds (LD_LIBRARY_PATH=<build>/sim: simulator).
# Exit: 0 when every run saw right data and nothing crashed (a missed target or a run left out
# for the budget is a result, not a failure); 1 otherwise.
set -u

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPORT="$HERE/../../scripts/all-to-all-report.py"
BIN="" LIB="" OUT="" REPS=3 BUDGET=180 MAX_GPUS=2 PYTHON=python3 SMOKE=0
while (($#)); do
  case $1 in
    --bin) BIN=$2; shift 2 ;;
    --lib) LIB=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --budget-s) BUDGET=$2; shift 2 ;;
    --max-gpus) MAX_GPUS=$2; shift 2 ;;
    --python) PYTHON=$2; shift 2 ;;
    --smoke) SMOKE=1; shift ;;
    *) echo "run_all_to_all.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [[ -z $BIN || -z $LIB || -z $OUT ]]; then
  echo "usage: run_all_to_all.sh --bin BIN --lib LIBVMMIPC --out DIR [options]" >&2
  exit 2
fi
if [[ ! -x $BIN ]]; then echo "run_all_to_all.sh: $BIN is not built" >&2; exit 1; fi
if [[ ! -f $LIB ]]; then echo "run_all_to_all.sh: $LIB is not built" >&2; exit 1; fi
mkdir -p "$OUT" || exit 1
rm -f "$OUT"/all-to-all-*.json "$OUT"/all-to-all-*.txt "$OUT"/all-to-all-*.log "$OUT"/all-to-all.md

START=$(date +%s)
DEADLINE=$((START + BUDGET))
FAILED=0
# Ranks are this script's children: no rank, local rank or stats setting of the caller leaks in.
CLEAN_ENV=(-u VMMIPC_RANK -u LOCAL_RANK -u RANK -u VMMIPC_STATS)

# a2a NAME LIMIT PRELOAD ARGS...: one launcher run, stdout to OUT/NAME.txt (and shown), stderr
# (the ranks' too) to OUT/NAME.log. Sets RC.
a2a() {
  local name=$1 limit=$2 preload=$3 t0
  shift 3
  t0=$(date +%s)
  timeout -k 5 "$limit" env "${CLEAN_ENV[@]}" LD_PRELOAD="$preload" "$BIN" "$@" \
    --json "$OUT/$name.json" >"$OUT/$name.txt" 2>"$OUT/$name.log" </dev/null
  RC=$?
  sed 's/^/  /' "$OUT/$name.txt"
  echo "all-to-all: $name: exit $RC in $(($(date +%s) - t0))s (stderr: $OUT/$name.log)"
  if ((RC != 0)); then
    grep -E 'FAILED|FATAL|vmmipc_all_to_all:' "$OUT/$name.log" | head -n 6 | sed 's/^/  | /'
  fi
}

# expect_exit CODE WHAT ARGS...: the binary must exit with CODE (argument checks).
expect_exit() {
  local code=$1 what=$2 rc
  shift 2
  timeout -k 5 30 env "${CLEAN_ENV[@]}" "$BIN" "$@" >/dev/null 2>"$OUT/args.log" </dev/null
  rc=$?
  if ((rc == code)); then
    echo "all-to-all: $what: exit $rc as expected"
  else
    echo "all-to-all: FAILED: $what: exit $rc, expected $code"
    sed 's/^/  | /' "$OUT/args.log" | head -n 4
    FAILED=1
  fi
}

report() {
  if ! command -v "$PYTHON" >/dev/null 2>&1; then
    echo "all-to-all: $PYTHON not found: no report (the JSON files are in $OUT)"
    FAILED=1
    return
  fi
  local files=("$OUT"/all-to-all-n*-g*.json)
  if [[ ! -f ${files[0]} ]]; then
    echo "all-to-all: no results to report"
    FAILED=1
    return
  fi
  timeout -k 5 60 "$PYTHON" "$REPORT" "${files[@]}" --markdown "$OUT/all-to-all.md" --summary "$@"
  local rc=$?
  echo "all-to-all: report exit $rc: $OUT/all-to-all.md; total $(($(date +%s) - START))s"
  ((rc != 0)) && FAILED=1
}

if ((SMOKE)); then
  # Arguments: clear message, exit 2.
  expect_exit 2 "--ranks 1" --ranks 1
  expect_exit 2 "--chunk-size 3MiB (not a multiple of 2 MiB)" --chunk-size 3MiB
  expect_exit 2 "--per-rank-buffers 0" --per-rank-buffers 0
  expect_exit 2 "--gpus 3 --ranks 2" --gpus 3 --ranks 2
  expect_exit 2 "--reps (no value)" --reps
  expect_exit 2 "an unknown argument" --bogus
  GPUS=$(env "${CLEAN_ENV[@]}" "$BIN" --count-gpus 2>/dev/null)
  if [[ $GPUS != "${SIMCUDA_DEVICE_COUNT:-1}" ]]; then
    echo "all-to-all: FAILED: --count-gpus printed '$GPUS', expected ${SIMCUDA_DEVICE_COUNT:-1}"
    FAILED=1
  fi
  G=$((GPUS >= 2 ? 2 : 1))
  # The matrix in small, with the preload: every phase must pass and every tag be right.
  # With the driver's floor beside them (it may be refused pidfd_getfd where the build machine
  # gives no ptrace rights: then "unsupported", never wrong data).
  a2a all-to-all-n3-g$G 60 "$LIB" --ranks 3 --gpus "$G" --per-rank-buffers 1,3 \
    --chunk-size 2MiB,4MiB --chunks-per-buffer 1,2 --reps 2 --timeout-s 30 --floor
  ((RC != 0)) && FAILED=1
  if [[ -f $OUT/all-to-all-n3-g$G.json ]] && command -v "$PYTHON" >/dev/null 2>&1; then
    "$PYTHON" - "$OUT/all-to-all-n3-g$G.json" <<'PY' || FAILED=1
import json, sys
configs = json.load(open(sys.argv[1]))["configurations"]
status = sorted({c["floor"]["status"] for c in configs})
print("all-to-all: the floor's status: %s" % ", ".join(status))
sys.exit(0 if status in (["ok"], ["unsupported"]) else 1)
PY
  fi
  a2a all-to-all-n2-g1 60 "$LIB" --ranks 2 --gpus 1 --per-rank-buffers 2 --chunk-size 2MiB \
    --reps 2 --timeout-s 30
  ((RC != 0)) && FAILED=1
  # Without the preload: legacy measured, VMM reported as unsupported, exit 0.
  a2a nopreload 60 "" --ranks 2 --gpus 1 --per-rank-buffers 2 --chunk-size 2MiB --reps 1 \
    --timeout-s 30
  ((RC != 0)) && FAILED=1
  if [[ -f $OUT/nopreload.json ]] && command -v "$PYTHON" >/dev/null 2>&1; then
    "$PYTHON" "$REPORT" "$OUT/nopreload.json" --strict --expect-vmm unsupported >/dev/null \
      || { echo "all-to-all: FAILED: the no-preload run is not 'legacy ok, vmmipc unsupported'"; FAILED=1; }
  fi
  # A wrong tag must fail the run (the check can fail).
  a2a corrupt 60 "$LIB" --ranks 2 --gpus 1 --per-rank-buffers 1 --chunk-size 2MiB --reps 1 \
    --timeout-s 30 --test-corrupt-tag
  if ((RC != 1)) || ! grep -q 'tag mismatch' "$OUT/corrupt.log"; then
    echo "all-to-all: FAILED: a corrupted tag did not fail the run with a tag mismatch"
    FAILED=1
  else
    echo "all-to-all: the corrupted tag was caught, as it must be"
  fi
  report --strict --expect-vmm ok
  exit "$FAILED"
fi

# ---- the full matrix ----------------------------------------------------------------------------
GPUS=$(env "${CLEAN_ENV[@]}" "$BIN" --count-gpus 2>"$OUT/count-gpus.log")
if ! [[ $GPUS =~ ^[0-9]+$ ]] || ((GPUS < 1)); then
  echo "all-to-all: no GPU: $(cat "$OUT/count-gpus.log")"
  exit 1
fi
((GPUS > MAX_GPUS)) && GPUS=$MAX_GPUS
echo "all-to-all: $GPUS GPU(s) used, $REPS reps, budget ${BUDGET}s"
RUNS=("2 1" "8 2" "4 1" "8 1" "2 2" "4 2")
for run in "${RUNS[@]}"; do
  read -r n g <<<"$run"
  ((g > GPUS)) && continue
  name=all-to-all-n$n-g$g
  left=$((DEADLINE - $(date +%s) - 15))  # 15 s for the report
  if ((left < 20)); then
    echo "all-to-all: $name not run: the time budget (${BUDGET}s) is spent"
    continue
  fi
  # The launcher starts no repetition past its --budget-s; the timeout is a backstop for one that
  # starts just before and runs long. --timeout-s bounds every wait for a rank: a hang fails.
  a2a "$name" "$left" "$LIB" --ranks "$n" --gpus "$g" --per-rank-buffers 1,8,64 \
    --chunk-size 2MiB,20MiB --chunks-per-buffer 1 --reps "$REPS" --timeout-s 60 \
    --budget-s $((left > 30 ? left - 20 : 10))
  case $RC in
    0) ;;
    124 | 137) echo "all-to-all: $name cut short by the time budget (its JSON keeps what finished)" ;;
    *) FAILED=1 ;;
  esac
done
report
exit "$FAILED"
