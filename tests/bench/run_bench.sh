#!/usr/bin/env bash
# run_bench.sh: the whole benchmark in one call (docs/benchmarks.md). Runs vmmipc_bench
#   1. with LD_PRELOAD=<lib>: everything                                   -> OUT/bench.json
#   2. without the preload: legacy, floors, cliff, passthrough, pieces     -> OUT/bench-nopreload.json
#   3. with the preload and VMMIPC_LOG_LEVEL=debug: a few first opens only,
#      for the library's own phase timings                                 -> OUT/bench-debug.log
# then scripts/bench-report.py -> OUT/benchmarks.md and OUT/bench.png, and prints a short summary
# (the targets). Console output of each run: OUT/bench-console.txt, OUT/bench-nopreload-console.txt.
#
# Usage: run_bench.sh --bench BIN --lib LIBVMMIPC --out DIR [--repetitions N] [--scale X]
#                     [--budget-s S] [--python PY] [--smoke] [-- extra vmmipc_bench flags]
#   --smoke  tiny counts for the simulated driver (ctest sim.bench_smoke); the report is --strict.
# The driver is whatever libcuda.so.1 the loader finds (LD_LIBRARY_PATH=<build>/sim: simulator).
# Exit: 0 when every run and the report succeeded (a missed target is a result, not a failure).
set -u

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPORT="$HERE/../../scripts/bench-report.py"
BENCH="" LIB="" OUT="" REPS=5 SCALE=1 BUDGET=200 PYTHON=python3 SMOKE=0 EXTRA=()
while (($#)); do
  case $1 in
    --bench) BENCH=$2; shift 2 ;;
    --lib) LIB=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --repetitions) REPS=$2; shift 2 ;;
    --scale) SCALE=$2; shift 2 ;;
    --budget-s) BUDGET=$2; shift 2 ;;
    --python) PYTHON=$2; shift 2 ;;
    --smoke) SMOKE=1; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "run_bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [[ -z $BENCH || -z $LIB || -z $OUT ]]; then
  echo "usage: run_bench.sh --bench BIN --lib LIBVMMIPC --out DIR [options]" >&2
  exit 2
fi
if [[ ! -x $BENCH ]]; then echo "run_bench.sh: $BENCH is not built" >&2; exit 1; fi
if [[ ! -f $LIB ]]; then echo "run_bench.sh: $LIB is not built" >&2; exit 1; fi
mkdir -p "$OUT" || exit 1

# Timed runs: 1 GiB copies and the load samples are what cost time on a GPU.
COMMON=(--benchmark_repetitions="$REPS" --benchmark_display_aggregates_only=true
        --iters_scale="$SCALE")
FILTER_ALL=()
FILTER_NOPRELOAD='^(get/legacy|open/legacy|reopen/legacy|floor|floor_fresh|cliff|passthrough|piece)/'
DEBUG_SCALE=0.1
REPORT_FLAGS=()
if ((SMOKE)); then
  REPS=2 BUDGET=55 SCALE=0.02 DEBUG_SCALE=0.02
  COMMON=(--benchmark_repetitions=2 --benchmark_display_aggregates_only=true --iters_scale=0.02
          --load_samples=3 --load_budget_s=1 --timeout_s=20)
  # The simulator copies host memory: leave out the 1 GiB copies (2 MiB ones still run).
  FILTER_ALL=(--benchmark_filter='-^bandwidth/.*/1GiB')
  REPORT_FLAGS=(--strict)
fi

START=$(date +%s)
DEADLINE=$((START + BUDGET))
FAILED=0
# limit CAP: seconds for the next run: CAP, cut to what is left (keeping 20 s for the report).
limit() {
  local left=$((DEADLINE - $(date +%s) - 20))
  ((left < $1)) && echo "$left" || echo "$1"
}

# run NAME CAP OUTFILE ENV... -- ARGS...: the benchmark under timeout, output to OUTFILE.
run() {
  local name=$1 cap=$2 out=$3 lim t0 rc
  shift 3
  local envs=()
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  lim=$(limit "$cap")
  if ((lim < 5)); then
    echo "bench: $name not run: the time budget (${BUDGET}s) is spent"
    FAILED=1
    return
  fi
  t0=$(date +%s)
  timeout -k 5 "$lim" env -u VMMIPC_RANK -u LOCAL_RANK -u RANK "${envs[@]}" "$BENCH" "$@" \
    "${EXTRA[@]}" >"$out" 2>&1 </dev/null
  rc=$?
  echo "bench: $name: exit $rc in $(($(date +%s) - t0))s (limit ${lim}s; output $out)"
  if ((rc != 0)); then
    FAILED=1
    grep -E 'vmmipc_bench|error|ERROR' "$out" | head -n 8 | sed 's/^/  | /'
  fi
}

run "preload run" $((BUDGET * 65 / 100)) "$OUT/bench-console.txt" \
  LD_PRELOAD="$LIB" VMMIPC_LOG_LEVEL=warn -- \
  --benchmark_out="$OUT/bench.json" --benchmark_out_format=json "${COMMON[@]}" "${FILTER_ALL[@]}"
run "no-preload run" $((BUDGET * 20 / 100)) "$OUT/bench-nopreload-console.txt" \
  LD_PRELOAD= VMMIPC_LOG_LEVEL=warn -- \
  --benchmark_out="$OUT/bench-nopreload.json" --benchmark_out_format=json "${COMMON[@]}" \
  --benchmark_filter="$FILTER_NOPRELOAD"
run "debug run" $((BUDGET * 10 / 100 + 5)) "$OUT/bench-debug.log" \
  LD_PRELOAD="$LIB" VMMIPC_LOG_LEVEL=debug -- \
  --benchmark_out="$OUT/bench-debug.json" --benchmark_out_format=json \
  --benchmark_repetitions=1 --iters_scale="$DEBUG_SCALE" --phase_markers \
  --benchmark_filter='^open(_fresh)?/vmmipc/'

if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "bench: $PYTHON not found: no report (the JSON files are in $OUT)"
  exit 1
fi
timeout -k 5 60 "$PYTHON" "$REPORT" "$OUT/bench.json" --nopreload "$OUT/bench-nopreload.json" \
  --debug-log "$OUT/bench-debug.log" --markdown "$OUT/benchmarks.md" --plot "$OUT/bench.png" \
  --summary "${REPORT_FLAGS[@]}"
rc=$?
echo "bench: report exit $rc: $OUT/benchmarks.md$([[ -f $OUT/bench.png ]] && echo ", $OUT/bench.png"); total $(($(date +%s) - START))s"
((rc != 0)) && FAILED=1
exit "$FAILED"
