"""The HTTP client the openai_sdk check hands the SDK: the SDK's own httpx, with verify's body bound on top.

The SDK reads with httpx, not with verify's reader (transport.py), and httpx inflates a compressed body in one go
per read and keeps a plain answer whole: a gzip bomb would cost gigabytes. This transport inflates gzip/deflate
itself, a step at a time, and ends any body past transport.MAX_BODY_BYTES with SDKOverflow (the SDK's exception
then names the bound); it never follows a redirect. Response heads are bounded by httpx's HTTP/1.1 parser (h11)."""

from __future__ import annotations

import importlib
import sys
import zlib
from typing import Any

from servelab.protocol.http1 import INFLATE_STEP
from servelab.verify.transport import MAX_BODY_BYTES, mib


class SDKOverflow(Exception):
    """A body past verify's bound, raised while the SDK reads it (as the SDK's httpx's DecodingError, which the
    SDK lets through and whose stream it then closes in turn)."""


def httpx_module() -> Any:
    """The httpx the installed openai SDK uses (httpx2 where the SDK moved to it)."""
    import openai  # noqa: F401 - imported first, so that its choice of httpx is in sys.modules
    for name in ("httpx2", "httpx"):
        if name in sys.modules:
            return sys.modules[name]
    return importlib.import_module("httpx")


def capped_client(timeout_s: float) -> Any:
    """An httpx AsyncClient for `openai.AsyncOpenAI(http_client=...)`."""
    httpx = httpx_module()

    class Overflowed(SDKOverflow, httpx.DecodingError):
        pass

    class CappedStream(httpx.AsyncByteStream):
        def __init__(self, inner: Any, compressed: bool):
            self.inner = inner
            self.decoder = zlib.decompressobj(wbits=47) if compressed else None  # zlib or gzip, detected

        async def __aiter__(self):  # type: ignore[no-untyped-def]
            size = wire = 0
            async for part in self.inner:
                wire += len(part)
                if self.decoder is None:
                    size += len(part)
                    if size > MAX_BODY_BYTES:
                        raise Overflowed(f"answer larger than {mib(MAX_BODY_BYTES)}: the rest was not read")
                    yield part
                    continue
                data = part
                while data:
                    try:
                        out = self.decoder.decompress(data, INFLATE_STEP)
                    except zlib.error as exc:
                        raise Overflowed(f"the compressed body could not be decoded: {exc}") from None
                    size += len(out)
                    if size > MAX_BODY_BYTES:
                        raise Overflowed(f"answer inflated past {mib(MAX_BODY_BYTES)}: a compressed body that "
                                          f"never ends ({wire:,} compressed bytes read; the rest was not)")
                    if out:
                        yield out
                    data = self.decoder.unconsumed_tail
            if self.decoder is not None:
                rest = self.decoder.flush()
                if size + len(rest) > MAX_BODY_BYTES:
                    raise Overflowed(f"answer inflated past {mib(MAX_BODY_BYTES)}")
                if rest:
                    yield rest

        async def aclose(self) -> None:
            await self.inner.aclose()

    class CappedTransport(httpx.AsyncBaseTransport):
        def __init__(self) -> None:
            self.inner = httpx.AsyncHTTPTransport(trust_env=False)

        async def handle_async_request(self, request: Any) -> Any:
            response = await self.inner.handle_async_request(request)
            encoding = response.headers.get("content-encoding", "identity").strip().lower()
            compressed = encoding in ("gzip", "x-gzip", "deflate")
            headers = response.headers
            if compressed:  # inflated here: httpx must not inflate again
                headers = [(k, v) for k, v in response.headers.raw
                           if k.lower() not in (b"content-encoding", b"content-length")]
            return httpx.Response(status_code=response.status_code, headers=headers,
                                  stream=CappedStream(response.stream, compressed), extensions=response.extensions)

        async def aclose(self) -> None:
            await self.inner.aclose()

    return httpx.AsyncClient(transport=CappedTransport(), timeout=timeout_s, follow_redirects=False,
                             trust_env=False)
