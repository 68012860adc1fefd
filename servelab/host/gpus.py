"""The machine's GPUs for everyone who reads them: what the host has (provenance), how busy the GPUs are during a
level (environment) and the memory an engine's processes hold while it starts (lifecycle/evidence).

The NVML session lives with the GPU sampler's NVML source (servelab/host/gpu_telemetry/nvml.py), so one module
talks to NVML; this name stays for its callers.
"""

from __future__ import annotations

from servelab.host.gpu_telemetry.nvml import Nvml, host_gpus

__all__ = ["Nvml", "host_gpus"]
