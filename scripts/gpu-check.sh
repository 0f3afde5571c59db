#!/usr/bin/env bash
# gpu-check.sh: the one command for the GPU machine. From the repository root:
#   bash scripts/gpu-check.sh [OUTDIR]    (OUTDIR: default $OUT if set, else build-gpu/report)
# Steps: environment, configure + build (build-gpu, Release), ctest -L gpu (the cudart client and
# its baseline), the PyTorch/cuda.bindings/CuPy check with its baseline, spawn workers without a
# rank variable (tests/python/spawn_slot_check.py), importers following an exporter's memory-saver
# pause and resume with VMMIPC_FOLLOW=1 (tests/python/memory_saver_check.py: raw cuda.bindings VMM
# memory, and torch_memory_saver from its wheel in .whl/ unless installed), benchmarks if built,
# the driver's own import floor under concurrency beside legacy IPC (tests/bench/concurrent_import_floor.py),
# the all-to-all registration benchmark (skipped, not failed, when less than 60 s of budget is left).
# Every step runs whatever happened before it, under `timeout`, inside one time budget
# (GPU_CHECK_BUDGET_S, default 510 s). Each log is teed into OUTDIR; the end prints a
# markdown table (also OUTDIR/summary.md). Exit: 0 when no step failed, 1 otherwise.
# Knobs: GPU_CHECK_BUILD_DIR (build-gpu), GPU_CHECK_ALLOW_NO_GPU=1 (no GPU is a skip,
# for trying the script on a CPU machine), GPU_CHECK_BENCH_REPETITIONS (5), GPU_CHECK_BENCH_SCALE (1),
# GPU_CHECK_ALL_TO_ALL_BUDGET_S (180), GPU_CHECK_ALL_TO_ALL_REPS (3), MEMORY_SAVER_WHEEL (the
# torch_memory_saver wheel for the saver step; default .whl/torch_memory_saver-*.whl), GPU_CHECK_SKIP
# (comma list of steps not to run: ctest, python, spawn, saver, bench, floor, all_to_all; e.g.
# GPU_CHECK_SKIP=ctest,python,bench to give the all-to-all step the budget).
set -u

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO_ROOT" || exit 1

BUILD_DIR=${GPU_CHECK_BUILD_DIR:-build-gpu}
OUTDIR=${1:-${OUT:-$BUILD_DIR/report}}
mkdir -p "$OUTDIR" || exit 1
OUTDIR=$(cd "$OUTDIR" && pwd)
BUDGET_S=${GPU_CHECK_BUDGET_S:-510}
START_S=$(date +%s)
DEADLINE_S=$((START_S + BUDGET_S))
LIB="$REPO_ROOT/$BUILD_DIR/csrc/libvmmipc.so"

# shellcheck source=scripts/check-steps.sh
source "$REPO_ROOT/scripts/check-steps.sh"
GPU_LINE="no GPU"
COMMIT=$(described_commit)
: >"$OUTDIR/summary.partial.md"

# --- helpers ---------------------------------------------------------------------------------


# --- steps -----------------------------------------------------------------------------------

step_env() {
  banner "environment"
  local log="$OUTDIR/env.log" t0
  t0=$(now)
  : >"$log"
  {
    echo "date -u: $(date -u)"
    echo "host: $(uname -a)"
    echo "repo: $REPO_ROOT, commit $COMMIT, $(git status --short 2>/dev/null | wc -l) changed files"
    echo "outdir: $OUTDIR, budget ${BUDGET_S}s"
  } | tee -a "$log"
  if command -v nvidia-smi >/dev/null 2>&1; then
    run_logged "$log" "$(step_limit 30)" nvidia-smi -L
    run_logged "$log" "$(step_limit 30)" nvidia-smi \
      --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
    # Only a real "name, driver" CSV row counts ("No devices were found" has no comma).
    GPU_LINE=$(timeout 20 nvidia-smi --query-gpu=name,driver_version --format=csv,noheader \
      2>/dev/null | grep ',' | head -n 1)
  else
    echo "nvidia-smi: not found" | tee -a "$log"
  fi
  local tool
  for tool in nvcc cmake ninja g++; do
    if ! command -v "$tool" >/dev/null 2>&1; then
      echo "$tool: not found" | tee -a "$log"
    elif [[ $tool == nvcc ]]; then
      echo "nvcc: $(nvcc --version 2>&1 | grep -m1 release)" | tee -a "$log"
    else
      echo "$tool: $("$tool" --version 2>&1 | head -n 1)" | tee -a "$log"
    fi
  done
  run_logged "$log" "$(step_limit 90)" python3 -c '
import importlib, sys
print("python", sys.version.split()[0])
for name in ("torch", "cuda.bindings", "cupy", "numpy"):
    try:
        mod = importlib.import_module(name)
        version = getattr(mod, "__version__", "?")
        if name == "torch":
            version += " (CUDA %s, available: %s)" % (mod.version.cuda, mod.cuda.is_available())
        print(name, version)
    except Exception as exc:
        print(name, "missing (%s: %s)" % (type(exc).__name__, exc))
'
  echo "libcuda: $(ldconfig -p 2>/dev/null | grep -m1 'libcuda.so.1' | sed 's/^[[:space:]]*//')" \
    | tee -a "$log"
  local versions
  versions=$(grep -E '^(torch|cupy|cuda.bindings) ' "$log" | cut -d' ' -f1-2 | tr '\n' ' ')
  if [[ -n $GPU_LINE ]] && [[ $GPU_LINE != "no GPU" ]]; then
    record "environment" PASS "$GPU_LINE; $versions" $(($(now) - t0))
  elif [[ ${GPU_CHECK_ALLOW_NO_GPU:-0} == 1 ]]; then
    GPU_LINE="no GPU"
    record "environment" SKIP "no GPU visible (GPU_CHECK_ALLOW_NO_GPU=1); $versions" \
      $(($(now) - t0))
  else
    GPU_LINE="no GPU"
    record "environment" FAIL "no GPU visible to nvidia-smi: nothing below is verified; $versions" \
      $(($(now) - t0))
  fi
}

CONFIGURED=0
step_configure() {
  banner "configure"
  local log="$OUTDIR/configure.log" t0 rc
  t0=$(now)
  : >"$log"
  local generator=()
  if [[ ! -f $BUILD_DIR/CMakeCache.txt ]]; then  # an existing tree keeps its generator
    if command -v ninja >/dev/null 2>&1; then
      generator=(-G Ninja)
    else
      generator=(-G "Unix Makefiles")
    fi
  fi
  run_logged "$log" "$(step_limit 120)" \
    cmake -S . -B "$BUILD_DIR" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release
  rc=$?
  [[ $rc == 0 ]] && CONFIGURED=1
  record "configure" "$(status_result $rc)" "cmake -B $BUILD_DIR Release (exit $rc)" \
    $(($(now) - t0))
}

step_build() {
  banner "build"
  local log="$OUTDIR/build.log" t0 rc keep_going=()
  t0=$(now)
  : >"$log"
  if [[ $CONFIGURED != 1 ]]; then
    record "build" SKIP "not configured" 0
    return
  fi
  # Keep going past a broken target so that the library and the GPU clients still get built.
  case $(grep -m1 '^CMAKE_GENERATOR:' "$BUILD_DIR/CMakeCache.txt" | cut -d= -f2) in
    Ninja*) keep_going=(-- -k 0) ;;
    *Makefiles*) keep_going=(-- -k) ;;
  esac
  run_logged "$log" "$(step_limit 300)" \
    cmake --build "$BUILD_DIR" -j "$(nproc)" "${keep_going[@]}"
  rc=$?
  local built
  built="libvmmipc.so: $([[ -f $LIB ]] && echo built || echo MISSING)"
  built+=", cudart_ipc_client: "
  built+=$([[ -x $BUILD_DIR/tests/gpu/cudart_ipc_client ]] && echo built || echo MISSING)
  record "build" "$(status_result $rc)" "exit $rc; $built" $(($(now) - t0))
}

step_ctest() {
  banner "ctest -L gpu"
  local log="$OUTDIR/ctest-gpu.log" t0 rc
  t0=$(now)
  : >"$log"
  if [[ ! -f $BUILD_DIR/CTestTestfile.cmake ]]; then
    record "ctest -L gpu" SKIP "no build tree" 0
    return
  fi
  # The Python check (label python) runs in its own step, with its baseline.
  run_logged "$log" "$(step_limit 240)" env VMMIPC_LOG_LEVEL=info \
    ctest --test-dir "$BUILD_DIR" -L gpu -LE python --output-on-failure --timeout 150 \
    --no-tests=error --output-junit "$OUTDIR/ctest-gpu.xml"
  rc=$?
  # Passing tests print nothing above: keep ctest's full log, and show the clients' CHECK lines.
  local last="$OUTDIR/ctest-gpu-LastTest.log"
  if cp -f "$BUILD_DIR/Testing/Temporary/LastTest.log" "$last" 2>/dev/null; then
    echo "-- CHECK lines of the GPU clients (full output: $last) --" | tee -a "$log"
    grep -E '^(CHECK|RESULT|SKIP)' "$last" | head -n 120 | tee -a "$log"
  fi
  # Per-test lines: "1/3 Test #1: name ....   Passed 0.1 sec", "***Skipped", "***Failed", ...
  local passed skipped failed names
  passed=$(grep -cE ' Test +#[0-9]+: .* Passed ' "$log")
  skipped=$(grep -cE ' Test +#[0-9]+: .*\*\*\*Skipped' "$log")
  failed=$(grep -E ' Test +#[0-9]+: ' "$log" | grep -vE ' Passed |\*\*\*Skipped' -c)
  names=$(grep -E ' Test +#[0-9]+: ' "$log" | grep -vE ' Passed ' \
    | sed -E 's/.*Test +#[0-9]+: ([^ ]+) [ .]*(\*\*\*)?([A-Za-z][A-Za-z :]*[A-Za-z]).*/\1=\3/' \
    | head -n 6 | tr '\n' ' ')
  names=${names% }
  local result
  result=$(status_result $rc)
  if [[ $result == PASS ]] && ((failed > 0)); then result=FAIL; fi
  if [[ $result == PASS ]] && ((passed == 0)); then result=SKIP; fi
  record "ctest -L gpu" "$result" \
    "$passed passed, $failed failed, $skipped skipped${names:+: $names}; exit $rc" $(($(now) - t0))
}

# library_built ROW LOG: empties LOG; false, with a FAIL row, when libvmmipc.so was not built.
library_built() {
  : >"$2"
  [[ -f $LIB ]] && return 0
  record "$1" FAIL "not run: $LIB was not built" 0
  return 1
}

# record_harness NAME LOG RC T0 SUMMARY_NAME: the row of a Python harness that prints
# "CHECK <name> PASS|FAIL|SKIP" lines and "SUMMARY <SUMMARY_NAME>: P PASS, F FAIL, S SKIP": its
# counts (counted from the CHECK lines when it was killed before its SUMMARY), the first failed
# checks; FAIL when any CHECK failed whatever the exit status, SKIP on exit 77 or a "SKIPPED:"
# line.
record_harness() {
  local name=$1 log=$2 rc=$3 t0=$4 counts fail result failed_names
  counts=$(grep -m1 -oE "^SUMMARY $5: [0-9]+ PASS, [0-9]+ FAIL, [0-9]+ SKIP" "$log" | cut -d' ' -f3-)
  if [[ -z $counts ]]; then
    counts="$(grep -c 'CHECK [^ ]* PASS' "$log") PASS, $(grep -c 'CHECK [^ ]* FAIL' "$log") FAIL,"
    counts+=" $(grep -c 'CHECK [^ ]* SKIP' "$log") SKIP (no SUMMARY line)"
  fi
  fail=$(grep -c 'CHECK [^ ]* FAIL' "$log")
  result=$(status_result "$rc")
  if [[ $result == PASS ]] && grep -q '^SKIPPED:' "$log"; then result=SKIP; fi
  if [[ $result == PASS ]] && ((fail > 0)); then result=FAIL; fi
  if [[ $rc == 77 ]]; then result=SKIP; fi
  failed_names=$(grep -oE 'CHECK [^ ]* FAIL' "$log" | cut -d' ' -f2 | head -n 5 | tr '\n' ' ')
  failed_names=${failed_names% }
  record "$name" "$result" \
    "$counts${failed_names:+; failed: $failed_names}; exit $rc" $(($(now) - t0))
}

step_python() {
  banner "python: torch / cuda.bindings / CuPy (+ baseline)"
  local log="$OUTDIR/python-check.log" t0 limit py_deadline
  t0=$(now)
  library_built "python check" "$log" || return
  limit=$(step_limit 360)
  py_deadline=$((limit > 40 ? limit - 20 : 20))  # the script winds down before timeout hits
  run_logged "$log" "$limit" env LD_PRELOAD="$LIB" VMMIPC_LOG_LEVEL=info \
    GPU_CHECK_BASELINE=1 python3 tests/python/torch_ipc_check.py --deadline-s "$py_deadline"
  record_harness "python check" "$log" $? "$t0" torch_ipc_check
}

# Workers without a rank variable (tests/python/spawn_slot_check.py): torch.multiprocessing
# spawn workers on one and two GPUs, with and without CUDA_VISIBLE_DEVICES, two fresh runs
# each; slots from the GPU, peer pointers and graph-baked pointers identical across runs.
step_spawn() {
  banner "spawn workers without a rank variable: slots from the GPU"
  local log="$OUTDIR/spawn-check.log" t0
  t0=$(now)
  library_built "spawn check" "$log" || return
  { echo "-- the host's GPU list (/proc/driver/nvidia/gpus) --"
    ls /proc/driver/nvidia/gpus 2>&1
    echo "-- vmmipc-run --check, no rank variable --"
    env -u LOCAL_RANK -u RANK -u VMMIPC_RANK scripts/vmmipc-run --lib "$LIB" --check 2>&1 \
      | grep -E '^\[.*\] (rank|GPU)|^VERDICT'
  } | tee -a "$log"
  run_logged "$log" "$(step_limit 300)" env -u LOCAL_RANK -u RANK -u VMMIPC_RANK \
    LD_PRELOAD="$LIB" VMMIPC_LOG_LEVEL=info python3 tests/python/spawn_slot_check.py
  record_harness "spawn check" "$log" $? "$t0" spawn_slot_check
}

# Importers follow an exporter's memory-saver pause and resume (tests/python/memory_saver_check.py,
# VMMIPC_FOLLOW=1): an exporter pauses VMM memory an importer has open (cuMemUnmap + cuMemRelease,
# raw cuda.bindings in 2 MiB and 32 MiB chunks, then torch_memory_saver.pause()), the free memory
# must go up; after resume the importer reads the new bytes at the same pointer, directly and
# through a CUDA graph captured before the pause. Each also once without VMMIPC_FOLLOW (INFO lines).
# torch_memory_saver comes from MEMORY_SAVER_WHEEL or .whl/ when it is not installed (a SKIP row
# for that part when neither is there).
step_saver() {
  banner "memory saver: importers follow an exporter's pause and resume"
  local log="$OUTDIR/saver-check.log" t0
  t0=$(now)
  library_built "saver check" "$log" || return
  run_logged "$log" "$(step_limit 240)" env LD_PRELOAD="$LIB" VMMIPC_LOG_LEVEL=info \
    VMMIPC_FOLLOW=1 python3 tests/python/memory_saver_check.py
  record_harness "saver check" "$log" $? "$t0" memory_saver_check
}

# ---- BENCHMARKS ------------------------------------------------------------------------------
# tests/bench/run_bench.sh runs vmmipc_bench with the preload (OUTDIR/bench.json), without it
# (OUTDIR/bench-nopreload.json) and briefly with VMMIPC_LOG_LEVEL=debug for the library's phase
# timings (OUTDIR/bench-debug.log), then scripts/bench-report.py writes OUTDIR/benchmarks.md and
# OUTDIR/bench.png (docs/benchmarks.md). The benchmark's own console output stays in
# OUTDIR/bench-console.txt and OUTDIR/bench-nopreload-console.txt; the terminal gets the targets.
# A missed target is a result, not a failure: FAIL means a run or the report failed.
# Knobs: GPU_CHECK_BENCH_REPETITIONS (5; 3 when less than 120 s are left), GPU_CHECK_BENCH_SCALE (1:
# iteration counts multiplier).
step_bench() {
  banner "benchmarks"
  local log="$OUTDIR/bench.log" t0 rc limit reps bench="$BUILD_DIR/tests/bench/vmmipc_bench"
  t0=$(now)
  : >"$log"
  if [[ ! -x $bench ]]; then
    record "benchmarks" FAIL "$bench not built (Google Benchmark missing? see configure.log)" 0
    return
  fi
  if [[ ! -f $LIB ]]; then
    record "benchmarks" FAIL "not run: $LIB was not built" 0
    return
  fi
  limit=$(step_limit 200)
  reps=${GPU_CHECK_BENCH_REPETITIONS:-5}
  if ((limit < 120 && reps > 3)); then reps=3; fi
  rm -f "$OUTDIR"/bench.json "$OUTDIR"/bench-nopreload.json "$OUTDIR"/benchmarks.md \
    "$OUTDIR"/bench.png
  run_logged "$log" "$limit" bash tests/bench/run_bench.sh --bench "$bench" --lib "$LIB" \
    --out "$OUTDIR" --budget-s $((limit > 30 ? limit - 10 : limit)) --repetitions "$reps" \
    --scale "${GPU_CHECK_BENCH_SCALE:-1}"
  rc=$?
  local medians targets
  medians=$(python3 -c 'import json, sys
runs = json.load(open(sys.argv[1])).get("benchmarks", [])
print(sum(1 for r in runs if r.get("aggregate_name") == "median"))' "$OUTDIR/bench.json" \
    2>/dev/null)
  targets=$(grep -m1 -oE '^[0-9]+ met, [0-9]+ missed, [0-9]+ not measured' \
    "$OUTDIR/benchmarks.md" 2>/dev/null)
  record "benchmarks" "$(status_result $rc)" \
    "${medians:-0} medians, $reps repetitions; targets: ${targets:-no report}; benchmarks.md$(
      [[ -f $OUTDIR/bench.png ]] && echo ", bench.png") (exit $rc)" $(($(now) - t0))
}

# ---- ALL-TO-ALL REGISTRATION -----------------------------------------------------------------
# tests/bench/run_all_to_all.sh runs vmmipc_all_to_all (docs/benchmarks.md): N ranks in {2, 4, 8}
# on one GPU and, when there are two, on two; per-rank buffers K in {1, 8, 64} x chunk 2 MiB and
# 20 MiB; vmmipc against legacy IPC in the same run; 3 repetitions. Output in OUTDIR/all-to-all/:
# all-to-all-nN-gG.{txt,log,json} per launcher run and all-to-all.md with the targets. FAIL only
# when a run crashed or saw wrong data (a tag read through an opened pointer was not the
# exporter's); a missed target, or a run left out for the time budget, is a result.
# Knobs: GPU_CHECK_ALL_TO_ALL_BUDGET_S (180: the matrix is sized for it), GPU_CHECK_ALL_TO_ALL_REPS.
step_all_to_all() {
  banner "all-to-all registration"
  local log="$OUTDIR/all-to-all.log" t0 rc limit want bin="$BUILD_DIR/tests/bench/vmmipc_all_to_all"
  t0=$(now)
  : >"$log"
  if [[ ! -x $bin ]]; then
    record "all-to-all" FAIL "$bin not built (see build.log)" 0
    return
  fi
  if [[ ! -f $LIB ]]; then
    record "all-to-all" FAIL "not run: $LIB was not built" 0
    return
  fi
  want=${GPU_CHECK_ALL_TO_ALL_BUDGET_S:-180}
  limit=$(step_limit $((want + 20)))
  if ((limit < 60)); then
    # Earlier steps spent the budget: too little left to say anything. Not a failure.
    record "all-to-all" SKIP \
      "only ${limit}s of budget left; run it alone with GPU_CHECK_SKIP=ctest,python,bench" 0
    return
  fi
  rm -rf "$OUTDIR/all-to-all"
  run_logged "$log" "$limit" bash tests/bench/run_all_to_all.sh --bin "$bin" --lib "$LIB" \
    --out "$OUTDIR/all-to-all" --budget-s $((limit - 15)) --reps "${GPU_CHECK_ALL_TO_ALL_REPS:-3}"
  rc=$?
  local targets runs
  targets=$(grep -m1 -oE '^[0-9]+ met, [0-9]+ missed, [0-9]+ not measured' \
    "$OUTDIR/all-to-all/all-to-all.md" 2>/dev/null)
  runs=$(find "$OUTDIR/all-to-all" -name 'all-to-all-n*-g*.json' 2>/dev/null | wc -l)
  record "all-to-all" "$(status_result "$rc")" \
    "$runs launcher runs; targets: ${targets:-no report}; all-to-all/all-to-all.md (exit $rc)" \
    $(($(now) - t0))
}

# The driver's own floor under concurrency (tests/bench/concurrent_import_floor.py, no vmmipc):
# N=2 processes on GPU 0 open 64 of each other's 2 MiB chunks with every fd in hand, beside legacy
# IPC, alone, together and while exporting (docs/benchmarks.md): what the all-to-all's N=2 ratio
# can be at best. Then tests/bench/open_sequence_probe.py: one open's driver calls in variants
# (where the mapping lies, what else is mapped near it). SKIP without cuda.bindings.
step_floor() {
  banner "the driver's import floor under concurrency"
  local log="$OUTDIR/floor.log" t0 rc ratios
  t0=$(now)
  : >"$log"
  if ! python3 -c 'import cuda.bindings' >/dev/null 2>&1; then
    record "driver floor" SKIP "no cuda.bindings" 0
    return
  fi
  run_logged "$log" "$(step_limit 90)" env LD_PRELOAD= python3 tests/bench/concurrent_import_floor.py \
    --ranks 2 --gpus 1 --per-rank 64 --reps 3
  rc=$?
  ratios=$(grep -E '^RATIO ' "$log" | sed -E 's/^RATIO ([a-z]+): .* = /\1 /' | tr '\n' ',' | sed 's/,$//; s/,/, /g')
  record "driver floor" "$(status_result $rc)" \
    "vmm floor / legacy open p50, N=2 one GPU: ${ratios:-no RATIO lines}; floor.log (exit $rc)" \
    $(($(now) - t0))
  # What the import zone's page-table anchors save (tests/bench/open_sequence_probe.py).
  t0=$(now)
  log="$OUTDIR/open-sequence.log"
  run_logged "$log" "$(step_limit 60)" env LD_PRELOAD= python3 tests/bench/open_sequence_probe.py \
    --iters 120
  rc=$?
  record "open sequence" "$(status_result $rc)" \
    "$(grep -E '^SET_ACCESS ' "$log" | sed 's/^SET_ACCESS //' || echo 'no SET_ACCESS line'); open-sequence.log (exit $rc)" \
    $(($(now) - t0))
}

print_summary() {
  local total=$(($(now) - START_S)) overall=PASS
  ((ANY_FAILED)) && overall=FAIL
  {
    echo
    echo "## vmmipc GPU check: $overall"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $GPU_LINE, commit $COMMIT, ${total}s; logs in $OUTDIR"
    echo
    echo "| step | result | detail | time |"
    echo "| --- | --- | --- | --- |"
    local row
    for row in "${ROWS[@]}"; do echo "$row"; done
  } | tee "$OUTDIR/summary.md"
}

# shellcheck disable=SC2317  # invoked by the trap below
on_signal() {
  record "interrupted" FAIL "signal received" 0
  print_summary
  exit 1
}
trap on_signal INT TERM

# --- main ------------------------------------------------------------------------------------

# skipped NAME: true (and a SKIP row) when GPU_CHECK_SKIP names the step NAME.
skipped() {
  [[ ,${GPU_CHECK_SKIP:-}, == *,$1,* ]] || return 1
  record "$1" SKIP "GPU_CHECK_SKIP" 0
}

step_env
step_configure
step_build
skipped ctest || step_ctest
skipped python || step_python
skipped spawn || step_spawn
skipped saver || step_saver
skipped bench || step_bench
skipped floor || step_floor
skipped all_to_all || step_all_to_all
print_summary
exit "$ANY_FAILED"
