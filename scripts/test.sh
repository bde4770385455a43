#!/usr/bin/env bash
# Sets up, builds (warnings are errors) and runs every test that needs no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)"
