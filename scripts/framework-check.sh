#!/usr/bin/env bash
# framework-check.sh [options]: the vLLM/DeepEP/SGLang check; the steps are scripts/gpu_check/framework_set.py (--help).
exec python3 "$(dirname "${BASH_SOURCE[0]}")/gpu_check" framework "$@"
