#!/usr/bin/env bash
# run_export_off_path.sh: the background export (VMMIPC_BACKGROUND_EXPORT, issue 46) on one GPU,
# off and on alternated in one call, everything from what `cmake --build build` gives:
#   1. all-to-all registration (vmmipc_all_to_all --floor --no-warmup), N=2 and N=4 with K=64 x
#      2 MiB, N=8 with K=16 x 2 MiB, a gap between allocation and gets of 0 and 500 ms: a
#      process's first registration and a later one apart, legacy IPC and the driver's floor
#      measured in the same rank processes; rounds rotate which mode goes first;
#   2. the SGLang-style registration (sglang_registration.py: 64 x 8 MiB tensors, two ranks),
#      gaps 0 and 0.5 s, lanes legacy, vmmipc (off), background (on) and SGLang's own VMM path
#      when --sglang-src names a folder holding sglang/srt/utils/cuda_vmm_utils.py or an sglang
#      package is importable; needs PyTorch and cuda.bindings;
#   3. the allocation paths (background_export_cost.py: 8 GiB of expandable-segment growth,
#      cudaMemcpy traffic while mapped, the free, a memory saver's resume when
#      torch_memory_saver is importable; fds and threads at rest), off and on alternated.
# Then export_off_path_report.py writes OUT/report.md (medians, ratios from the same runs) and
# prints SUMMARY lines. Each part has a share of --budget-s and starts nothing past it.
#
# Usage: run_export_off_path.sh [--build DIR] [--out DIR] [--budget-s S] [--python PY]
#                               [--sglang-src DIR] [--sim]
#   --out defaults to $OUT (the device's output folder), else ./export-off-path.
#   --sim: on the simulated driver (DIR/sim), part 1 in small only: the scripts' own check.
# Exit: 0 when every run that ran saw right data; 1 otherwise (a missed target is a result).
set -u

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BUILD=$ROOT/build OUT_DIR=${OUT:-$PWD/export-off-path} BUDGET=450 PYTHON=python3 SIM=0
SGLANG_SRC=
while (($#)); do
  case $1 in
    --build) BUILD=$2; shift 2 ;;
    --out) OUT_DIR=$2; shift 2 ;;
    --budget-s) BUDGET=$2; shift 2 ;;
    --python) PYTHON=$2; shift 2 ;;
    --sglang-src) SGLANG_SRC=$(cd "$2" && pwd) || exit 2; shift 2 ;;
    --sim) SIM=1; shift ;;
    *) echo "run_export_off_path.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
LIB=$BUILD/csrc/libvmmipc.so
A2A=$BUILD/tests/bench/vmmipc_all_to_all
if [[ ! -f $LIB || ! -x $A2A ]]; then
  echo "export-off-path: building vmmipc and vmmipc_all_to_all in $BUILD"
  cmake --build "$BUILD" --target vmmipc vmmipc_all_to_all -j "$(nproc)" >/dev/null \
    || { echo "export-off-path: FAILED: the build"; exit 1; }
fi
mkdir -p "$OUT_DIR" || exit 1
rm -f "$OUT_DIR"/a2a-*.json "$OUT_DIR"/a2a-*.txt "$OUT_DIR"/a2a-*.log "$OUT_DIR"/sglang-*.json \
  "$OUT_DIR"/alloc.json "$OUT_DIR"/report.md
START=$(date +%s)
FAILED=0
CLEAN_ENV=(-u VMMIPC_RANK -u LOCAL_RANK -u RANK -u VMMIPC_STATS -u VMMIPC_WARM_CONNECTIONS
  -u VMMIPC_FOLLOW -u VMMIPC_PREFETCH -u VMMIPC_BACKGROUND_EXPORT -u VMMIPC_EXPORT_IN_GET)
if ((SIM)); then
  export LD_LIBRARY_PATH=$BUILD/sim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} SIMCUDA_DEVICE_COUNT=1
  CONFIGS=("2 2" "3 2") GAPS="0 100" REPS=2 A2A_SHARE=90
else
  CONFIGS=("2 64" "4 64" "8 16") GAPS="0 500" REPS=3 A2A_SHARE=45
  command -v nvidia-smi >/dev/null && nvidia-smi >"$OUT_DIR/device.txt" 2>&1
fi
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null) $(git -C "$ROOT" status \
    --porcelain 2>/dev/null | grep -q . && echo '(with local changes)')"
  echo "budget: ${BUDGET}s; simulated driver: $SIM"
} >"$OUT_DIR/context.txt"

left() { echo $((START + BUDGET - $(date +%s))); }

# ---- 1. all-to-all: (N, K) x gap x {off, on}, rounds until the part's share is spent ----------
A2A_END=$((START + BUDGET * A2A_SHARE / 100))
round=1
while :; do
  for cfg in "${CONFIGS[@]}"; do
    read -r n k <<<"$cfg"
    for gap in $GAPS; do
      order=(off on)
      ((round % 2 == 0)) && order=(on off)
      for mode in "${order[@]}"; do
        now=$(date +%s)
        if ((now + 25 > A2A_END)); then break 4; fi
        name=a2a-n$n-k$k-g$gap-$mode-r$round
        bg=0
        [[ $mode == on ]] && bg=1
        timeout -k 5 $((A2A_END - now)) env "${CLEAN_ENV[@]}" VMMIPC_BACKGROUND_EXPORT=$bg \
          LD_PRELOAD="$LIB" "$A2A" --ranks "$n" --gpus 1 --per-rank-buffers "$k" \
          --chunk-size 2MiB --floor --no-warmup --reps "$REPS" --gap-ms "$gap" --timeout-s 60 \
          --json "$OUT_DIR/$name.json" >"$OUT_DIR/$name.txt" 2>"$OUT_DIR/$name.log" </dev/null
        rc=$?
        echo "export-off-path: $name: exit $rc"
        ((rc != 0 && rc != 124 && rc != 137)) && FAILED=1
      done
    done
  done
  round=$((round + 1))
  ((SIM && round > 1)) && break
done

# ---- 2. SGLang-style registration (PyTorch) ----------------------------------------------------
if ((SIM)); then
  echo "export-off-path: sglang-style and allocation paths not run: simulated driver"
elif ! "$PYTHON" -c "import torch, cuda.bindings; assert torch.cuda.is_available()" 2>/dev/null; then
  echo "export-off-path: sglang-style and allocation paths not run: no PyTorch with CUDA and" \
    "cuda.bindings in $PYTHON"
else
  [[ -n $SGLANG_SRC ]] || SGLANG_SRC=$("$PYTHON" -c "import os, sglang; print(os.path.dirname(os.path.dirname(sglang.__file__)))" \
    2>/dev/null)
  lanes=(legacy,vmmipc,background legacy,background,vmmipc)
  extra=()
  if [[ -n $SGLANG_SRC && -f $SGLANG_SRC/sglang/srt/utils/cuda_vmm_utils.py ]]; then
    lanes=(legacy,vmmipc,background,sglang legacy,sglang,background,vmmipc)
    extra=(--sglang-src "$SGLANG_SRC")
  else
    echo "export-off-path: SGLang's own VMM path not run: no sglang package with cuda_vmm_utils.py"
  fi
  SG_END=$((START + BUDGET * 82 / 100))
  i=0
  for gap in 0 0.5; do
    now=$(date +%s)
    if ((now + 40 > SG_END)); then
      echo "export-off-path: sglang-style gap $gap not run: its share of the budget is spent"
      continue
    fi
    timeout -k 5 $(((SG_END - now) / (2 - i))) env "${CLEAN_ENV[@]}" "$PYTHON" \
      "$HERE/sglang_registration.py" --lib "$LIB" --lanes "${lanes[$i]}" --reps 1 --rounds 4 \
      --tensors 64 --tensor-mib 8 --gap-s "$gap" --timeout-s 90 "${extra[@]}" \
      --json "$OUT_DIR/sglang-g$gap.json" --out "$OUT_DIR/sglang-g$gap" \
      >"$OUT_DIR/sglang-g$gap.txt" 2>&1
    rc=$?
    echo "export-off-path: sglang-style gap $gap: exit $rc"
    ((rc != 0 && rc != 124 && rc != 137)) && FAILED=1
    i=$((i + 1))
  done

  # ---- 3. allocation paths ---------------------------------------------------------------------
  now=$(date +%s)
  if ((START + BUDGET - now < 30)); then
    echo "export-off-path: allocation paths not run: the budget is spent"
  else
    timeout -k 5 $((START + BUDGET - now - 5)) env "${CLEAN_ENV[@]}" "$PYTHON" \
      "$HERE/background_export_cost.py" --lib "$LIB" --gib 8 --repeats 3 --timeout-s 60 \
      --json "$OUT_DIR/alloc.json" >"$OUT_DIR/alloc.txt" 2>&1
    rc=$?
    echo "export-off-path: allocation paths: exit $rc"
    ((rc != 0 && rc != 124 && rc != 137)) && FAILED=1
  fi
fi

"$PYTHON" "$HERE/export_off_path_report.py" --out "$OUT_DIR" || FAILED=1
echo "export-off-path: total $(($(date +%s) - START))s"
exit "$FAILED"
