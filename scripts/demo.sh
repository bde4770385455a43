#!/usr/bin/env bash
# Sets up, builds, writes the built-in demo model (a tiny random Qwen3.5 with the real vocabulary and tokenizer,
# models/demo) and generates text from it on the CPU backend (random weights: the text is noise).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
model=models/demo
[ -f "$model/config.json" ] ||
  ./build/qspec synth --arch qwen3.5-tiny --tokenizer models/qwen3.5-tokenizer --out "$model"
./build/qspec inspect --model "$model"
./build/qspec generate --model "$model" --prompt "The quick brown fox" --max-tokens 24
