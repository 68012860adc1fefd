"""The machine's GPUs, through NVML (the optional nvidia-ml-py), for everyone who reads them: what the host has
(provenance), how busy the GPUs are during a level (environment) and the memory an engine's processes hold while it
starts (lifecycle/evidence).

Without the library or a driver (an ordinary CPU host) a session opens empty and every read says nothing, at no
cost. Each reading is best effort: a device that cannot answer one question still answers the others.
"""

from __future__ import annotations

from typing import Any


class Nvml:
    """One NVML session: opened once, read as often as needed, closed once."""

    def __init__(self, enabled: bool = True) -> None:
        self._nvml: Any = None
        self._handles: list[Any] = []
        if not enabled:
            return
        try:
            import pynvml  # nvidia-ml-py; optional
        except ImportError:
            return
        try:
            pynvml.nvmlInit()
        except Exception:  # no driver, no device: an ordinary CPU host
            return
        try:
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self._nvml = pynvml
        except Exception:
            self._handles = []
            _shutdown(pynvml)

    @property
    def opened(self) -> bool:
        """NVML answered (a driver is present), whether or not it has devices."""
        return self._nvml is not None

    @property
    def available(self) -> bool:
        return bool(self._handles)

    def driver_version(self) -> str | None:
        if self._nvml is None:
            return None
        try:
            return _text(self._nvml.nvmlSystemGetDriverVersion())
        except Exception:
            return None

    def inventory(self) -> list[dict[str, Any]]:
        """Each device's index and name, with its memory and UUID where it tells them."""
        nvml = self._nvml
        gpus: list[dict[str, Any]] = []
        for index, handle in enumerate(self._handles):
            gpu: dict[str, Any] = {"index": index, "name": _text(nvml.nvmlDeviceGetName(handle))}
            try:
                gpu["memory_total_bytes"] = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
            except Exception:
                pass
            try:
                gpu["uuid"] = _text(nvml.nvmlDeviceGetUUID(handle))
            except Exception:
                pass
            gpus.append(gpu)
        return gpus

    def mean_utilization_and_clock(self) -> tuple[float | None, float | None]:
        """Utilization (percent) and SM clock (MHz), each the mean over the devices that gave it."""
        nvml = self._nvml
        utils: list[float] = []
        clocks: list[float] = []
        for handle in self._handles:
            try:
                utils.append(float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu))
            except Exception:
                pass
            try:
                clocks.append(float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)))
            except Exception:
                pass
        return (sum(utils) / len(utils) if utils else None, sum(clocks) / len(clocks) if clocks else None)

    def memory_of(self, pids: set[int]) -> tuple[int | None, float | None]:
        """GPU memory (bytes) the processes `pids` hold over every device, and the busiest device's utilization;
        (None, None) without GPUs."""
        if not self._handles:
            return None, None
        nvml = self._nvml
        used = 0
        busiest: float | None = None
        for handle in self._handles:
            try:
                for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    if proc.pid in pids and proc.usedGpuMemory is not None:
                        used += int(proc.usedGpuMemory)
            except Exception:
                pass
            try:
                util = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                busiest = util if busiest is None else max(busiest, util)
            except Exception:
                pass
        return used, busiest

    def close(self) -> None:
        if self._nvml is not None:
            _shutdown(self._nvml)
            self._nvml = None
        self._handles = []


def host_gpus() -> tuple[list[dict[str, Any]], str | None]:
    """The devices and the driver's version, read once; ([], None) without GPUs or when NVML fails midway."""
    nvml = Nvml()
    try:
        return (nvml.inventory(), nvml.driver_version()) if nvml.opened else ([], None)
    except Exception:
        return [], None
    finally:
        nvml.close()


def _shutdown(nvml: Any) -> None:
    try:
        nvml.nvmlShutdown()
    except Exception:
        pass


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
