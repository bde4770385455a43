#!/usr/bin/env bash
# Configures and builds qspec into build/ (warnings are errors). QSPEC_CUDA=ON|OFF overrides the nvcc probe.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"
args=(-S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DQSPEC_WERROR=ON)
[ -n "${QSPEC_CUDA:-}" ] && args+=("-DQSPEC_CUDA=${QSPEC_CUDA}")
cmake "${args[@]}" >/dev/null
cmake --build build -j"$(nproc)"
