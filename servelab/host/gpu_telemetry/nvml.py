"""The one module that talks to NVML (the optional nvidia-ml-py, `import pynvml`): the session everyone opens
(`Nvml`: what the host has for provenance, utilisation for the environment sampler, an engine's GPU memory for
start-up evidence) and the telemetry source (`NvmlSource`) the GPU sampler reads every tick.

Without the library or a driver (an ordinary CPU host) a session opens empty and every read says nothing, at no
cost. Each reading is best effort: a device that cannot answer one question still answers the others.

What one tick reads per device, and why that way:
- SM activity: GPM's SM utilisation (the share of SMs busy between two GPM samples, what DCGM calls SM_ACTIVE)
  where the GPU supports GPM (Hopper and newer); otherwise nvmlDeviceGetUtilizationRates().gpu, which only says a
  kernel ran at some point in the driver's sample period and reads 100 % for a GPU that is mostly idle.
  The previous GPM sample is kept, so each tick costs one sample and one metrics call.
- PCIe and NVLink throughput from the same GPM call (MiB/s). nvmlDeviceGetPcieThroughput is not read per tick
  without GPM: each call samples the bus for ~20 ms, 320 ms a tick on 8 GPUs (`pcie_fallback=True` reads it).
- XID errors: an NVML event set registered once for critical XID events, drained without waiting (timeout 0)
  each tick: a cheap counter of XIDs seen since the sampler opened, and the last XID code. Retired pages (single
  and double bit) come from one nvmlDeviceGetFieldValues call.
- Power (mW -> W), the total-energy counter (mJ), temperature, SM and memory clocks, the clocks-event
  (throttle) reasons bitmask, power + thermal violation time (ns), memory used, and the pids of the compute
  processes holding the device. Graphics-only processes (a display server, a desktop) are left out: they do not
  compete with an engine for the SMs, and would make every level on a workstation's GPU contended.
A field the device answers NotSupported is remembered and not asked again; a GPU that is lost is dropped, with a
note that says so.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from servelab.records import GpuReading

# GPM metrics read in one call; the order is the index into the metrics array.
_GPM_METRICS = ("NVML_GPM_METRIC_SM_UTIL", "NVML_GPM_METRIC_PCIE_TX_PER_SEC", "NVML_GPM_METRIC_PCIE_RX_PER_SEC",
                "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC", "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC")
_MIB = 2**20
_XID_DRAIN_MAX = 64  # events taken per tick at most: a storm of XIDs must not stall the sampler


class Nvml:
    """One NVML session: opened once, read as often as needed, closed once."""

    def __init__(self, enabled: bool = True) -> None:
        self._nvml: Any = None
        self._handles: list[Any] = []
        self.why_not: str = "NVML not asked"
        if not enabled:
            return
        try:
            import pynvml  # nvidia-ml-py; optional (pip install 'servelab[gpu]')
        except ImportError:
            self.why_not = "no nvidia-ml-py"
            return
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # no driver, no device: an ordinary CPU host
            self.why_not = f"no NVIDIA driver ({_one_line(exc)})"
            return
        try:
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self._nvml = pynvml
            self.why_not = "" if self._handles else "NVML sees no GPU"
        except Exception as exc:
            self._handles = []
            self.why_not = f"NVML could not list the GPUs ({_one_line(exc)})"
            _shutdown(pynvml)

    @property
    def opened(self) -> bool:
        """NVML answered (a driver is present), whether or not it has devices."""
        return self._nvml is not None

    @property
    def available(self) -> bool:
        return bool(self._handles)

    @property
    def library(self) -> Any:
        """The pynvml module of this session (None when closed or never opened)."""
        return self._nvml

    @property
    def handles(self) -> list[Any]:
        return list(self._handles)

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


class _Lost(Exception):
    pass


class _Device:
    """What is kept per device between ticks: its handle, its fixed facts, the GPM samples, what it lacks."""

    def __init__(self, index: int, handle: Any) -> None:
        self.index = index
        self.handle = handle
        self.uuid: str | None = None
        self.name: str | None = None
        self.mem_total: int | None = None
        self.unsupported: set[str] = set()
        self.gpm: Any = None  # the reusable metrics-get structure, when GPM works
        self.gpm_prev: Any = None
        self.gpm_cur: Any = None
        self.xid_registered = False
        self.xid_count = 0
        self.xid_last: int | None = None


class NvmlSource:
    """GPU telemetry through NVML: `read()` gives one GpuReading per device still answering."""

    def __init__(self, session: Nvml, clock: Callable[[], int] = time.perf_counter_ns,
                 pcie_fallback: bool = False) -> None:
        if not session.available:
            raise ValueError(f"NVML is not available: {session.why_not}")
        self.name = "nvml"
        self._session = session
        self._nvml = session.library
        self._clock = clock
        self._pcie_fallback = pcie_fallback
        self._notes: list[str] = []
        nvml = self._nvml
        self._not_supported = _error_classes(nvml, "NVMLError_NotSupported", "NVMLError_FunctionNotFound")
        self._lost = _error_classes(nvml, "NVMLError_GpuIsLost")
        self._devices = [_Device(i, h) for i, h in enumerate(session.handles)]
        self._events: Any = None
        try:
            self._events = nvml.nvmlEventSetCreate()
        except Exception:
            self._events = None
        for device in list(self._devices):
            try:
                self._open_device(device)
            except _Lost:
                self._drop(device)

    @property
    def devices(self) -> int:
        return len(self._devices)

    def take_notes(self) -> list[str]:
        """Notes since the last call (a GPU lost, an XID), each one line, for the series file."""
        notes, self._notes = self._notes, []
        return notes

    def _open_device(self, device: _Device) -> None:
        nvml = self._nvml
        handle = device.handle
        name = self._ask(device, "name", lambda: nvml.nvmlDeviceGetName(handle))
        device.name = _text(name) if name is not None else None
        uuid = self._ask(device, "uuid", lambda: nvml.nvmlDeviceGetUUID(handle))
        device.uuid = _text(uuid) if uuid is not None else None
        memory = self._ask(device, "memory", lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        device.mem_total = int(memory.total) if memory is not None else None
        support = self._ask(device, "gpm", lambda: nvml.nvmlGpmQueryDeviceSupport(handle))
        if support is not None and support.isSupportedDevice:
            try:
                ids = [getattr(nvml, name) for name in _GPM_METRICS]
                device.gpm_prev = nvml.nvmlGpmSampleAlloc()
                device.gpm_cur = nvml.nvmlGpmSampleAlloc()
                nvml.nvmlGpmSampleGet(handle, device.gpm_prev)  # the first tick's delta starts here
                metrics = nvml.c_nvmlGpmMetricsGet_t()
                metrics.version = nvml.NVML_GPM_METRICS_GET_VERSION
                metrics.numMetrics = len(ids)
                for k, metric_id in enumerate(ids):
                    metrics.metrics[k].metricId = metric_id
                device.gpm = metrics
            except self._lost:
                raise _Lost()
            except Exception:
                device.gpm = None
                device.unsupported.add("gpm")
        if self._events is not None:
            try:
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, self._events)
                device.xid_registered = True
            except self._lost:
                raise _Lost()
            except Exception:
                device.xid_registered = False

    def _ask(self, device: _Device, field: str, call: Callable[[], Any]) -> Any:
        """One best-effort read: None when it fails; NotSupported is remembered, a lost GPU raises _Lost."""
        if field in device.unsupported:
            return None
        try:
            return call()
        except self._lost:
            raise _Lost()
        except self._not_supported:
            device.unsupported.add(field)
            return None
        except Exception:
            return None

    def read(self) -> list[GpuReading]:
        self._drain_xid_events()
        readings: list[GpuReading] = []
        for device in list(self._devices):
            try:
                readings.append(self._read_device(device))
            except _Lost:
                self._drop(device)
        return readings

    def _read_device(self, device: _Device) -> GpuReading:
        nvml = self._nvml
        h = device.handle
        ask = self._ask
        t_ns = self._clock()
        sm_pct: float | None = None
        sm_source: str | None = None
        pcie_tx = pcie_rx = nvlink_tx = nvlink_rx = None
        if device.gpm is not None:
            values = ask(device, "gpm", lambda: self._gpm_values(device))
            if values is not None:
                sm_pct, pcie_tx, pcie_rx, nvlink_tx, nvlink_rx = values
                sm_source = "gpm" if sm_pct is not None else None
        utilization = ask(device, "utilization", lambda: nvml.nvmlDeviceGetUtilizationRates(h))
        if sm_pct is None and utilization is not None:
            sm_pct, sm_source = float(utilization.gpu), "utilization"
        if pcie_tx is None and self._pcie_fallback:
            tx = ask(device, "pcie", lambda: nvml.nvmlDeviceGetPcieThroughput(h, nvml.NVML_PCIE_UTIL_TX_BYTES))
            rx = ask(device, "pcie", lambda: nvml.nvmlDeviceGetPcieThroughput(h, nvml.NVML_PCIE_UTIL_RX_BYTES))
            pcie_tx = tx * 1024.0 if tx is not None else None  # KB/s
            pcie_rx = rx * 1024.0 if rx is not None else None
        memory = ask(device, "memory", lambda: nvml.nvmlDeviceGetMemoryInfo(h))
        power_mw = ask(device, "power", lambda: nvml.nvmlDeviceGetPowerUsage(h))
        energy = ask(device, "energy", lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(h))
        temp = ask(device, "temp", lambda: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU))
        sm_clock = ask(device, "sm_clock", lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM))
        mem_clock = ask(device, "mem_clock", lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM))
        reasons = ask(device, "clocks_event", lambda: nvml.nvmlDeviceGetCurrentClocksEventReasons(h))
        if reasons is None:
            reasons = ask(device, "clocks_throttle", lambda: nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h))
        power_v = ask(device, "violation_power",
                      lambda: nvml.nvmlDeviceGetViolationStatus(h, nvml.NVML_PERF_POLICY_POWER))
        thermal_v = ask(device, "violation_thermal",
                        lambda: nvml.nvmlDeviceGetViolationStatus(h, nvml.NVML_PERF_POLICY_THERMAL))
        violation = None
        if power_v is not None or thermal_v is not None:
            violation = sum(int(v.violationTime) for v in (power_v, thermal_v) if v is not None)
        retired = ask(device, "retired", lambda: self._retired_pages(device))
        pids = {int(proc.pid) for proc in ask(device, "compute", lambda: nvml.nvmlDeviceGetComputeRunningProcesses(h))
                or ()}
        return GpuReading(
            t_ns=t_ns, gpu=device.index, uuid=device.uuid, name=device.name, sm_active_pct=sm_pct,
            sm_source=sm_source, mem_used_bytes=int(memory.used) if memory is not None else None,
            mem_total_bytes=device.mem_total if device.mem_total is not None
            else (int(memory.total) if memory is not None else None),
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            energy_mj=float(energy) if energy is not None else None,
            temp_c=float(temp) if temp is not None else None,
            sm_clock_mhz=float(sm_clock) if sm_clock is not None else None,
            mem_clock_mhz=float(mem_clock) if mem_clock is not None else None,
            throttle_reasons=int(reasons) if reasons is not None else None, throttle_ns=violation,
            xid_errors=device.xid_count if device.xid_registered else None, xid_last=device.xid_last,
            retired_pages=retired, pcie_tx_bytes_s=pcie_tx, pcie_rx_bytes_s=pcie_rx,
            nvlink_tx_bytes_s=nvlink_tx, nvlink_rx_bytes_s=nvlink_rx, processes=tuple(sorted(pids)))

    def _gpm_values(self, device: _Device) -> tuple[float | None, ...]:
        nvml = self._nvml
        nvml.nvmlGpmSampleGet(device.handle, device.gpm_cur)
        metrics = device.gpm
        metrics.sample1 = device.gpm_prev
        metrics.sample2 = device.gpm_cur
        nvml.nvmlGpmMetricsGet(metrics)
        device.gpm_prev, device.gpm_cur = device.gpm_cur, device.gpm_prev
        out: list[float | None] = []
        for k in range(len(_GPM_METRICS)):
            metric = metrics.metrics[k]
            ok = metric.nvmlReturn == nvml.NVML_SUCCESS
            value = float(metric.value) if ok else None
            out.append(value if k == 0 or value is None else value * _MIB)  # throughput: MiB/s -> bytes/s
        return tuple(out)

    def _retired_pages(self, device: _Device) -> int | None:
        nvml = self._nvml
        values = nvml.nvmlDeviceGetFieldValues(device.handle,
                                               [nvml.NVML_FI_DEV_RETIRED_SBE, nvml.NVML_FI_DEV_RETIRED_DBE])
        counts = [int(v.value.ullVal) for v in values if v.nvmlReturn == nvml.NVML_SUCCESS]
        if not counts:
            device.unsupported.add("retired")
            return None
        return sum(counts)

    def _drain_xid_events(self) -> None:
        if self._events is None:
            return
        nvml = self._nvml
        by_index = {d.index: d for d in self._devices}
        for _ in range(_XID_DRAIN_MAX):
            try:
                event = nvml.nvmlEventSetWait_v2(self._events, 0)
            except Exception:  # NVMLError_Timeout: nothing pending
                return
            try:
                index = int(nvml.nvmlDeviceGetIndex(event.device))
            except Exception:
                continue
            device = by_index.get(index)
            if device is None:
                continue
            device.xid_count += 1
            device.xid_last = int(event.eventData)
            self._notes.append(f"XID {device.xid_last} on GPU {index}"
                               f"{f' ({device.uuid})' if device.uuid else ''}: the driver reported a GPU error")

    def _drop(self, device: _Device) -> None:
        self._devices.remove(device)
        self._notes.append(f"GPU {device.index}{f' ({device.uuid})' if device.uuid else ''} is lost "
                           f"(NVML: GPU is lost): no longer sampled; whatever ran on it has likely failed")
        for sample in (device.gpm_prev, device.gpm_cur):
            _quietly(lambda sample=sample: self._nvml.nvmlGpmSampleFree(sample))

    def close(self) -> None:
        nvml = self._nvml
        if nvml is None:
            return
        for device in self._devices:
            for sample in (device.gpm_prev, device.gpm_cur):
                if sample is not None:
                    _quietly(lambda sample=sample: nvml.nvmlGpmSampleFree(sample))
        if self._events is not None:
            _quietly(lambda: nvml.nvmlEventSetFree(self._events))
        self._devices = []
        self._nvml = None
        self._session.close()


def open_nvml(clock: Callable[[], int] = time.perf_counter_ns) -> tuple[NvmlSource | None, str]:
    """The NVML source, or None and why not in a few words ("no NVIDIA driver (...)")."""
    session = Nvml()
    if not session.available:
        why = session.why_not
        session.close()
        return None, why
    try:
        return NvmlSource(session, clock=clock), ""
    except Exception as exc:
        session.close()
        return None, f"NVML failed ({_one_line(exc)})"


def _error_classes(nvml: Any, *names: str) -> tuple[type[BaseException], ...]:
    found = tuple(c for c in (getattr(nvml, n, None) for n in names) if isinstance(c, type))
    return found or (_Never,)


class _Never(Exception):
    """Stands for an error class the library does not define: never raised, never caught."""


def _quietly(call: Callable[[], Any]) -> None:
    try:
        call()
    except Exception:
        pass


def _shutdown(nvml: Any) -> None:
    _quietly(nvml.nvmlShutdown)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:160]
