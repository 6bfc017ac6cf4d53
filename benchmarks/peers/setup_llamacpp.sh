#!/usr/bin/env bash
# llama.cpp's C++ `llama-server`, built for this machine (GGML_NATIVE: the CPU's own instruction sets), outside
# the project: never a dependency of radixlm, never run in CI.
#   bash benchmarks/peers/setup_llamacpp.sh [PEERS_DIR] [--python] [--avx2]   (default: ../peers beside the checkout)
# The llama.cpp tree comes from llama-cpp-python's source distribution on PyPI (it vendors one); the build
# takes 10-15 minutes on 2 cores and is linked as PEERS_DIR/llama-server, with llama-bench, llama-perplexity (the
# fidelity benchmark's --kl-divergence) and llama-quantize
# (which makes the K-quant files of the benchmarks: make_gguf.py) beside it (their shared libraries stay in the
# build). --python also installs llama-cpp-python's own (slower) Python server into PEERS_DIR/llama. --avx2 also
# builds a llama-server for AVX2 + FMA + F16C only, as PEERS_DIR/avx2/llama-server: the peer for an AVX512
# machine acting as an AVX2-only one (RADIXLM_CPU_CAPABILITY=avx2 ATEN_CPU_CAPABILITY=avx2; run_peers.py
# --peers-dir PEERS_DIR/avx2).
set -euo pipefail
DIR=$(cd "$(dirname "$0")/../../.." && pwd)/peers
PYTHON_SERVER=0
AVX2_SERVER=0
for arg in "$@"; do
  case "$arg" in
    --python) PYTHON_SERVER=1 ;;
    --avx2) AVX2_SERVER=1 ;;
    *) DIR=$arg ;;
  esac
done
VER=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
mkdir -p "$DIR"
SRC="$DIR/llama-src"
mkdir -p "$SRC"
python3 -m pip download -q --no-deps --no-binary :all: -d "$SRC" "llama-cpp-python==$VER"
tar xzf "$SRC/llama_cpp_python-$VER.tar.gz" -C "$SRC"
TREE="$SRC/llama_cpp_python-$VER/vendor/llama.cpp"
cmake -S "$TREE" -B "$TREE/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
cmake --build "$TREE/build" --target llama-server llama-bench llama-quantize llama-perplexity -j "$(nproc)"
for tool in llama-server llama-bench llama-quantize llama-perplexity; do ln -sf "$TREE/build/bin/$tool" "$DIR/$tool"; done
ISA=$(grep -m1 -o -w 'avx512f\|avx2' <(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | sort -r) || true)
echo "llama.cpp: $DIR/llama-server, $DIR/llama-bench, $DIR/llama-quantize, $DIR/llama-perplexity (native: ${ISA:-neither avx2 nor avx512})"
if [ "$AVX2_SERVER" = 1 ]; then
  cmake -S "$TREE" -B "$TREE/build-avx2" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
      -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF \
      -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF
  cmake --build "$TREE/build-avx2" --target llama-server llama-bench -j "$(nproc)"
  mkdir -p "$DIR/avx2"
  ln -sf "$TREE/build-avx2/bin/llama-server" "$DIR/avx2/llama-server"
  ln -sf "$TREE/build-avx2/bin/llama-bench" "$DIR/avx2/llama-bench"
  echo "llama.cpp for AVX2 only: $DIR/avx2/llama-server, $DIR/avx2/llama-bench"
fi
if [ "$PYTHON_SERVER" = 1 ]; then
  python3 -m venv "$DIR/llama"
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$DIR/llama/bin/pip" install -q "llama-cpp-python[server]==$VER"
  echo "llama-cpp-python: $DIR/llama/bin/python -m llama_cpp.server"
fi
