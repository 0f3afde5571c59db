#!/usr/bin/env bash
# framework-check.sh: real framework clients of vmmipc on one machine with two or more GPUs:
# vLLM's custom all-reduce kernels and DeepEP's intranode test. From the repository root:
#   bash scripts/framework-check.sh [--lib PATH] [--vllm-src DIR [--vllm-ext SO]] [--deepep-src DIR
#                                   [--deepep-build]] [--saver-wheel WHL] [--sglang-src DIR]
#                                   [--out DIR]
# (or the variables VMMIPC_LIB, VLLM_SRC, VLLM_EXT, DEEPEP_SRC, DEEPEP_BUILD=1, MEMORY_SAVER_WHEEL,
# SGLANG_SRC, OUT). A framework whose source
# tree is not given is skipped, and says so. --vllm-ext: an extension that an earlier run built
# from the same tree (its "vllm build" row names it), to skip the compile.
#
# vmmipc: --lib, else built here (cmake -S . -B $FRAMEWORK_CHECK_BUILD_DIR -G Ninja, Release,
# target vmmipc; default build dir: build).
# vLLM (VLLM_SRC: a vLLM source tree whose csrc/custom_all_reduce.cu has the fake_ipc_ptrs
# interface, e.g. the 0.20.2 sdist): builds csrc/custom_all_reduce.cu and .cuh, nothing else,
# as a torch extension (tests/frameworks/vllm_custom_ar.py build), then under torchrun, one rank
# per GPU (2 ranks), drives them as vLLM's custom_all_reduce.py does:
#   no-vmmipc   expandable segments, no preload: must fail as vllm#42609 (cudaIpcGetMemHandle
#               on a captured input, "custom_all_reduce.cuh:<line> 'invalid argument'")
#   vmmipc 1/2  expandable segments, vmmipc-run: eager + graph results bit-exact, latencies
#   legacy 1/2  expandable segments off, no preload (legacy IPC): results, latencies
# then: the graph buffers' pointers of vmmipc 1 and 2 (fresh runs) identical; the latency table
# (8 KiB to 8 MiB, medians) of vmmipc against legacy, target within 3% (a miss is reported,
# not failed).
# DeepEP (DEEPEP_SRC: a DeepEP 1.x source tree, for tests/test_intranode.py; deep_ep itself must
# be importable: built and installed per its README, or --deepep-build: built in place here,
# intranode only, without NVSHMEM (tests/frameworks/deepep_build.py), in the background while the
# library and the vLLM extension compile, waited for before anything is timed; v1.2.1 builds,
# later 1.x commits do not link without NVSHMEM) with torch_memory_saver (installed, or
# --saver-wheel WHL, default .whl/torch_memory_saver-*.whl, installed under the build dir): DeepEP's
# intranode test on 2 GPUs with deep_ep.Buffer built inside torch_memory_saver.region() (preload
# mode): must fail without vmmipc (cudaIpcGetMemHandle on the saver's VMM memory) and pass with
# it (vmmipc-run --deepep, so the vmmipc.deepep hook sees the real DeepEP too).
# SGLang (SGLANG_SRC: a folder holding sglang/srt/utils/cuda_vmm_utils.py, e.g. the unpacked
# 0.5.23 wheel): SGLang's own VMM path (FABRIC vote, POSIX fds over its sockets, import + map) and
# legacy IPC on the same expandable-segment tensors, in one process (tests/frameworks/
# sglang_vmm_path.py), without vmmipc (SGLang's path works, legacy IPC is refused) and with it
# (both work: they coexist), with the two paths' registration times.
#
# Every step runs under `timeout` inside one budget (FRAMEWORK_CHECK_BUDGET_S, default 900).
# Logs, JSON and summary.md go to the output folder (default $OUT, else
# $FRAMEWORK_CHECK_BUILD_DIR/framework-report). Exit: 0 when no step failed, 1 when one did,
# 2 when nothing could run (fewer than 2 GPUs, or no source tree given).
set -u

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO_ROOT" || exit 1

LIB=${VMMIPC_LIB:-}
VLLM_SRC=${VLLM_SRC:-}
VLLM_EXT=${VLLM_EXT:-}
DEEPEP_SRC=${DEEPEP_SRC:-}
SGLANG_SRC=${SGLANG_SRC:-}
DEEPEP_BUILD=${DEEPEP_BUILD:-0}
SAVER_WHEEL=${MEMORY_SAVER_WHEEL:-}
OUTDIR=${OUT:-}
while (($#)); do
  case $1 in
    --lib) LIB=$2; shift 2 ;;
    --vllm-src) VLLM_SRC=$2; shift 2 ;;
    --vllm-ext) VLLM_EXT=$2; shift 2 ;;
    --deepep-src) DEEPEP_SRC=$2; shift 2 ;;
    --deepep-build) DEEPEP_BUILD=1; shift ;;
    --saver-wheel) SAVER_WHEEL=$2; shift 2 ;;
    --sglang-src) SGLANG_SRC=$2; shift 2 ;;
    --out) OUTDIR=$2; shift 2 ;;
    -h | --help) sed -n '2,45p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "framework-check.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
done

BUILD_DIR=${FRAMEWORK_CHECK_BUILD_DIR:-build}
OUTDIR=${OUTDIR:-$BUILD_DIR/framework-report}
mkdir -p "$OUTDIR" || exit 1
OUTDIR=$(cd "$OUTDIR" && pwd)
PYTHON=${PYTHON:-python3}
BUDGET_S=${FRAMEWORK_CHECK_BUDGET_S:-900}
START_S=$(date +%s)
DEADLINE_S=$((START_S + BUDGET_S))
CHECK_KEEP_S=20     # for the summary
CHECK_MIN_STEP_S=10
# shellcheck source=scripts/check-steps.sh
source "$REPO_ROOT/scripts/check-steps.sh"
HARNESS="$REPO_ROOT/tests/frameworks"
TORCHRUN=("$PYTHON" -m torch.distributed.run --standalone --nproc-per-node 2)
# The checks need no NVLink multicast (NVLS); keep NCCL (DeepEP's process group) off it.
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
export PYTHONUNBUFFERED=1

ANY_RAN=0
GPU_LINE="no GPU"
: >"$OUTDIR/summary.partial.md"

# --- environment and library -----------------------------------------------------------------

GPUS=0
step_env() {
  banner "environment"
  local log="$OUTDIR/env.log" t0
  t0=$(now)
  : >"$log"
  {
    echo "date -u: $(date -u)"
    echo "host: $(uname -a)"
    echo "repo: $REPO_ROOT, commit $(described_commit)"
    echo "vllm source: ${VLLM_SRC:-not given}; deepep source: ${DEEPEP_SRC:-not given}"
  } | tee -a "$log"
  if command -v nvidia-smi >/dev/null 2>&1; then
    run_logged "$log" "$(step_limit 30)" nvidia-smi \
      --query-gpu=index,name,driver_version,memory.total --format=csv
    run_logged "$log" "$(step_limit 30)" nvidia-smi topo -m
    GPUS=$(timeout 20 nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | grep -c .)
    GPU_LINE=$(timeout 20 nvidia-smi --query-gpu=name,driver_version --format=csv,noheader \
      2>/dev/null | grep ',' | head -n 1)
  fi
  run_logged "$log" "$(step_limit 60)" "$PYTHON" -c '
import importlib
for name in ("torch", "torch_memory_saver", "deep_ep", "vllm"):
    try:
        module = importlib.import_module(name)
        extra = ""
        if name == "torch":
            extra = " (CUDA %s, %d GPUs)" % (module.version.cuda, module.cuda.device_count())
        print(name, getattr(module, "__version__", "?") + extra, getattr(module, "__file__", ""))
    except Exception as error:
        print(name, "not importable (%s: %s)" % (type(error).__name__, error))
'
  if ((GPUS >= 2)); then
    record environment PASS "$GPUS GPUs: ${GPU_LINE:-?}" $(($(now) - t0))
  else
    record environment SKIP "$GPUS GPUs visible: these checks need 2; nothing below runs" \
      $(($(now) - t0))
  fi
}

step_library() {
  banner "libvmmipc.so"
  local log="$OUTDIR/library.log" t0 rc generator=()
  t0=$(now)
  : >"$log"
  if [[ -n $LIB ]]; then
    if [[ -f $LIB ]]; then
      LIB=$(cd "$(dirname "$LIB")" && pwd)/$(basename "$LIB")
      record library PASS "given: $LIB" 0
    else
      record library FAIL "--lib $LIB: no such file" 0
      LIB=""
    fi
    return
  fi
  [[ -f $BUILD_DIR/CMakeCache.txt ]] || generator=(-G Ninja)
  run_logged "$log" "$(step_limit 180)" \
    cmake -S . -B "$BUILD_DIR" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release
  rc=$?
  if ((rc == 0)); then
    run_logged "$log" "$(step_limit 400)" cmake --build "$BUILD_DIR" --target vmmipc
    rc=$?
  fi
  LIB="$REPO_ROOT/$BUILD_DIR/csrc/libvmmipc.so"
  if ((rc == 0)) && [[ -f $LIB ]]; then
    record library PASS "built: $LIB" $(($(now) - t0))
  else
    record library "$(status_result $rc)" "cmake configure/build failed (exit $rc; library.log)" \
      $(($(now) - t0))
    LIB=""
  fi
}

# torch_memory_saver from a wheel when it is not installed: into the build dir, on PYTHONPATH.
step_saver_wheel() {
  "$PYTHON" -c 'import torch_memory_saver' >/dev/null 2>&1 && return
  local wheel=$SAVER_WHEEL target="$REPO_ROOT/$BUILD_DIR/frameworks/site" log="$OUTDIR/saver-wheel.log"
  if [[ -z $wheel ]]; then
    wheel=$(find "$REPO_ROOT/.whl" -maxdepth 1 -name 'torch_memory_saver-*.whl' 2>/dev/null | head -n 1)
  fi
  [[ -n $wheel ]] || return  # step_deepep says what is missing
  : >"$log"
  run_logged "$log" "$(step_limit 120)" "$PYTHON" -m pip install --no-deps --no-index \
    --disable-pip-version-check --quiet --upgrade --target "$target" "$wheel"
  local rc=$?
  if ((rc == 0)); then
    export PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}"
    record "saver wheel" PASS "$(basename "$wheel") into $target" 0
  else
    record "saver wheel" FAIL "pip install --target of $wheel: exit $rc (saver-wheel.log)" 0
  fi
}

# --deepep-build: DeepEP's in-place build runs in the background from here (CPU only), while the
# library and the vLLM extension compile; deepep_build_wait collects it before anything is timed.
DEEPEP_BUILD_PID=""
DEEPEP_BUILD_T0=0
step_deepep_build_start() {
  ((DEEPEP_BUILD)) && [[ -n $DEEPEP_SRC ]] && ((GPUS >= 2)) || return
  local log="$OUTDIR/deepep-build.log"
  : >"$log"
  DEEPEP_BUILD_T0=$(now)
  echo "+ (background) deepep_build.py --deepep-src $DEEPEP_SRC" | tee -a "$log"
  run_logged "$log" "$(step_limit 480)" "$PYTHON" "$HARNESS/deepep_build.py" \
    --deepep-src "$DEEPEP_SRC" >/dev/null &
  DEEPEP_BUILD_PID=$!
}

deepep_build_wait() {
  [[ -n $DEEPEP_BUILD_PID ]] || return
  local rc built
  wait "$DEEPEP_BUILD_PID"
  rc=$?
  DEEPEP_BUILD_PID=""
  built=$(grep -m1 '^BUILT ' "$OUTDIR/deepep-build.log" | cut -d' ' -f2-)
  if ((rc == 0)) && [[ -n $built ]]; then
    export PYTHONPATH="$built${PYTHONPATH:+:$PYTHONPATH}"
    record "deepep build" PASS "intranode only, no NVSHMEM, in place: $built" $(($(now) - DEEPEP_BUILD_T0))
  else
    record "deepep build" "$(status_result $rc)" \
      "$(grep -m1 '^ERROR' "$OUTDIR/deepep-build.log" | cut -c1-160) (exit $rc; deepep-build.log)" \
      $(($(now) - DEEPEP_BUILD_T0))
  fi
}

# no_vmmipc_preload: LD_PRELOAD without any libvmmipc.so (for the runs without vmmipc).
no_vmmipc_preload() {
  local entry kept=()
  IFS=': ' read -r -a entries <<<"${LD_PRELOAD:-}"
  for entry in "${entries[@]}"; do
    [[ -n $entry && $(basename "$entry") != libvmmipc* ]] && kept+=("$entry")
  done
  (IFS=:; echo "${kept[*]}")
}

# --- vLLM ------------------------------------------------------------------------------------

step_vllm() {
  banner "vLLM custom all-reduce"
  if [[ -z $VLLM_SRC ]]; then
    record vllm SKIP "no vLLM source tree (--vllm-src or VLLM_SRC)" 0
    return
  fi
  if ((GPUS < 2)) || [[ -z $LIB ]]; then
    record vllm SKIP "needs 2 GPUs ($GPUS seen) and libvmmipc.so (${LIB:-none})" 0
    return
  fi
  ANY_RAN=1
  local t0 rc log ext json line preload
  preload=$(no_vmmipc_preload)

  t0=$(now)
  if [[ -n $VLLM_EXT ]]; then
    if [[ ! -f $VLLM_EXT ]]; then
      record "vllm build" FAIL "--vllm-ext $VLLM_EXT: no such file" 0
      return
    fi
    ext=$(cd "$(dirname "$VLLM_EXT")" && pwd)/$(basename "$VLLM_EXT")
    record "vllm build" PASS "given: $ext (built earlier from $VLLM_SRC)" 0
  else
    log="$OUTDIR/vllm-build.log"
    : >"$log"
    run_logged "$log" "$(step_limit 420)" "$PYTHON" "$HARNESS/vllm_custom_ar.py" build \
      --vllm-src "$VLLM_SRC" --build-dir "$BUILD_DIR/frameworks/vllm_custom_ar"
    rc=$?
    ext=$(grep -m1 '^BUILT ' "$log" | cut -d' ' -f2-)
    if ((rc != 0)) || [[ -z $ext ]]; then
      record "vllm build" "$(status_result $rc)" "csrc/custom_all_reduce.cu did not build (exit $rc; vllm-build.log)" \
        $(($(now) - t0))
      return
    fi
    record "vllm build" PASS "$ext from $VLLM_SRC/csrc/custom_all_reduce.cu" $(($(now) - t0))
  fi

  deepep_build_wait  # nothing below competes with a compile

  # Without vmmipc, expandable segments: vLLM's CUDACHECK must stop the ranks as in vllm#42609.
  t0=$(now)
  log="$OUTDIR/vllm-no-vmmipc.log"
  : >"$log"
  run_logged "$log" "$(step_limit 180)" env LD_PRELOAD="$preload" \
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
    "${TORCHRUN[@]}" "$HARNESS/vllm_custom_ar.py" run --ext "$ext" --out "$OUTDIR/vllm-no-vmmipc.json"
  rc=$?
  line=$(grep -m1 -oE "Failed: Cuda error [^ ]*custom_all_reduce\.cuh:[0-9]+ 'invalid argument'" "$log")
  local eager
  eager=$(grep -cE '^CHECK rank[0-9]+ vllm\.eager\.[^ ]+ PASS' "$log")
  if ((rc != 0)) && [[ -n $line ]]; then
    record "vllm without vmmipc" PASS "failed as vllm#42609: ${line##*/} at $(grep -m1 -oE 'STEP rank[0-9]+ get_graph[^ ]*' "$log" | cut -d' ' -f3) (exit $rc; eager checks before it: $eager PASS)" \
      $(($(now) - t0))
  else
    record "vllm without vmmipc" FAIL "expected the vllm#42609 failure, got exit $rc and no such line (vllm-no-vmmipc.log)" \
      $(($(now) - t0))
  fi

  # With vmmipc (twice, fresh) and legacy IPC (twice), interleaved so that drift hits both.
  local name
  for name in vmmipc-1 legacy-1 vmmipc-2 legacy-2; do
    t0=$(now)
    log="$OUTDIR/vllm-$name.log"
    json="$OUTDIR/vllm-$name.json"
    : >"$log"
    rm -f "$json"
    if [[ $name == vmmipc-* ]]; then
      run_logged "$log" "$(step_limit 240)" env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
        "$REPO_ROOT/scripts/vmmipc-run" --lib "$LIB" --log-level info -- \
        "${TORCHRUN[@]}" "$HARNESS/vllm_custom_ar.py" run --ext "$ext" --out "$json" --latency
    else
      run_logged "$log" "$(step_limit 240)" env LD_PRELOAD="$preload" \
        PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False \
        "${TORCHRUN[@]}" "$HARNESS/vllm_custom_ar.py" run --ext "$ext" --out "$json" --latency
    fi
    rc=$?
    local summary exports
    summary=$(grep -m1 -oE '^SUMMARY vllm_custom_ar: .*' "$log" | cut -d' ' -f3-)
    exports=$(grep -cE '\] info: vmmipc .* exporting' "$log")
    record "vllm $name" "$(status_result $rc)" \
      "${summary:-no SUMMARY line}$([[ $name == vmmipc-* ]] && echo "; vmmipc exporting lines: $exports"); exit $rc" \
      $(($(now) - t0))
  done

  t0=$(now)
  log="$OUTDIR/vllm-compare.log"
  : >"$log"
  if [[ -f $OUTDIR/vllm-vmmipc-1.json && -f $OUTDIR/vllm-vmmipc-2.json ]]; then
    run_logged "$log" "$(step_limit 60)" "$PYTHON" "$HARNESS/vllm_custom_ar.py" compare \
      --pointers "$OUTDIR/vllm-vmmipc-1.json" "$OUTDIR/vllm-vmmipc-2.json"
    rc=$?
    record "vllm pointers" "$(status_result $rc)" \
      "$(grep -m1 -oE '^POINTERS [A-Z]+' "$log" | cut -d' ' -f2) in two fresh vmmipc runs: $(grep -m1 -oE 'rank 0 graph_peer_ptrs: [0-9]+ entries' "$log" | cut -d' ' -f4) graph buffers a rank" \
      $(($(now) - t0))
  else
    record "vllm pointers" FAIL "a vmmipc run wrote no JSON" 0
  fi
  local vm=() lg=() f
  for f in "$OUTDIR"/vllm-vmmipc-[12].json; do [[ -f $f ]] && vm+=("$f"); done
  for f in "$OUTDIR"/vllm-legacy-[12].json; do [[ -f $f ]] && lg+=("$f"); done
  if ((${#vm[@]} && ${#lg[@]})); then
    "$PYTHON" "$HARNESS/vllm_custom_ar.py" compare --vmmipc "${vm[@]}" --legacy "${lg[@]}" \
      | tee "$OUTDIR/vllm-latency.md" | tee -a "$log"
    line=$(grep -m1 '^LATENCY ' "$OUTDIR/vllm-latency.md")
    if [[ $line == "LATENCY "*" 0 outside"* ]]; then
      record "vllm latency" PASS "${line#LATENCY }; vllm-latency.md" 0
    else
      record "vllm latency" MISSED "${line#LATENCY }; vllm-latency.md" 0
    fi
  else
    record "vllm latency" FAIL "no latency JSON from vmmipc and legacy runs" 0
  fi
}

# --- SGLang ------------------------------------------------------------------------------------

step_sglang() {
  banner "SGLang's VMM path beside vmmipc"
  if [[ -z $SGLANG_SRC ]]; then
    record sglang SKIP "no SGLang tree (--sglang-src or SGLANG_SRC)" 0
    return
  fi
  if ((GPUS < 1)) || [[ -z $LIB ]]; then
    record sglang SKIP "needs a GPU and libvmmipc.so (${LIB:-none})" 0
    return
  fi
  deepep_build_wait
  ANY_RAN=1
  local t0 rc log preload measure summary
  preload=$(no_vmmipc_preload)
  local args=("${TORCHRUN[@]}" "$HARNESS/sglang_vmm_path.py" --sglang-src "$SGLANG_SRC")

  t0=$(now)
  log="$OUTDIR/sglang-no-vmmipc.log"
  : >"$log"
  run_logged "$log" "$(step_limit 180)" env LD_PRELOAD="$preload" \
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "${args[@]}"
  rc=$?
  summary=$(grep -oE '^SUMMARY rank0 sglang_vmm_path: .*' "$log" | cut -d' ' -f4-)
  record "sglang without vmmipc" "$(status_result $rc)" \
    "SGLang's path reads the peer's tensors, legacy IPC refused: ${summary:-no SUMMARY line} (rank 0); exit $rc" \
    $(($(now) - t0))

  t0=$(now)
  log="$OUTDIR/sglang-vmmipc.log"
  : >"$log"
  run_logged "$log" "$(step_limit 180)" env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
    "$REPO_ROOT/scripts/vmmipc-run" --lib "$LIB" --log-level info -- "${args[@]}"
  rc=$?
  summary=$(grep -oE '^SUMMARY rank0 sglang_vmm_path: .*' "$log" | cut -d' ' -f4-)
  measure=$(grep -m1 -oE '^MEASURE rank0 .*' "$log" | cut -d' ' -f3-)
  record "sglang with vmmipc" "$(status_result $rc)" \
    "both paths read the peer's tensors: ${summary:-no SUMMARY line} (rank 0); ${measure:-no MEASURE line}; exit $rc" \
    $(($(now) - t0))
}

# --- DeepEP ----------------------------------------------------------------------------------

step_deepep() {
  banner "DeepEP intranode, Buffer in a torch_memory_saver region"
  deepep_build_wait
  if [[ -z $DEEPEP_SRC ]]; then
    record deepep SKIP "no DeepEP source tree (--deepep-src or DEEPEP_SRC)" 0
    return
  fi
  if ((GPUS < 2)) || [[ -z $LIB ]]; then
    record deepep SKIP "needs 2 GPUs ($GPUS seen) and libvmmipc.so (${LIB:-none})" 0
    return
  fi
  local missing
  missing=$("$PYTHON" -c '
import importlib
for name in ("deep_ep", "torch_memory_saver"):
    try:
        importlib.import_module(name)
    except Exception as error:
        print("%s (%s)" % (name, type(error).__name__), end=" ")
' 2>/dev/null)
  if [[ -n $missing ]]; then
    record deepep SKIP "not importable: $missing(build and install DeepEP per its README; pip install torch_memory_saver)" 0
    return
  fi
  ANY_RAN=1
  local saver t0 rc log preload line
  saver=$("$PYTHON" -c 'from torch_memory_saver.utils import get_binary_path_from_package as find
print(find("torch_memory_saver_hook_mode_preload"))')
  preload=$(no_vmmipc_preload)
  preload="$saver${preload:+:$preload}"
  local args=("$HARNESS/deepep_intranode.py" --deepep-src "$DEEPEP_SRC" --memory-saver --num-processes 2)

  t0=$(now)
  log="$OUTDIR/deepep-no-vmmipc.log"
  : >"$log"
  run_logged "$log" "$(step_limit 240)" env LD_PRELOAD="$preload" "$PYTHON" "${args[@]}"
  rc=$?
  line=$(grep -m1 -oE "[^ ]*deep_ep\.cpp:[0-9]+ '[^']*'" "$log")
  if ((rc != 0)) && grep -q "invalid argument" "$log"; then
    record "deepep without vmmipc" PASS "failed in the memory saver's region: ${line:-invalid argument} (exit $rc)" \
      $(($(now) - t0))
  else
    record "deepep without vmmipc" FAIL "expected cudaIpcGetMemHandle to fail, got exit $rc (deepep-no-vmmipc.log)" \
      $(($(now) - t0))
  fi

  t0=$(now)
  log="$OUTDIR/deepep-vmmipc.log"
  : >"$log"
  run_logged "$log" "$(step_limit 360)" env LD_PRELOAD="$preload" \
    "$REPO_ROOT/scripts/vmmipc-run" --lib "$LIB" --deepep --log-level info -- "$PYTHON" "${args[@]}"
  rc=$?
  local hook exports
  hook=$(grep -m1 -oE 'deep_ep\.Buffer: .*' "$log" | cut -c1-90)
  exports=$(grep -cE '\] info: vmmipc .* exporting' "$log")
  if ((rc == 0)) && grep -q '^RESULT deepep_intranode' "$log"; then
    record "deepep with vmmipc" PASS "DeepEP's test_intranode checks passed on 2 ranks; vmmipc exporting lines: $exports; hook: ${hook:-no line}" \
      $(($(now) - t0))
  else
    record "deepep with vmmipc" "$(status_result $rc)" "exit $rc (deepep-vmmipc.log); hook: ${hook:-no line}" \
      $(($(now) - t0))
  fi
}

print_summary() {
  local overall=PASS code=0
  if ((ANY_FAILED)); then
    overall=FAIL
    code=1
  elif ((!ANY_RAN)); then
    overall="NOTHING RAN"
    code=2
  fi
  {
    echo
    echo "## vmmipc framework check: $overall"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M UTC'), ${GPU_LINE}, $GPUS GPUs, $(($(now) - START_S))s; logs in $OUTDIR"
    echo
    echo "| step | result | detail | time |"
    echo "| --- | --- | --- | --- |"
    local row
    for row in "${ROWS[@]}"; do echo "$row"; done
    if [[ -f $OUTDIR/vllm-latency.md ]]; then
      echo
      echo "vLLM custom all-reduce, graph replay, bf16, per all-reduce:"
      echo
      grep -E '^\|' "$OUTDIR/vllm-latency.md"
    fi
  } | tee "$OUTDIR/summary.md"
  return $code
}

# shellcheck disable=SC2317  # invoked by the trap below
on_signal() {
  record interrupted FAIL "signal received" 0
  print_summary
  exit 1
}
trap on_signal INT TERM

step_env
step_saver_wheel
step_deepep_build_start
step_library
step_vllm
step_sglang
step_deepep
print_summary
exit $?
