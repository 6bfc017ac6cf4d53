#!/usr/bin/env bash
# The device check: one command on a fresh NVIDIA machine (no network), run from the repository root.
#
#   bash benchmarks/gpu_check.sh [WHEEL_DIR]        results under ${OUT:-gpu_results}/
#
# 1. installs radixlm (no dependencies: the machine has torch, triton, numpy, tqdm, transformers) and any
#    wheels in WHEEL_DIR (prepared where pip works by benchmarks/gpu_wheels.sh);
# 2. runs the gpu-marked tests: every Triton kernel natively against its torch reference, and the Triton
#    (and FlashInfer, if importable) backend end to end against the CPU torch backend;
# 3. benchmarks a random-weight Llama with Llama-3-8B shapes (benchmarks/gpu_bench.py -> gpu_bench.json).
# FlashInfer: its wheel (about 100 MB) is over one call's 64 MiB carry, so gpu_wheels.sh splits it in two
# parts that travel in two calls to the same warm machine and are joined here; without them the FlashInfer
# runs are reported as not run. The default GGUF model (90 MB) does not travel either: the end-to-end check
# uses a random-weight model, compared token for token with the CPU.
# Budget: under 8 minutes (tests about 2, Triton compiles included; benchmark about 4).
set -uo pipefail
OUT=${OUT:-gpu_results}
WHEELS=${1:-.whl}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls "$WHEELS"/flashinfer*.part-* >/dev/null 2>&1; then
    cat "$WHEELS"/flashinfer*.part-* > "$WHEELS/$(basename "$(ls "$WHEELS"/flashinfer*.part-aa)" .part-aa)"
fi
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$WHEELS"/*.whl \
        && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
python3 -P -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/gpu.txt"
python3 -P -c "import flashinfer; print('flashinfer', flashinfer.__version__)" >> "$OUT/gpu.txt" 2>&1 || true
cat "$OUT/gpu.txt"
(cd tests && timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider test_kernels.py 2>&1) | tee "$OUT/gpu_tests.txt"
timeout 300 python3 benchmarks/gpu_bench.py --out "$OUT/gpu_bench.json" 2>&1 | tee "$OUT/gpu_bench.txt"
