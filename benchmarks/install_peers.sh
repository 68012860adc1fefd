#!/usr/bin/env bash
# Optional: install peer benchmark clients in their own venvs, for benchmarks/client_ceiling.py.
# Never a dependency of servelab. aiperf: ~50 s, ~1.2 GB, no torch.
set -euo pipefail
ROOT="${PEERS_DIR:-$(cd "$(dirname "$0")/.." && pwd)/.peers}"
mkdir -p "$ROOT"
if [ ! -x "$ROOT/aiperf/bin/aiperf" ]; then
  python3 -m venv "$ROOT/aiperf"
  "$ROOT/aiperf/bin/pip" install --quiet --disable-pip-version-check aiperf
fi
echo "aiperf: $ROOT/aiperf/bin/aiperf   (run: benchmarks/client_ceiling.py --aiperf $ROOT/aiperf/bin/aiperf)"
