#!/usr/bin/env bash
# Items 1-3 of the benchmarks on an NVIDIA GPU with random-weight ~1B and ~7B Llama models in bf16;
# appends the figures to benchmarks/RESULTS.md. Needs torch (CUDA build) and transformers only.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
timeout 280 "$PYTHON" -m benchmarks.gpu_check "$@"
