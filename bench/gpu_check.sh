#!/usr/bin/env bash
# The GPU checks of issue 12 in one short run (for a machine with a CUDA GPU; ~3-5 minutes):
#   1. the tests marked `cuda` (tiny-model and SmolLM2 parity on the GPU, bfloat16 there);
#   2. decode tok/s of Qwen2.5-Coder-1.5B (bfloat16, float32) against the GPU's bandwidth
#      ceiling (bench/gpu_decode.py), falling back to the 0.5B when the 1.5B is not pulled.
# Usage: bash bench/gpu_check.sh [PYTHON]   (default: .venv/bin/python, else python3)
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${1:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
status=0
"$PY" -m pytest -q -m cuda tests/runtime/test_devices.py -rs -s || status=1
MODEL=qwen2.5-coder-1.5b-instruct
"$PY" -c "from clearlm.store.catalog import resolve_model; resolve_model('$MODEL')" 2>/dev/null \
  || MODEL="${HOME}/.cache/clearlm/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
for dtype in bfloat16 float32; do
  "$PY" bench/gpu_decode.py "$MODEL" --dtype "$dtype" --steps 128 || status=1
done
exit $status
