#!/usr/bin/env bash
# Sets up, builds (warnings are errors) and runs every test that needs no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)"
# The server through the official openai SDK (tests/python): a venv from PyPI with the pinned versions of
# tests/python/requirements.txt, made again when they change.
venv=build/.venv-tests
if ! cmp -s tests/python/requirements.txt "$venv/requirements.txt"; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q -r tests/python/requirements.txt
  cp tests/python/requirements.txt "$venv/requirements.txt"
fi
QSPEC_BINARY=build/qspec "$venv/bin/pytest" -q tests/python
