"""Engine lifecycle: supervise the process, follow its start-up phases and liveness evidence, decide when it is
ready, stalled or dead."""

from servelab.lifecycle.launch import LaunchStatus, RunningEngine, start_engine
from servelab.lifecycle.phases import LogTailer, PhaseTracker
from servelab.lifecycle.supervisor import SupervisedProcess, start_process

__all__ = ["LaunchStatus", "LogTailer", "PhaseTracker", "RunningEngine", "SupervisedProcess", "start_engine",
           "start_process"]
