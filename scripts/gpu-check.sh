#!/usr/bin/env bash
# gpu-check.sh [OUTDIR]: the GPU check; the steps are scripts/gpu_check/gpu_set.py (--help, --dry-run).
exec python3 "$(dirname "${BASH_SOURCE[0]}")/gpu_check" gpu "$@"
