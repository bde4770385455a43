#!/usr/bin/env bash
# Sets up, builds, writes the built-in demo model (a tiny random Qwen3.5 with the real vocabulary and tokenizer,
# models/demo) and generates from it on the CPU backend.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
model=models/demo
[ -f "$model/config.json" ] ||
  ./build/qspec synth --arch qwen3.5-tiny --tokenizer models/qwen3.5-tokenizer --out "$model"
./build/qspec inspect --model "$model"
./build/qspec generate --model "$model" --prompt-ids 248045,846,198,9419,11,1204,513,488,30 --max-tokens 24
