#!/usr/bin/env bash
# llama.cpp's server via llama-cpp-python, built from source (about 10 minutes on 2 cores), in its own
# virtual environment outside the project: never a dependency of radixlm, never run in CI.
#   bash benchmarks/peers/setup_llamacpp.sh [PEERS_DIR]      (default: ../peers beside the checkout)
set -euo pipefail
DIR=${1:-$(cd "$(dirname "$0")/../../.." && pwd)/peers}
mkdir -p "$DIR"
python3 -m venv "$DIR/llama"
CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$DIR/llama/bin/pip" install -q "llama-cpp-python[server]"
echo "llama.cpp server: $DIR/llama/bin/python -m llama_cpp.server"
