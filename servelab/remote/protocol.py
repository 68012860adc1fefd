"""What passes between the two sides: JSON lines in the far side's events file, forwarded as they are.

One object per line, ASCII only (so a line's byte count is its length plus one, which is how `follow --offset`
resumes exactly where a dropped connection left off), each with a kind `k`:

    {"k": "out", "s": "…"}                      a line the command wrote on its standard output
    {"k": "err", "s": "…"}                      … on its standard error
    {"k": "launch", "e": "starting", "title": "…"}   a start-up, for the live view (events_view.py)
    {"k": "launch", "e": "update", "status": {…}}
    {"k": "launch", "e": "ended", "engine": {…} | null}
    {"k": "exit", "code": N}                    the command ended with exit status N: always the last line

`follow` adds lines of its own that are not in the file: {"k": "job", "on_disconnect": …, "grace_s": …} first (the
job's policy, for a controller that did not start it), {"k": "beat"} every BEAT_S (a connection that carries
nothing for longer is dead), {"k": "lost", "why": "…"} when the far side's worker ended without its exit line.

The other way, on `follow`'s stdin, the controller writes a line "alive" twice a second (only these keep the
job's controller.alive fresh: a follower can outlive its controller on a link gone silent) and "stop" per Ctrl-C.

Compatibility: the two sides must speak the same PROTOCOL. servelab versions that differ but share it work
together (a warning says so); a different PROTOCOL is refused with what to upgrade. PROTOCOL changes whenever a
line's meaning or the agent's command line changes in a way the other side cannot read.
"""

from __future__ import annotations

import json
from typing import Any

PROTOCOL = 1
BEAT_S = 2.0


def encode(kind: str, **fields: Any) -> str:
    return json.dumps({"k": kind, **fields}, ensure_ascii=True, separators=(",", ":"), default=str)


def decode(line: bytes | str) -> dict[str, Any] | None:
    """An event, or None for a line that is not one (a torn last line, noise on the channel)."""
    try:
        obj = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    return obj if isinstance(obj, dict) and isinstance(obj.get("k"), str) else None


def compatibility(local_version: str, hello: dict[str, Any]) -> tuple[bool, str | None]:
    """(usable, message): whether the far side can be driven, and the warning or refusal to print."""
    theirs = hello.get("protocol")
    remote_version = hello.get("version", "unknown")
    if theirs != PROTOCOL:
        older = "the remote host's" if isinstance(theirs, int) and theirs < PROTOCOL else "this machine's"
        return False, (f"the remote servelab {remote_version} speaks remote protocol {theirs}, this servelab "
                       f"{local_version} speaks {PROTOCOL}: upgrade {older} servelab")
    if remote_version != local_version:
        return True, (f"the remote servelab is {remote_version}, this one {local_version} (same remote protocol "
                      f"{PROTOCOL}: going on)")
    return True, None
