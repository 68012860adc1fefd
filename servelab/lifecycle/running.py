"""An engine that answered its readiness probe: its URL, timeline, evidence, lint and provenance; stopping it."""

from __future__ import annotations

from typing import Any

from servelab.engines.base import EngineAdapter, EngineSpec, Launch
from servelab.lifecycle.diagnose import crashed_verdict
from servelab.lifecycle.phases import PhaseTracker
from servelab.lifecycle.probe import ProbeReading
from servelab.lifecycle.readback import lint_all, log_lines_for_lint, read_runtime_config
from servelab.lifecycle.supervisor import SupervisedProcess
from servelab.provenance import build_provenance, relevant_env
from servelab.records import EvidenceSample, LaunchResult, LintFinding, Phase, Provenance, Verdict

LOG_TAIL_LINES = 20


class RunningEngine:
    """An engine that answered its readiness probe. A context manager: leaving the block stops it."""

    def __init__(self, *, spec: EngineSpec, adapter: EngineAdapter, launch: Launch, process: SupervisedProcess,
                 tracker: PhaseTracker, started_at: str, ready_s: float, ready_probe: ProbeReading,
                 evidence: list[EvidenceSample] | None = None, verdicts: list[Verdict] | None = None):
        self.spec = spec
        self.adapter = adapter
        self.launch = launch
        self.process = process
        self.url = launch.url
        self.served_model = launch.served_model
        self.log_path = process.log_path
        self.pid = process.pid
        self.ready_s = ready_s
        self.started_at = started_at
        self.evidence: list[EvidenceSample] = evidence or []  # the samples taken while it started
        self.verdicts: list[Verdict] = verdicts or []  # each change of verdict state during start-up
        self._tracker = tracker
        self._ready_probe = ready_probe
        self._stopped = False
        self._runtime_config: dict[str, Any] | None = None

    @property
    def phases(self) -> list[Phase]:
        return self._tracker.phases

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def runtime_config(self) -> dict[str, Any] | None:
        """What the running server says it was started with (the first of the adapter's config paths to answer)."""
        if self._runtime_config is None and self.alive and self.adapter.config_paths:
            self._runtime_config = read_runtime_config(self.url, self.adapter)
        return self._runtime_config

    def lint(self) -> list[LintFinding]:
        """Command line, runtime config and the log so far: call it again after a benchmark to catch decode lines."""
        lines = log_lines_for_lint(self.log_path, self.process.log_offset)
        return lint_all(self.adapter, self.spec, self.launch.command, self.runtime_config(), lines)

    def result(self) -> LaunchResult:
        evidence: dict[str, Any] = {
            "probe": f"GET {self.adapter.probe_path}", "probe_status": self._ready_probe.http_status,
            "ready_line_s": self._tracker.ready_line_s, "port_answered_s": self._tracker.port_answered_s,
            "pid": self.pid, "samples": len(self.evidence),
        }
        if self.evidence:
            last = self.evidence[-1]
            # Idle threads are normal for a ready server: recorded, never held against it.
            evidence.update(threads=last.threads, thread_states=last.thread_states,
                            threads_in_futex=last.threads_in_futex, processes=last.processes,
                            rss_bytes=last.rss_bytes, gpu_memory_bytes=last.gpu_memory_bytes)
        if self.alive or self._stopped:
            verdict = Verdict(state="ready", reason=f"{self.adapter.probe_path} answered "
                                                    f"{self._ready_probe.http_status} after {self.ready_s:.2f} s",
                              evidence={**evidence, "stopped_by_servelab": self._stopped})
        else:
            verdict = crashed_verdict(self.process.returncode, "ready", self.process.log_tail(LOG_TAIL_LINES),
                                      when="after start-up")
            verdict.reason = f"the engine died after start-up ({self.process.describe_exit()})"
            verdict.evidence.update(evidence)
        return LaunchResult(engine=self.adapter.name, url=self.url, ready_s=self.ready_s, phases=self.phases,
                            verdict=verdict, log_path=str(self.log_path), lint=self.lint())

    def provenance(self) -> Provenance:
        return launch_provenance(self.spec, self.adapter, self.launch, self.started_at, engine_pids=[self.pid])

    def stop(self, grace_s: float = 10.0) -> int | None:
        self._stopped = True
        return self.process.stop(grace_s)

    def __enter__(self) -> RunningEngine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def launch_provenance(spec: EngineSpec, adapter: EngineAdapter, launch: Launch, started_at: str,
                      engine_pids: list[int] | None = None) -> Provenance:
    return build_provenance(
        engine=adapter.name, engine_version=adapter.version(), command=launch.command,
        env=relevant_env(launch.env), model=spec.model, model_path=launch.model_path,
        model_size_bytes=launch.extra.get("model_size_bytes"), model_format=launch.extra.get("model_format"),
        started_at=started_at, engine_pids=engine_pids or ())
