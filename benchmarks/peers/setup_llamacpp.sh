#!/usr/bin/env bash
# llama.cpp in its own virtual environment outside the project: never a dependency of radixlm, never run in CI.
#   bash benchmarks/peers/setup_llamacpp.sh [PEERS_DIR]      (default: ../peers beside the checkout)
# 1. llama-cpp-python's Python server, built from source (about 10 minutes on 2 cores);
# 2. llama.cpp's own C++ `llama-server`, built from the llama.cpp tree vendored in the same source
#    distribution (native CPU flags; another 10-15 minutes), linked as PEERS_DIR/llama-server.
set -euo pipefail
DIR=${1:-$(cd "$(dirname "$0")/../../.." && pwd)/peers}
mkdir -p "$DIR"
python3 -m venv "$DIR/llama"
CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$DIR/llama/bin/pip" install -q "llama-cpp-python[server]"
VER=$("$DIR/llama/bin/python" -c "import llama_cpp; print(llama_cpp.__version__)")
SRC="$DIR/llama-src"
mkdir -p "$SRC"
"$DIR/llama/bin/pip" download -q --no-deps --no-binary :all: -d "$SRC" "llama-cpp-python==$VER"
tar xzf "$SRC/llama_cpp_python-$VER.tar.gz" -C "$SRC"
TREE="$SRC/llama_cpp_python-$VER/vendor/llama.cpp"
cmake -S "$TREE" -B "$TREE/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
cmake --build "$TREE/build" --target llama-server -j "$(nproc)"
ln -sf "$TREE/build/bin/llama-server" "$DIR/llama-server"  # its shared libraries stay beside it
echo "llama.cpp: $DIR/llama-server (C++), $DIR/llama/bin/python -m llama_cpp.server (Python)"
