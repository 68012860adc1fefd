"""Hints from a level's GPU telemetry (docs/metrics.md#gpu-hints): a level that kept many streams in flight while
the engine's GPUs were barely busy, or left them idle between steps, points at how the engine was set up. Where
the engine's own lint (engines/sglang.py, engines/vllm.py) found a setting that explains it, the hint names that
finding instead of guessing. Pure: a summary, a concurrency and findings in, sentences out.
"""

from __future__ import annotations

from collections.abc import Sequence

from servelab.records import GpuSummary, LintFinding

HIGH_CONCURRENCY = 16  # streams: at this many, a working engine batches enough to keep its SMs busy
LOW_SM_PCT = 50.0  # mean SM activity of the engine's GPUs under this at high concurrency is a hint
IDLE_SHARE_LIMIT = 0.2  # idle in this share of the readings while requests were in flight is a hint

# The engines' lint settings that turn CUDA graphs off (every decode step then pays its kernel launches) or make
# the scheduler wait for the CPU: SGLang's flags and decode log line, vLLM's flags and compilation config.
GRAPH_SETTINGS = ("--disable-cuda-graph", "cuda graph: False (decode log)", "--enforce-eager", "-O0",
                  "cudagraph_mode=NONE")
SCHEDULER_SETTINGS = ("--disable-overlap-schedule",)

# What the SM figure is called, by what the source read (docs/metrics.md#gpu-sm-activity).
_SM_LABEL = {"gpm": "SM activity", "dcgm_prof": "SM activity"}


def gpu_hints(summary: GpuSummary, concurrency: int | None, findings: Sequence[LintFinding] = ()) -> list[str]:
    """The hints for one level: its GpuSummary, its concurrency (streams; None for an open-loop level, where idle
    time can be the schedule's) and the engine's lint findings. Empty when nothing stands out or the GPUs were
    not measured."""
    if not summary.measured:
        return []
    hints: list[str] = []
    explained = _explanation(findings)
    sm = summary.sm_active_pct_mean
    at = f"c={concurrency}" if concurrency is not None else "this load"
    if sm is not None and concurrency is not None and concurrency >= HIGH_CONCURRENCY and sm < LOW_SM_PCT:
        hints.append(f"{_sm_label(summary)} {sm:.0f} % at {at}: " + (explained or
                     "CUDA graphs off or a CPU-bound scheduler?"))
    idle = summary.idle_share
    if idle is not None and concurrency is not None and concurrency >= 1 and idle >= IDLE_SHARE_LIMIT:
        hints.append(f"the engine's GPUs were idle in {idle:.0%} of their readings at {at} while requests were in "
                     f"flight: " + (explained or "decode waits between steps (CUDA graphs off, the scheduler or "
                                                 "the CPU)?"))
    return hints


def _sm_label(summary: GpuSummary) -> str:
    sources = {s for g in summary.gpus if g.engine and g.sm_source for s in g.sm_source.split(",")}
    labels = {_SM_LABEL.get(s, "GPU utilisation") for s in sources}
    return labels.pop() if len(labels) == 1 else "SM activity"


def _explanation(findings: Sequence[LintFinding]) -> str | None:
    """The engine's own findings that explain idle SMs, as the end of a hint."""
    graphs = [f for f in findings if f.setting in GRAPH_SETTINGS]
    scheduler = [f for f in findings if f.setting in SCHEDULER_SETTINGS]
    parts = []
    if graphs:
        parts.append("the engine runs without CUDA graphs (" + ", ".join(f.setting for f in graphs)
                     + "): every decode step pays its kernel launches")
    if scheduler:
        parts.append("the scheduler does not overlap the GPU (" + ", ".join(f.setting for f in scheduler) + ")")
    return "; ".join(parts) + ", as the engine's lint says" if parts else None
