"""What servelab's two users of Ray share (`--on ray:…`, remote/ray_link.py; `bench --workers N --ray`,
bench/workers/ray_backend.py): importing it with a one-line error where it is not installed, joining a cluster
without Ray's own minutes of retries nor a secret of this command line in the cluster's job table, and one true
line of what Ray raised.

Imported only once Ray is wanted: `import servelab` never imports Ray.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
from collections.abc import Iterator
from typing import Any

from servelab.errors import UserError
from servelab.redaction import redact_command

JOIN_WAIT_S = 60.0  # joining the cluster, at most


def import_ray(what: str = "--on ray:…", hint: str = "pip install 'servelab[ray]' (and servelab on every node "
                                                      "of the cluster)"):
    try:
        import ray
    except ImportError:
        raise UserError(f"{what} needs Ray, which is not installed here", hint=hint) from None
    return ray


def first_line(exc: BaseException) -> str:
    """One line that says what went wrong. A task's error is its cause's (Ray's own text starts with a header,
    `ray::LinkActor.run() (pid=…, ip=…)`, and ends with the traceback's last line); any other error of Ray's
    says what happened last (an ActorDiedError's `The actor is dead because …`); anything else its first line."""
    cause = getattr(exc, "cause", None)
    if _is_rays(exc) and isinstance(cause, BaseException) and cause is not exc:
        return first_line(cause)
    text = str(exc).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    line = (lines[-1] if _is_rays(exc) else lines[0]) if lines else ""
    name = type(exc).__name__
    return f"{name}: {line}"[:300]


def _is_rays(exc: BaseException) -> bool:
    return any(getattr(k, "__module__", "").split(".")[0] == "ray" for k in type(exc).__mro__)


def entrypoint() -> str:
    """This process's command line as Ray may record it (the job table, the dashboard, `ray list jobs`): with
    its secrets hidden as servelab hides them everywhere (servelab.redaction)."""
    from subprocess import list2cmdline

    try:
        import psutil

        argv = psutil.Process().cmdline()
    except Exception:  # noqa: BLE001 - psutil comes with Ray; a process it cannot read: what Python was given
        argv = [sys.executable, *sys.argv]
    return list2cmdline(redact_command(argv))


@contextlib.contextmanager
def _redacted_entrypoint(ray: Any) -> Iterator[None]:
    """ray.init records `ray._private.utils.get_entrypoint_name()`, the driver's whole command line, in the
    cluster's job table: replaced, for the join, by the redacted one. Where a Ray has moved that helper, it is
    joined as is, and a command line with a secret in it says so here."""
    utils = getattr(getattr(ray, "_private", None), "utils", None)
    original = getattr(utils, "get_entrypoint_name", None)
    if original is None:
        with contextlib.suppress(Exception):
            import psutil

            argv = psutil.Process().cmdline()
            if redact_command(argv) != argv:
                print("warning: this Ray may record this command line, secrets included, in its job table",
                      file=sys.stderr)
        yield
        return
    redacted = entrypoint()
    utils.get_entrypoint_name = lambda: redacted
    try:
        yield
    finally:
        utils.get_entrypoint_name = original


def join(ray: Any, address: str, what: str, hint: str, **init: Any) -> None:
    """ray.init(address) for `what` (a message's subject: "ray:GPU=8", "the workers"), in one line when it
    cannot be done: a port nobody listens on at once (Ray's own connect retries a GCS that does not answer for
    minutes), a connect that hangs anyway (a firewall dropping packets) after JOIN_WAIT_S."""
    if why := unreachable(address):
        raise UserError(f"no Ray cluster to place {what} on: {why}", hint=hint)
    outcome: list[BaseException | None] = []

    def joining() -> None:
        try:
            with _redacted_entrypoint(ray):
                ray.init(address=address, logging_level="ERROR", log_to_driver=False, **init)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - Ray raises many kinds for "no cluster there"
            outcome.append(exc)

    # In a thread of its own, not the main one: ray.init in the main thread installs Ray's SIGTERM handler in
    # place of servelab's (which stops the far side and says so); from another thread it leaves signals alone.
    # It also bounds the wait: a thread can be given up on, a hanging ray.init in the main thread cannot.
    thread = threading.Thread(target=joining, daemon=True, name="ray-init")
    thread.start()
    thread.join(JOIN_WAIT_S)
    if not outcome:
        raise UserError(f"the Ray cluster at {address!r} did not answer within {JOIN_WAIT_S:g} s", hint=hint)
    if outcome[0] is not None:
        raise UserError(f"no Ray cluster to place {what} on (address {address!r}): {first_line(outcome[0])}",
                        hint=hint)


def unreachable(address: str) -> str | None:
    """Why nothing can answer at the cluster's address (RAY_ADDRESS's, or the one `ray start` left in Ray's temp
    directory for "auto"); None when something listens there, or when the address is not one to probe here (a
    Ray client's ray://, or a Ray whose private helper moved: ray.init then says what it finds)."""
    try:
        from ray._private.services import canonicalize_bootstrap_address

        resolved = canonicalize_bootstrap_address(address)
    except Exception:  # noqa: BLE001 - "auto" with no cluster here: ray.init's own message says so
        return None
    if not resolved or "://" in resolved:
        return None
    host, _, port = resolved.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except ValueError:
        return None
    except OSError as exc:
        return f"nothing answers at {resolved} ({exc.strerror or exc})"
    return None
