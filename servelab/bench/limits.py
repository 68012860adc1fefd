"""What the client itself needs before it offers a load: file descriptors for its streams, and the API key on every
request it makes.

Descriptors: every request is one socket (protocol/http1.py sends `Connection: close`), so a level of N concurrent
streams needs N descriptors besides those the process already holds. Before such a level, the soft limit
(`ulimit -n`) is raised as far as the hard limit allows when it is too low; when even the hard limit is too low,
the level is refused with the numbers and what to run, instead of thousands of requests failing with "Too many
open files" (which would measure the client, not the server). What slips through (an open-loop level, whose
requests in flight are not bounded in advance) is classified `fd_limit` and ends its level (bench/loads/control.py).
"""

from __future__ import annotations

import os

from servelab.errors import UserError

FD_HEADROOM = 32  # descriptors besides the streams and what is open now: records file, scrapes, tokenizer calls


class DescriptorShortage(UserError):
    """The client may not open as many sockets as the load needs."""


def auth_headers(api_key: str | None) -> dict[str, str] | None:
    """The header every request to the server carries when there is an API key (a bearer token)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else None


def open_descriptors() -> int:
    """How many descriptors this process holds now (a fixed guess where /proc is not there)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 32


def check_descriptors(streams: int, what: str) -> int | None:
    """Make sure this process may hold `streams` more sockets at once. Raises the soft RLIMIT_NOFILE towards the
    hard one when needed (returns the new soft limit then, else None); raises DescriptorShortage when the hard
    limit is too low or cannot be raised to."""
    try:
        import resource
    except ImportError:  # not POSIX: nothing to check
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held = open_descriptors()
    need = streams + held + FD_HEADROOM
    infinite = resource.RLIM_INFINITY
    if soft == infinite or need <= soft:
        return None
    if hard == infinite or need <= hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
            return need
        except (ValueError, OSError):
            pass
    hard_text = "unlimited" if hard == infinite else f"{hard:,}"
    raise DescriptorShortage(
        f"{what} needs {streams:,} sockets at once, about {need:,} open files with the {held:,} servelab holds, "
        f"but this process may open only {soft:,} (`ulimit -n`; hard limit {hard_text})",
        hint=f"raise the limit (`ulimit -n {need}`, as root or in limits.conf if the hard limit is lower) or "
             f"offer fewer streams")
