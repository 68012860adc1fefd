"""Where a result came from: host, servelab revision, engine command and environment, with secrets redacted.

Everything here is best effort and never raises: a missing /proc, an absent NVIDIA driver or a tree that is not a
git checkout leave a field empty instead of failing the run that wanted to record them.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

import psutil

import servelab
from servelab import aio
from servelab.host.gpus import host_gpus
from servelab.records import HostInfo, Provenance
# The redaction rule lives in servelab/redaction.py; these names are re-exported for the callers that used them.
from servelab.redaction import (REDACTED, SECRET_FLAGS, is_secret_flag, is_secret_key,  # noqa: F401
                                redact_command, redact_env, redact_text, redact_url)

# Environment variables that change how an engine behaves, recorded even when servelab did not set them.
RELEVANT_ENV_PREFIXES = (
    "CUDA_", "NCCL_", "NVIDIA_", "HIP_", "ROCR_", "OMP_", "MKL_", "KMP_", "GGML_", "LLAMA_", "VLLM_", "SGLANG_",
    "HF_", "HUGGING_FACE_", "TRANSFORMERS_", "TORCH", "PYTORCH_", "TOKENIZERS_",
)


# --------------------------------------------------------------------------------------------------------------
# The environment
# --------------------------------------------------------------------------------------------------------------

def relevant_env(additions: Mapping[str, str] | None = None) -> dict[str, str]:
    """The engine-relevant part of servelab's environment plus what the launch added, redacted."""
    env = {k: v for k, v in os.environ.items() if k.startswith(RELEVANT_ENV_PREFIXES)}
    env.update(additions or {})
    return redact_env(dict(sorted(env.items())))


# --------------------------------------------------------------------------------------------------------------
# Host and source revision
# --------------------------------------------------------------------------------------------------------------

def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                # x86 says "model name"; some ARM kernels only say "Hardware" or "Processor".
                if key.strip().lower() in ("model name", "hardware", "processor") and not value.strip().isdigit():
                    return value.strip() or None
    except OSError:
        pass
    return platform.processor() or None


def host_info() -> HostInfo:
    gpus, driver = host_gpus()
    try:
        ram: int | None = int(psutil.virtual_memory().total)
    except Exception:
        ram = None
    return HostInfo(
        hostname=socket.gethostname(),
        os=f"{platform.system()} {platform.release()}",
        python=sys.version.split()[0],
        cpu_model=_cpu_model(),
        cpu_cores_logical=psutil.cpu_count(logical=True),
        cpu_cores_physical=psutil.cpu_count(logical=False),
        ram_bytes=ram,
        gpus=gpus,
        gpu_driver=driver,
    )


def git_revision(source_root: Path | None = None) -> str | None:
    """Short sha of the servelab checkout, with `-dirty` when tracked files differ from it; None if not a checkout.

    Only a repository whose top level *is* the source tree counts: an installed servelab that happens to live
    inside some other repository must not report that repository's revision.
    """
    root = (source_root or Path(servelab.__file__).resolve().parent.parent).resolve()
    try:
        top = _git(root, "rev-parse", "--show-toplevel")
        if top is None or Path(top).resolve() != root:
            return None
        sha = _git(root, "rev-parse", "--short", "HEAD")
        if sha is None:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "diff", "--quiet", "HEAD", "--"], capture_output=True,
                               timeout=5).returncode == 1
        return f"{sha}-dirty" if dirty else sha
    except (OSError, subprocess.SubprocessError):
        return None


def _git(root: Path, *args: str) -> str | None:
    done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=5)
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


# --------------------------------------------------------------------------------------------------------------
# The record
# --------------------------------------------------------------------------------------------------------------

def utc_now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def build_provenance(*, engine: str | None = None, engine_version: str | None = None,
                     command: Sequence[str] | None = None, env: Mapping[str, str] | None = None,
                     model: str | None = None, model_path: str | None = None, model_size_bytes: int | None = None,
                     model_format: str | None = None, started_at: str | None = None,
                     engine_pids: Sequence[int] = ()) -> Provenance:
    """A Provenance stamped with the time (now, unless `started_at` says when it began), servelab's version and
    revision, the host, and how busy the host was (a short look: `engine_pids`' trees, when the engine runs, are
    not counted as other load). Command and environment are redacted here, so no caller can forget to."""
    from servelab.host.environment import host_load  # the bench package imports this module's neighbours

    return Provenance(
        started_at=started_at or utc_now_iso(),
        servelab_version=servelab.__version__,
        servelab_git_revision=git_revision(),
        client_event_loop=aio.loop_name(),
        engine=engine,
        engine_version=engine_version,
        command=redact_command(command) if command is not None else None,
        env=redact_env(env or {}),
        model=model,
        model_path=model_path,
        model_size_bytes=model_size_bytes,
        model_format=model_format,
        host=host_info(),
        host_load=host_load(engine_pids),
    )
