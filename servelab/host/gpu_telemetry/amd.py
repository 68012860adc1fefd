"""GPU telemetry from AMD GPUs through amdsmi (ROCm's Python binding), where it is importable.

Per GPU: GFX activity (amdsmi_get_gpu_activity, %), socket power (amdsmi_get_power_info, W), the energy
accumulator (amdsmi_get_energy_count: ticks x counter_resolution in uJ, kept here in mJ), the edge temperature,
VRAM used and total, GFX and memory clocks. Untested without an AMD GPU beyond "not importable -> None"; every
read is best effort and a field that fails is left None.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from servelab.records import GpuReading


class AmdSmiSource:
    def __init__(self, amdsmi: Any, handles: list[Any], clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self.name = "amdsmi"
        self._smi = amdsmi
        self._handles = handles
        self._clock = clock
        self._fixed = [self._fixed_facts(h) for h in handles]

    def take_notes(self) -> list[str]:
        return []

    def _fixed_facts(self, handle: Any) -> dict[str, Any]:
        smi = self._smi
        return {"uuid": _try(lambda: smi.amdsmi_get_gpu_device_uuid(handle)),
                "name": _try(lambda: smi.amdsmi_get_gpu_asic_info(handle)["market_name"]),
                "mem_total_bytes": _try(lambda: int(smi.amdsmi_get_gpu_memory_total(
                    handle, smi.AmdSmiMemoryType.VRAM)))}

    def read(self) -> list[GpuReading]:
        smi = self._smi
        readings = []
        for index, (handle, fixed) in enumerate(zip(self._handles, self._fixed)):
            t_ns = self._clock()
            activity = _try(lambda: smi.amdsmi_get_gpu_activity(handle)["gfx_activity"])
            power = _try(lambda: smi.amdsmi_get_power_info(handle))
            watts = None
            if isinstance(power, dict):
                for key in ("current_socket_power", "average_socket_power"):
                    if isinstance(power.get(key), (int, float)):
                        watts = float(power[key])
                        break
            energy = _try(lambda: smi.amdsmi_get_energy_count(handle))
            energy_mj = None
            if isinstance(energy, dict):
                ticks = energy.get("energy_accumulator", energy.get("power"))
                resolution = energy.get("counter_resolution")
                if isinstance(ticks, (int, float)) and isinstance(resolution, (int, float)):
                    energy_mj = ticks * resolution / 1000.0  # uJ -> mJ
            temp = _try(lambda: smi.amdsmi_get_temp_metric(handle, smi.AmdSmiTemperatureType.EDGE,
                                                           smi.AmdSmiTemperatureMetric.CURRENT))
            used = _try(lambda: smi.amdsmi_get_gpu_memory_usage(handle, smi.AmdSmiMemoryType.VRAM))
            gfx = _try(lambda: smi.amdsmi_get_clock_info(handle, smi.AmdSmiClkType.GFX)["clk"])
            mem = _try(lambda: smi.amdsmi_get_clock_info(handle, smi.AmdSmiClkType.MEM)["clk"])
            readings.append(GpuReading(
                t_ns=t_ns, gpu=index, uuid=fixed["uuid"], name=fixed["name"],
                sm_active_pct=_num(activity), sm_source="amdsmi" if _num(activity) is not None else None,
                mem_used_bytes=int(used) if _num(used) is not None else None,
                mem_total_bytes=fixed["mem_total_bytes"], power_w=watts, energy_mj=energy_mj,
                temp_c=_num(temp), sm_clock_mhz=_num(gfx), mem_clock_mhz=_num(mem)))
        return readings

    def close(self) -> None:
        _try(self._smi.amdsmi_shut_down)


def open_amdsmi() -> tuple[AmdSmiSource | None, str]:
    """The amdsmi source, or None and why not ("no amdsmi")."""
    try:
        import amdsmi  # ROCm's binding; optional, never a dependency
    except Exception:
        return None, "no amdsmi"
    try:
        amdsmi.amdsmi_init()
    except Exception as exc:
        return None, f"amdsmi did not start ({' '.join(str(exc).split())[:120]})"
    handles = _try(amdsmi.amdsmi_get_processor_handles) or []
    if not handles:
        _try(amdsmi.amdsmi_shut_down)
        return None, "amdsmi sees no GPU"
    return AmdSmiSource(amdsmi, list(handles)), ""


def _try(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception:
        return None


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
