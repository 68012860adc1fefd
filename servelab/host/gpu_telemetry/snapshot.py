"""One look at the host's GPUs, for a diagnosis (`servelab doctor`): each device's memory, SM activity, power and
temperature, and whether the engine's processes hold it.

The sampler (sampler.py) is for a measurement over time; a diagnosis wants one reading at the moment it judges.
The source is the sampler's (`open_source`), opened and closed here. Without one the snapshot says why in one line
("not measured: no GPU telemetry source (...)"), never a table of blanks.
"""

from __future__ import annotations

from collections.abc import Iterable

from servelab.records import GpuReading


def gpu_snapshot(urls: Iterable[str] = (), local: bool = True) -> tuple[list[GpuReading], str | None]:
    """The readings of every GPU the first source that answers has, and None; or [] and why there are none."""
    from servelab.host.gpu_telemetry import open_source

    source, why = open_source(list(urls), local=local)
    if source is None:
        return [], why or "not measured: no GPU telemetry source"
    try:
        readings = source.read()
    except Exception as exc:  # telemetry is evidence beside the verdict, never a reason to lose it
        return [], f"not measured: {source.name} failed to answer ({type(exc).__name__}: {exc})"
    finally:
        source.close()
    if not readings:
        return [], f"not measured: {source.name} answered with no GPU"
    return readings, None


def held_by(reading: GpuReading, pids: set[int]) -> bool | None:
    """Whether any of `pids` holds the GPU; None when the source does not say who holds it or no pid is known."""
    if not pids or not reading.processes and reading.mem_used_bytes is None:
        return None
    return bool(pids & set(reading.processes))
