"""Streamed answers (exports): the status line goes out with the first chunk, and a failure
after it cuts the transfer short instead of ending a body that looks whole."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable

from aiohttp import web

from common.http import request_id, response_headers


def streamed_response(request: web.Request, content_type: str, *,
                      filename: str | None = None) -> web.StreamResponse:
    """The unprepared response of an export: ``content_type`` (text in UTF-8), never cached,
    the request's ``X-Request-Id``, the listener's own headers (HSTS under TLS,
    ``common.http.response_headers``), and ``Content-Disposition: attachment`` with
    ``filename`` when given. Fill with :func:`stream_body`."""
    headers = {**response_headers(request), "X-Request-Id": request_id(request),
               "Cache-Control": "no-store"}
    if filename is not None:
        headers["Content-Disposition"] = f'attachment; filename="{filename}"'
    response = web.StreamResponse(headers=headers)
    response.content_type = content_type
    if content_type.startswith("text/"):
        response.charset = "utf-8"
    return response


async def stream_body(request: web.Request, response: web.StreamResponse,
                      chunks: AsyncIterable[bytes], *, what: str,
                      logger: logging.Logger) -> web.StreamResponse:
    """Send ``response`` (headers set, not prepared) with ``chunks`` as its body.

    The first chunk is read before the status line is sent, so a failure there raises to the
    caller (the envelope middleware answers it: a 400 or 503 like any other). Once the status
    line is out, a client that went away is logged at INFO; any other failure is logged with
    its traceback (``what`` names the export) and the connection is aborted, so the client sees
    an incomplete body (no final chunk), never a short file that looks complete."""
    iterator = aiter(chunks)
    try:
        first: bytes | None = await anext(iterator)
    except StopAsyncIteration:
        first = None
    await response.prepare(request)
    try:
        if first is not None:
            await response.write(first)
            async for chunk in iterator:
                await response.write(chunk)
    except ConnectionResetError:
        logger.info("%s: the client went away", what, extra={"request_id": request_id(request)})
        return response
    except Exception:
        logger.exception("%s failed mid-stream", what, extra={"request_id": request_id(request)})
        if request.transport is not None:
            request.transport.abort()
        return response
    await response.write_eof()
    return response
