"""A start-up watched from the other side of SSH: the far side writes each LaunchStatus as an event, this side
hands it to the same view a local `up` draws (report/live.py), so the live panel and the plain lines look alike.

The far side's worker (worker.py) sets report/live.py's `event_view` to an EventWriter: there every start-up view
writes events, whatever the console is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from servelab.lifecycle.launch import LaunchStatus, LaunchView
from servelab.records import Verdict


class EventWriter:
    """A LaunchView that writes what it is shown as `launch` events."""

    def __init__(self, write: Callable[..., None]):
        self._write = write

    def starting(self, title: str) -> None:
        self._write("launch", e="starting", title=title)

    def update(self, status: LaunchStatus) -> None:
        fields = dataclasses.asdict(dataclasses.replace(status, verdict=None))
        fields["verdict"] = status.verdict.model_dump(mode="json") if status.verdict is not None else None
        self._write("launch", e="update", status=fields)

    def ended(self, engine) -> None:
        info = None if engine is None else {"url": engine.url, "ready_s": engine.ready_s, "pid": engine.pid,
                                            "served_model": engine.served_model, "log_path": str(engine.log_path)}
        self._write("launch", e="ended", engine=info)



@dataclass(frozen=True)
class RemoteEngine:
    """What a view needs of an engine that is ready on the far side."""

    url: str
    ready_s: float
    pid: int
    served_model: str | None
    log_path: str


def status_of(fields: dict[str, Any]) -> LaunchStatus:
    names = {f.name for f in dataclasses.fields(LaunchStatus)}
    kept = {k: v for k, v in fields.items() if k in names}
    verdict = kept.get("verdict")
    kept["verdict"] = Verdict.model_validate(verdict) if verdict else None
    return LaunchStatus(**kept)


def replay(event: dict[str, Any], view: LaunchView, where: str) -> RemoteEngine | None:
    """Show one `launch` event on `view`; the engine when the event says it is ready."""
    what = event.get("e")
    if what == "starting":
        view.starting(f"{event.get('title', 'engine')} on {where}")
    elif what == "update" and isinstance(event.get("status"), dict):
        view.update(status_of(event["status"]))
    elif what == "ended":
        info = event.get("engine")
        # keys this side does not know are left out: a newer far side of the same protocol may add some
        names = {f.name for f in dataclasses.fields(RemoteEngine)}
        engine = (RemoteEngine(**{k: v for k, v in info.items() if k in names})
                  if isinstance(info, dict) and names <= info.keys() else None)
        view.ended(engine)  # type: ignore[arg-type]  # a view reads only url and ready_s of it
        return engine
    return None
