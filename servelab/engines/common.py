"""Small helpers every adapter needs: reading flags back from a command line, finding the engine's interpreter or
binary (and saying how to install it when it is missing), and naming the model argument."""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

from servelab.engines.base import EngineSpec
from servelab.errors import UserError
from servelab.models import KNOWN_MODELS, resolve_model

# --------------------------------------------------------------------------------------------------------------
# Command lines
# --------------------------------------------------------------------------------------------------------------

def _names(*names: str) -> set[str]:
    """Flags are compared with `_` and `-` treated alike: llama-cpp-python spells them `--n_threads`."""
    return {n.replace("_", "-") for n in names}


def flag_value(command: list[str], *names: str) -> str | None:
    """The value of the last occurrence of a flag (`--x V` or `--x=V`); None when absent."""
    wanted = _names(*names)
    found: str | None = None
    for i, arg in enumerate(command):
        flag, eq, value = arg.partition("=")
        flag = flag.replace("_", "-") if flag.startswith("--") else flag
        if flag in wanted:
            if eq:
                found = value
            elif i + 1 < len(command):
                found = command[i + 1]
    return found


def has_flag(command: list[str], *names: str) -> bool:
    """True when a boolean flag is present (`--x`, or `--x=true`/`--x true` for flags that take a bool)."""
    wanted = _names(*names)
    for i, arg in enumerate(command):
        flag, eq, value = arg.partition("=")
        flag = flag.replace("_", "-") if flag.startswith("--") else flag
        if flag not in wanted:
            continue
        if eq:
            return is_true(value)
        following = command[i + 1] if i + 1 < len(command) else ""
        if following.lower() in ("false", "0", "no", "off"):
            return False
        return True
    return False


def is_true(value: object) -> bool:
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def url_host(host: str) -> str:
    """The host to put in a URL for a server bound to `host`."""
    if host in ("0.0.0.0", "", "::"):
        return "127.0.0.1"
    if ":" in host and not host.startswith("["):
        return f"[{host}]"
    return host


def base_url(spec: EngineSpec, port: int) -> str:
    return f"http://{url_host(spec.host)}:{port}"


# --------------------------------------------------------------------------------------------------------------
# Is the engine installed?
# --------------------------------------------------------------------------------------------------------------

def python_for(spec: EngineSpec) -> str:
    """The interpreter that runs a Python engine: the spec's, or the one running servelab."""
    return spec.executable or sys.executable


def require_python_module(spec: EngineSpec, module: str, engine_title: str, install: str) -> None:
    """UserError unless `module` is importable by the interpreter that would run the engine."""
    python = python_for(spec)
    # abspath, not realpath: every venv's python is a symlink to the same base interpreter; the venv is the path.
    if spec.executable is None or os.path.abspath(python) == os.path.abspath(sys.executable):
        found = importlib.util.find_spec(module) is not None
    else:
        if not (os.path.isfile(python) and os.access(python, os.X_OK)):
            raise UserError(f"{engine_title}: interpreter '{python}' does not exist or is not executable",
                            hint="point --executable at the python of the venv the engine is installed in")
        probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
        try:
            found = subprocess.run([python, "-c", probe], capture_output=True, timeout=60).returncode == 0
        except (OSError, subprocess.SubprocessError):
            found = False
    if not found:
        raise UserError(f"{engine_title} is not installed: Python module '{module}' is not importable by {python}",
                        hint=f"{install}; or run it from another venv with --executable /path/to/venv/bin/python")


def require_binary(spec: EngineSpec, binary: str, engine_title: str, install: str) -> str:
    """The path of the engine's binary (the spec's, or `binary` on PATH); UserError saying how to get it if none."""
    if spec.executable:
        path = shutil.which(spec.executable) or (spec.executable if os.access(spec.executable, os.X_OK) else None)
        if path is None:
            raise UserError(f"{engine_title}: '{spec.executable}' does not exist or is not executable",
                            hint=install)
        return path
    path = shutil.which(binary)
    if path is None:
        raise UserError(f"{engine_title}: '{binary}' was not found on PATH",
                        hint=f"{install}; or give its path with --executable")
    return path


# --------------------------------------------------------------------------------------------------------------
# The model argument
# --------------------------------------------------------------------------------------------------------------

def looks_like_path(model: str) -> bool:
    return model.startswith(("/", "./", "../", "~")) or os.sep in model and Path(model).expanduser().exists()


def hub_or_path(model: str) -> tuple[str, int | None, str | None]:
    """For engines that take a Hugging Face id or a folder: (argument, size in bytes, format).

    A path that does not exist is a UserError now rather than an engine crash later. A hub id is passed through
    (its size is unknown until downloaded). Known short names (smollm2) are GGUF files these engines cannot read.
    """
    if model.lower() in KNOWN_MODELS:
        raise UserError(f"model '{model}' is a GGUF file, which this engine does not serve",
                        hint="give a Hugging Face folder or hub id (scripts/setup-slow-engines.sh converts "
                             "SmolLM2 into .venv-tf/models/smollm2-hf)")
    if looks_like_path(model):
        resolved = resolve_model(model)  # raises the usual "neither a known name nor an existing path"
        return str(resolved.path), resolved.size_bytes, resolved.format
    return model, None, "hub-id"


# --------------------------------------------------------------------------------------------------------------
# Log lines
# --------------------------------------------------------------------------------------------------------------

# uvicorn access lines for readiness and config endpoints. Our own probe (and SGLang's warm-up thread, which polls
# /model_info) produces them every few ms whatever the engine is doing, so they must never count as progress.
PROBE_ACCESS_LINE = (r'"(?:GET|HEAD) /(?:health|health_generate|v1/health|v1/models|models|model_info|'
                     r'get_model_info|server_info|get_server_info|ping|version|info|props|slots|metrics)\S* '
                     r'HTTP/[\d.]+"')

# tqdm's `n/total` as every bar in these engines prints it: "... 41% Completed | 26/64 [..." or "41%|███ | 26/64".
# The lookahead for " [" (tqdm's "[elapsed<remaining, rate]") makes a bar cut in the middle of a write unreadable
# rather than misread ("12/6" of "12/64").
TQDM_COUNT = r"\s*\d+%\s*(?:Completed )?\|[^|\r\n]*?\|?\s*(?P<n>\d+)/(?P<total>\d+)(?=\s*\[)"


@functools.lru_cache(maxsize=1)
def host_gpu_count() -> int:
    """GPUs NVML sees on this host (0 without a driver): decides whether CPU-only settings are a problem."""
    from servelab.provenance import host_info  # late: provenance is heavier than this module needs at import

    return len(host_info().gpus)

# uvicorn's own start-up lines (llama-cpp-python, transformers serve, SGLang, vLLM all serve through it).
UVICORN_STARTUP = r"Started server process|Waiting for application startup|Application startup complete"
UVICORN_RUNNING = r"Uvicorn running on http://"  # absent when the app hands uvicorn a pre-bound socket (vLLM)
