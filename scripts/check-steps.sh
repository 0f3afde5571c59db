# Sourced by scripts/gpu-check.sh and scripts/framework-check.sh: the step
# helpers of a check made of timed steps under one time budget, ending in a
# markdown table. The caller sets OUTDIR, BUDGET_S, DEADLINE_S and, if it wants
# other values than the defaults, CHECK_KEEP_S (seconds kept for the summary,
# 15) and CHECK_MIN_STEP_S (a step with less left is not started, 5); ROWS and
# ANY_FAILED collect the results.
# shellcheck shell=bash

NO_BUDGET=200  # run_logged's status when the budget is spent before the step starts
ROWS=()
ANY_FAILED=0

now() { date +%s; }

# described_commit: HEAD's short hash; a copy of a working tree (the device machine's) may carry
# older git metadata than its files, so say so rather than name a commit that is not what ran.
described_commit() {
  local commit
  commit=$(git rev-parse --short HEAD 2>/dev/null || echo "no commit")
  if [[ -n $(git status --porcelain --untracked-files=no 2>/dev/null | head -n 1) ]]; then
    commit="$commit + uncommitted changes (tracked files differ from it)"
  fi
  echo "$commit"
}

# step_limit WANTED: seconds for the next step: WANTED, cut to what is left of the budget.
step_limit() {
  local left=$((DEADLINE_S - $(now) - ${CHECK_KEEP_S:-15}))
  if ((left < $1)); then echo "$left"; else echo "$1"; fi
}

# run_logged LOG LIMIT CMD...: CMD under timeout, output to the terminal and appended to LOG.
# Returns CMD's status (124/137: timed out; NO_BUDGET: not started).
run_logged() {
  local log=$1 limit=$2
  shift 2
  if ((limit < ${CHECK_MIN_STEP_S:-5})); then
    echo "not started: the time budget (${BUDGET_S}s) is spent" | tee -a "$log"
    return "$NO_BUDGET"
  fi
  echo "+ (timeout ${limit}s) $*" | tee -a "$log"
  timeout -k 10 "$limit" "$@" </dev/null 2>&1 | tee -a "$log"
  return "${PIPESTATUS[0]}"
}

# record STEP RESULT DETAIL SECONDS: one row of the final table (PASS, FAIL, SKIP, TIMEOUT,
# MISSED); FAIL and TIMEOUT make the check fail.
record() {
  local detail=${3//|//}
  ROWS+=("| $1 | $2 | $detail | ${4}s |")
  case $2 in FAIL | TIMEOUT) ANY_FAILED=1 ;; esac
  echo "| $1 | $2 | $detail | ${4}s |" >>"$OUTDIR/summary.partial.md"
  echo "==> $1: $2 - $detail (${4}s)"
}

# status_result RC: PASS, TIMEOUT or FAIL for a command's exit status.
status_result() {
  case $1 in
    0) echo PASS ;;
    124 | 137 | "$NO_BUDGET") echo TIMEOUT ;;
    *) echo FAIL ;;
  esac
}

banner() { printf '\n======== %s ========\n' "$1"; }
