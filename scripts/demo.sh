#!/usr/bin/env bash
# Sets up, builds, and generates 24 tokens greedily with the built-in tiny Qwen3.5 model on the CPU backend.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
model=tests/fixtures/qwen35/causal-tied-bf16
./build/qspec inspect --model "$model"
./build/qspec generate --model "$model" --prompt-ids 1,2,3,4,5,6,7,8 --max-tokens 24 --ignore-eos
