"""What the controller talks to: a link that runs a far-side `servelab remote …` command and streams one.

The controller (start, follow with its alive lines, Ctrl-C, the copy back) is the same whatever carries those
commands; only the link differs:

- connection.py's SshConnection: the commands run through an OpenSSH control master on the host it names;
- ray_link.py's RayLink: they run as subprocesses of a Ray actor placed by resources (`ray:GPU=8`), on the node
  Ray chose, with the actor's stdin and stdout relayed here in chunks.

Both sides of the far side are the same either way: agent.py's commands, worker.py's detached job in
~/.servelab/remote/<id>, its events.jsonl and the watchdog on controller.alive.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from typing import Any, Protocol

LINK_FAILED = 255  # a streamed command's status when the link, not the command, ended it (OpenSSH's own 255)


class Link(Protocol):
    target: Any  # what messages name: an SshTarget, a RayPlacement

    def run(self, remote: Sequence[str], timeout_s: float = 60.0, stdin: bytes | None = None
            ) -> subprocess.CompletedProcess:
        """Run `remote` there to its end: its exit status, stdout and stderr (bytes). UserError when the link
        itself failed."""

    def popen(self, remote: Sequence[str]) -> Any:
        """Start `remote` there, streaming: an object with Popen's stdin (write, flush, close), stdout (a binary
        file: readline, read), stderr (read, once it ended), poll, wait, kill and returncode; LINK_FAILED as its
        status when the link dropped under it."""

    @property
    def master_alive(self) -> bool:
        """Whether the link still stands, as far as it knows without asking."""

    def check(self) -> bool:
        """Whether the link answers now (a round trip)."""

    def reconnect(self, wait_s: float) -> bool:
        """The link back within `wait_s`; False when it is not."""

    def close(self) -> None: ...


def lost_for_good(link: Link) -> str | None:
    """Why the link can never come back, when it cannot (a Ray actor that was killed: the resources it held are
    Ray's again); None while reconnecting is worth trying (an SSH link always is)."""
    lost = getattr(link, "lost_for_good", None)
    return lost() if callable(lost) else None


def attach_target(link: Link) -> str:
    """What `servelab attach` is given to follow a job of this link again: an SSH link's own URL; a Ray link's
    node, by SSH (a placement by resources could pick another node)."""
    return str(getattr(link, "attach_target", None) or link.target)


def display_host(link: Link) -> str:
    """The far host as the live view and the notes name it."""
    return str(getattr(link, "host", None) or link.target.host)
