#!/usr/bin/env bash
# Prepare wheels for benchmarks/gpu_check.sh where pip works (the device has no network):
#   bash benchmarks/gpu_wheels.sh [.whl]
# Python 3.12, x86-64 manylinux. flashinfer-python (about 100 MB) is split into two parts under 50 MB, to
# travel in two calls (carry the folder with only part aa in the first, part ab in the second).
set -euo pipefail
DIR=${1:-.whl}
mkdir -p "$DIR"
PLAT="--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLAT -d "$DIR" \
    flashinfer-python apache-tvm-ffi
for whl in "$DIR"/flashinfer_python-*.whl; do
    split -b 50M "$whl" "$whl.part-" && rm "$whl"
done
ls -la "$DIR"
