"""Server URLs and reachability, shared by every command that talks to a running server."""

from __future__ import annotations

import asyncio
import socket

from yarl import URL

from servelab.errors import UserError
from servelab.redaction import redact_url

CONNECT_TIMEOUT_S = 5.0


def normalize_base_url(url: str) -> str:
    """`host:port`, `http://host:port/` and `http://host:port/v1` (the OpenAI SDK's base_url) all name the same
    server; checks append `/v1/...` themselves. Raises UserError for something that is not an http(s) URL."""
    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    try:
        parsed = URL(text)
    except ValueError as exc:
        raise UserError(f"invalid server URL '{redact_url(url)}': {redact_url(str(exc))}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise UserError(f"invalid server URL '{redact_url(url)}'", hint="expected http://HOST:PORT")
    path = parsed.path.rstrip("/")
    path = path.removesuffix("/v1")
    return str(parsed.with_path(path or "/").with_query(None).with_fragment(None)).rstrip("/")


def check_credentials(base_url: str, api_key: str | None) -> None:
    """A URL's `user:password` and an API key would both set the Authorization header (Basic and Bearer), and
    HTTP has room for one: refuse the pair in one line rather than let the HTTP layer fail every request."""
    if api_key and (URL(base_url).user or URL(base_url).password):
        raise UserError(f"the URL '{redact_url(base_url)}' carries a user and password and --api-key was given: "
                        f"both would set the Authorization header",
                        hint="give one: the key (Bearer) or the credentials in the URL (Basic)")


async def ensure_reachable(base_url: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Open (and close) one TCP connection, so that a wrong host or port is one clear UserError instead of every
    check failing the same way. Only connecting is tested: a server that accepts and then hangs is the checks' job."""
    parsed = URL(base_url)
    host, port = parsed.host, parsed.port
    assert host is not None and port is not None  # normalize_base_url guarantees both
    base_url = redact_url(base_url) or base_url  # only for the messages: a URL's password is never printed
    try:
        async with asyncio.timeout(timeout_s):
            _, writer = await asyncio.open_connection(host, port)
    except ConnectionRefusedError:
        raise UserError(f"cannot reach {base_url}: connection refused",
                        hint="is the server running, and on this port?") from None
    except socket.gaierror as exc:
        raise UserError(f"cannot reach {base_url}: cannot resolve host '{host}' ({exc.strerror})") from None
    except TimeoutError:
        raise UserError(f"cannot reach {base_url}: no connection within {timeout_s:g}s") from None
    except OSError as exc:
        raise UserError(f"cannot reach {base_url}: {exc.strerror or exc}") from None
    writer.close()
    try:
        await writer.wait_closed()
    except OSError:
        pass  # the peer may reset a connection that sent nothing; we only wanted to know it accepts
