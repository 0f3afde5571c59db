"""The GPU checks: one runner, the steps as data.

  python3 scripts/gpu_check gpu [OUTDIR] [--list | --dry-run]         (scripts/gpu-check.sh)
  python3 scripts/gpu_check framework [options] [--list | --dry-run]  (scripts/framework-check.sh)

steps.py: the records a step set is written in (Step, Cmd, Gate, Group, ...) and the shared
judges; gpu_set.py and framework_set.py: the two step sets; engine.py: runs a set under one
time budget and writes the summary; describe.py: --list and --dry-run; cli.py: the arguments.
Python 3 standard library only.
"""
