"""A stand-in for nvidia-ml-py's `pynvml` (checked against nvidia-ml-py 13.615.71's pynvml.py) for a machine
without an NVIDIA GPU: the same function names, signatures, return types (ctypes structures with the real field
names), constants and error classes, replaying a recorded series of per-GPU values on a clock the test controls.

A test puts tests/doubles first on sys.path, so the code under test imports this exactly as it imports the real
library, then calls `_double_load(...)`. Until then nvmlInit() fails as on a host without a driver.

The series (tests/fixtures/nvml/*.json) holds keyframes per GPU; a value holds from its keyframe to the next.
The energy counter is the integral of that stepwise power (mJ, as NVML counts it), GPM metrics are the
time-weighted mean of the keyframe values between the two samples, as the hardware counters would give.
Options: GPM unsupported (an older GPU), no energy counter, a GPU lost at a given time, an energy counter that
resets at a given time.
"""

from __future__ import annotations

import json
import string
import sys
from ctypes import (POINTER, Structure, Union, c_char_p, c_double, c_int, c_int64, c_longlong, c_uint, c_uint32,
                    c_ulong, c_ulonglong, c_ushort, pointer)
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

# Return codes, as the real module numbers them.
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_MEMORY = 20
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_UNKNOWN = 999

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_PERF_POLICY_POWER = 0
NVML_PERF_POLICY_THERMAL = 1
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_FI_DEV_RETIRED_SBE = 29
NVML_FI_DEV_RETIRED_DBE = 30
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
nvmlEventTypeXidCriticalError = 0x0000000000000008
nvmlClocksEventReasonGpuIdle = 0x0000000000000001
nvmlClocksEventReasonSwPowerCap = 0x0000000000000004
nvmlClocksEventReasonHwSlowdown = 0x0000000000000008
nvmlClocksEventReasonSwThermalSlowdown = 0x0000000000000020

NVML_GPM_METRIC_GRAPHICS_UTIL = 1
NVML_GPM_METRIC_SM_UTIL = 2
NVML_GPM_METRIC_SM_OCCUPANCY = 3
NVML_GPM_METRIC_PCIE_TX_PER_SEC = 20
NVML_GPM_METRIC_PCIE_RX_PER_SEC = 21
NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC = 60
NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC = 61
NVML_GPM_METRIC_MAX = 477
NVML_GPM_METRICS_GET_VERSION = 1
NVML_GPM_SUPPORT_VERSION = 1

_nvmlReturn_t = c_uint
_nvmlValueType_t = c_uint


class NVMLError(Exception):
    _valClassMapping: dict[int, type] = {}
    _errcode_to_string = {
        NVML_ERROR_UNINITIALIZED: "Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED: "Not Supported",
        NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
        NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
        NVML_ERROR_TIMEOUT: "Timeout",
        NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
        NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
        NVML_ERROR_GPU_IS_LOST: "GPU is lost",
        NVML_ERROR_UNKNOWN: "Unknown Error",
    }

    def __new__(typ, value):
        if typ == NVMLError:
            typ = NVMLError._valClassMapping.get(value, typ)
        obj = Exception.__new__(typ)
        obj.value = value
        return obj

    def __str__(self):
        return NVMLError._errcode_to_string.get(self.value, "NVML Error with code %d" % self.value)

    def __eq__(self, other):
        return self.value == other.value

    __hash__ = Exception.__hash__


def _make_error_classes() -> None:
    # As the real module does: NVML_ERROR_GPU_IS_LOST becomes NVMLError_GpuIsLost, and so on.
    module = sys.modules[__name__]
    for name in [n for n in dir(module) if n.startswith("NVML_ERROR_")]:
        class_name = "NVMLError_" + string.capwords(name.replace("NVML_ERROR_", ""), "_").replace("_", "")
        value = getattr(module, name)

        def new(typ, *args, _value=value):
            return NVMLError.__new__(typ, _value)

        cls = type(class_name, (NVMLError,), {"__new__": new})
        cls.__module__ = __name__
        setattr(module, class_name, cls)
        NVMLError._valClassMapping[value] = cls


_make_error_classes()


# Structures: the real field names and types.
class struct_c_nvmlDevice_t(Structure):
    _fields_ = [("_double_index", c_uint)]  # opaque in the real library


c_nvmlDevice_t = POINTER(struct_c_nvmlDevice_t)


class c_nvmlMemory_t(Structure):
    _fields_ = [("total", c_ulonglong), ("free", c_ulonglong), ("used", c_ulonglong)]


class c_nvmlUtilization_t(Structure):
    _fields_ = [("gpu", c_uint), ("memory", c_uint)]


class c_nvmlViolationTime_t(Structure):
    _fields_ = [("referenceTime", c_ulonglong), ("violationTime", c_ulonglong)]


class c_nvmlValue_t(Union):
    _fields_ = [("dVal", c_double), ("uiVal", c_uint), ("ulVal", c_ulong), ("ullVal", c_ulonglong),
                ("sllVal", c_longlong), ("siVal", c_int), ("usVal", c_ushort)]


class c_nvmlFieldValue_t(Structure):
    _fields_ = [("fieldId", c_uint32), ("scopeId", c_uint32), ("timestamp", c_int64), ("latencyUsec", c_int64),
                ("valueType", _nvmlValueType_t), ("nvmlReturn", _nvmlReturn_t), ("value", c_nvmlValue_t)]


class c_nvmlEventData_t(Structure):
    _fields_ = [("device", c_nvmlDevice_t), ("eventType", c_ulonglong), ("eventData", c_ulonglong),
                ("gpuInstanceId", c_uint), ("computeInstanceId", c_uint)]


class struct_c_nvmlEventSet_t(Structure):
    _fields_ = [("_double_id", c_uint)]


c_nvmlEventSet_t = POINTER(struct_c_nvmlEventSet_t)


class struct_c_nvmlGpmSample_t(Structure):
    _fields_ = [("_double_id", c_uint)]  # opaque in the real library


c_nvmlGpmSample_t = POINTER(struct_c_nvmlGpmSample_t)


class c_metricInfo_t(Structure):
    _fields_ = [("shortName", c_char_p), ("longName", c_char_p), ("unit", c_char_p)]


class c_nvmlGpmMetric_t(Structure):
    _fields_ = [("metricId", c_uint), ("nvmlReturn", _nvmlReturn_t), ("value", c_double),
                ("metricInfo", c_metricInfo_t)]


class c_nvmlGpmMetricsGet_t(Structure):
    _fields_ = [("version", c_uint), ("numMetrics", c_uint), ("sample1", c_nvmlGpmSample_t),
                ("sample2", c_nvmlGpmSample_t), ("metrics", c_nvmlGpmMetric_t * NVML_GPM_METRIC_MAX)]


class c_nvmlGpmSupport_t(Structure):
    _fields_ = [("version", c_uint), ("isSupportedDevice", c_uint)]


# The replayed machine.
class _Machine:
    def __init__(self, doc: dict[str, Any], clock: Callable[[], int], *, gpm: bool, energy: bool,
                 lost: dict[int, float], energy_reset: dict[int, float], driver: bool) -> None:
        self.doc = doc
        self.clock = clock
        self.gpm = gpm
        self.energy = energy
        self.lost = lost
        self.energy_reset = energy_reset
        self.driver = driver
        self.gpus = doc["gpus"]
        self.frames = doc["series"]  # [{"t_s": .., "gpus": [{...}, ...]}], ascending
        self.t0_ns = clock()
        self.inits = 0
        self.calls = 0
        self.samples: dict[int, tuple[int, int]] = {}  # sample id -> (device index, t_ns) of its last Get
        self.event_sets: dict[int, set[int]] = {}
        self.events_delivered: dict[int, int] = {}

    def now_s(self) -> float:
        return (self.clock() - self.t0_ns) / 1e9

    def frame_at(self, t_s: float) -> int:
        index = 0
        for i, frame in enumerate(self.frames):
            if frame["t_s"] <= t_s:
                index = i
            else:
                break
        return index

    def value(self, gpu: int, key: str, t_s: float | None = None) -> Any:
        t_s = self.now_s() if t_s is None else t_s
        return self.frames[self.frame_at(t_s)]["gpus"][gpu][key]

    def integral(self, gpu: int, key: str, a_s: float, b_s: float) -> float:
        """The integral of the stepwise value over [a_s, b_s] (seconds x unit)."""
        total = 0.0
        for i, frame in enumerate(self.frames):
            start = frame["t_s"]
            end = self.frames[i + 1]["t_s"] if i + 1 < len(self.frames) else float("inf")
            if i == 0:
                start = min(start, a_s)
            lo, hi = max(start, a_s), min(end, b_s)
            if hi > lo:
                total += frame["gpus"][gpu][key] * (hi - lo)
        return total

    def energy_mj(self, gpu: int) -> int:
        t = self.now_s()
        since = 0.0
        base = self.gpus[gpu].get("energy_start_mj", 0)
        reset_at = self.energy_reset.get(gpu)
        if reset_at is not None and t >= reset_at:
            since, base = reset_at, 0
        # power_w x seconds = J; the counter is mJ
        return int(base + 1000.0 * self.integral(gpu, "power_w", since, t))

    def check(self, handle: Any) -> int:
        if self.inits <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        self.calls += 1
        index = handle.contents._double_index
        lost_at = self.lost.get(index)
        if lost_at is not None and self.now_s() >= lost_at:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return index


_machine: _Machine | None = None


def _double_load(fixture: str | Path | dict, clock: Callable[[], int], *, gpm: bool = True, energy: bool = True,
                 lost: dict[int, float] | None = None, energy_reset: dict[int, float] | None = None,
                 driver: bool = True, gpus: int | None = None) -> _Machine:
    """Configure the double: the series to replay, the clock (ns) it replays on, and the options. Time 0 of the
    series is the clock's value now. `gpus` keeps only the first N devices."""
    global _machine
    doc = fixture if isinstance(fixture, dict) else json.loads(Path(fixture).read_text())
    if gpus is not None:
        doc = {**doc, "gpus": doc["gpus"][:gpus],
               "series": [{**f, "gpus": f["gpus"][:gpus]} for f in doc["series"]]}
    _machine = _Machine(doc, clock, gpm=gpm, energy=energy, lost=lost or {}, energy_reset=energy_reset or {},
                        driver=driver)
    return _machine


def _double_unload() -> None:
    global _machine
    _machine = None


def _m() -> _Machine:
    if _machine is None or _machine.inits <= 0:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    return _machine


# Functions, with the real names and signatures.
def nvmlInit():
    nvmlInitWithFlags(0)
    return None


def nvmlInitWithFlags(flags):
    if _machine is None:
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
    if not _machine.driver:
        raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED)
    _machine.inits += 1
    return None


def nvmlShutdown():
    machine = _m()
    machine.inits -= 1
    return None


def nvmlSystemGetDriverVersion():
    return _m().doc.get("driver", "560.35.03")


def nvmlDeviceGetCount():
    return len(_m().gpus)


def nvmlDeviceGetHandleByIndex(index):
    machine = _m()
    if not 0 <= index < len(machine.gpus):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return pointer(struct_c_nvmlDevice_t(index))


def nvmlDeviceGetIndex(handle):
    return _m().check(handle)


def nvmlDeviceGetName(handle):
    return _m().gpus[_m().check(handle)]["name"]


def nvmlDeviceGetUUID(handle):
    return _m().gpus[_m().check(handle)]["uuid"]


def nvmlDeviceGetMemoryInfo(handle, version=None):
    machine = _m()
    i = machine.check(handle)
    total = machine.gpus[i]["mem_total_bytes"]
    used = machine.value(i, "mem_used_bytes")
    return c_nvmlMemory_t(total=total, free=total - used, used=used)


def nvmlDeviceGetUtilizationRates(handle):
    machine = _m()
    i = machine.check(handle)
    return c_nvmlUtilization_t(gpu=machine.value(i, "util_pct"), memory=machine.value(i, "mem_util_pct"))


def nvmlDeviceGetPowerUsage(handle):
    machine = _m()
    i = machine.check(handle)
    return int(round(machine.value(i, "power_w") * 1000))  # mW


def nvmlDeviceGetTotalEnergyConsumption(handle):
    machine = _m()
    i = machine.check(handle)
    if not machine.energy:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return machine.energy_mj(i)


def nvmlDeviceGetTemperature(handle, sensor):
    machine = _m()
    i = machine.check(handle)
    if sensor != NVML_TEMPERATURE_GPU:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return int(machine.value(i, "temp_c"))


def nvmlDeviceGetClockInfo(handle, type):
    machine = _m()
    i = machine.check(handle)
    key = {NVML_CLOCK_SM: "sm_clock_mhz", NVML_CLOCK_GRAPHICS: "sm_clock_mhz", NVML_CLOCK_MEM: "mem_clock_mhz"}
    if type not in key:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return int(machine.value(i, key[type]))


def nvmlDeviceGetCurrentClocksEventReasons(handle):
    machine = _m()
    return int(machine.value(machine.check(handle), "clocks_event_reasons"))


def nvmlDeviceGetCurrentClocksThrottleReasons(handle):
    return nvmlDeviceGetCurrentClocksEventReasons(handle)


def nvmlDeviceGetViolationStatus(device, perfPolicyType):
    machine = _m()
    i = machine.check(device)
    key = {NVML_PERF_POLICY_POWER: "power_capped", NVML_PERF_POLICY_THERMAL: "thermal_capped"}[perfPolicyType]
    t = machine.now_s()
    # Violation time in ns: the time the flag (0 or 1 in the series) was up.
    return c_nvmlViolationTime_t(referenceTime=int(t * 1e6), violationTime=int(machine.integral(i, key, 0.0, t) * 1e9))


def nvmlDeviceGetPcieThroughput(device, counter):
    machine = _m()
    i = machine.check(device)
    key = {NVML_PCIE_UTIL_TX_BYTES: "pcie_tx_mib_s", NVML_PCIE_UTIL_RX_BYTES: "pcie_rx_mib_s"}[counter]
    return int(machine.value(i, key) * 1024)  # KB/s


def nvmlDeviceGetFieldValues(handle, fieldIds):
    machine = _m()
    i = machine.check(handle)
    values = (c_nvmlFieldValue_t * len(fieldIds))()
    for slot, field in zip(values, fieldIds):
        slot.fieldId = field
        slot.timestamp = int(machine.now_s() * 1e6)
        if field in (NVML_FI_DEV_RETIRED_SBE, NVML_FI_DEV_RETIRED_DBE):
            slot.valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            slot.nvmlReturn = NVML_SUCCESS
            slot.value.ullVal = machine.gpus[i].get("retired_sbe" if field == NVML_FI_DEV_RETIRED_SBE
                                                    else "retired_dbe", 0)
        else:
            slot.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
    return values


def _processes(handle, key):
    machine = _m()
    i = machine.check(handle)
    return [SimpleNamespace(pid=p["pid"], usedGpuMemory=p.get("used_bytes"), gpuInstanceId=0xFFFFFFFF,
                            computeInstanceId=0xFFFFFFFF)
            for p in machine.value(i, "processes") if p.get("kind", "compute") == key]


def nvmlDeviceGetComputeRunningProcesses(handle):
    return _processes(handle, "compute")


def nvmlDeviceGetGraphicsRunningProcesses(handle):
    return _processes(handle, "graphics")


def nvmlEventSetCreate():
    machine = _m()
    set_id = len(machine.event_sets) + 1
    machine.event_sets[set_id] = set()
    machine.events_delivered[set_id] = 0
    return pointer(struct_c_nvmlEventSet_t(set_id))


def nvmlDeviceRegisterEvents(handle, eventTypes, eventSet):
    machine = _m()
    i = machine.check(handle)
    if not eventTypes & nvmlEventTypeXidCriticalError:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    machine.event_sets[eventSet.contents._double_id].add(i)
    return None


def nvmlEventSetWait_v2(eventSet, timeoutms):
    machine = _m()
    set_id = eventSet.contents._double_id
    now = machine.now_s()
    due = [e for e in machine.doc.get("xid_events", [])
           if e["t_s"] <= now and e["gpu"] in machine.event_sets[set_id]]
    delivered = machine.events_delivered[set_id]
    if delivered >= len(due):
        raise NVMLError(NVML_ERROR_TIMEOUT)  # the real call waits timeoutms first; the tests wait 0
    event = due[delivered]
    machine.events_delivered[set_id] = delivered + 1
    return c_nvmlEventData_t(device=pointer(struct_c_nvmlDevice_t(event["gpu"])),
                             eventType=nvmlEventTypeXidCriticalError, eventData=event["xid"])


def nvmlEventSetWait(eventSet, timeoutms):
    return nvmlEventSetWait_v2(eventSet, timeoutms)


def nvmlEventSetFree(eventSet):
    _m().event_sets.pop(eventSet.contents._double_id, None)
    return None


def nvmlGpmQueryDeviceSupport(device):
    machine = _m()
    machine.check(device)
    support = c_nvmlGpmSupport_t()
    support.version = NVML_GPM_SUPPORT_VERSION
    support.isSupportedDevice = 1 if machine.gpm else 0
    return support


def nvmlGpmSampleAlloc():
    machine = _m()
    sample_id = len(machine.samples) + 1
    machine.samples[sample_id] = (-1, -1)
    return pointer(struct_c_nvmlGpmSample_t(sample_id))


def nvmlGpmSampleFree(gpmSample):
    _m().samples.pop(gpmSample.contents._double_id, None)
    return None


def nvmlGpmSampleGet(device, gpmSample):
    machine = _m()
    i = machine.check(device)
    if not machine.gpm:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    machine.samples[gpmSample.contents._double_id] = (i, machine.clock())
    return gpmSample


_GPM_KEYS = {NVML_GPM_METRIC_SM_UTIL: "sm_util_pct", NVML_GPM_METRIC_SM_OCCUPANCY: "sm_occupancy_pct",
             NVML_GPM_METRIC_GRAPHICS_UTIL: "util_pct", NVML_GPM_METRIC_PCIE_TX_PER_SEC: "pcie_tx_mib_s",
             NVML_GPM_METRIC_PCIE_RX_PER_SEC: "pcie_rx_mib_s",
             NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: "nvlink_tx_mib_s",
             NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: "nvlink_rx_mib_s"}


def nvmlGpmMetricsGet(metricsGet):
    machine = _m()
    if metricsGet.version != NVML_GPM_METRICS_GET_VERSION:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    dev1, t1 = machine.samples[metricsGet.sample1.contents._double_id]
    dev2, t2 = machine.samples[metricsGet.sample2.contents._double_id]
    if dev1 != dev2 or dev1 < 0 or t2 <= t1:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    a, b = (t1 - machine.t0_ns) / 1e9, (t2 - machine.t0_ns) / 1e9
    for k in range(metricsGet.numMetrics):
        metric = metricsGet.metrics[k]
        key = _GPM_KEYS.get(metric.metricId)
        if key is None:
            metric.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
            continue
        metric.nvmlReturn = NVML_SUCCESS
        metric.value = machine.integral(dev1, key, a, b) / (b - a)
    return metricsGet
