"""OpenAI-shaped error responses (``{"error": {"message", "type", "param", "code"}}``).

Owns the error types and codes the router answers with, so clients written for OpenAI's API (and vLLM's
server, which uses the same shape) parse them. Pure apart from building an aiohttp response.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Final

from aiohttp import web

TYPE_INVALID_REQUEST = "invalid_request_error"
TYPE_RATE_LIMIT = "rate_limit_error"
TYPE_UNAVAILABLE = "service_unavailable_error"
TYPE_UPSTREAM = "upstream_error"
TYPE_PERMISSION = "permission_error"

CODE_MODEL_NOT_FOUND = "model_not_found"
CODE_NO_POOL = "no_matching_pool"
CODE_ALL_FULL = "all_pairs_full"
CODE_NO_PAIR = "no_serving_pair"
CODE_NO_TABLE = "no_routing_table"
CODE_PREFILL_FAILED = "prefill_failed"
CODE_DECODE_FAILED = "decode_failed"
CODE_STREAM_BROKEN = "stream_broken"
CODE_POOL_NOT_FOUND = "pool_not_found"
"""``X-Tandem-Revision`` named a pool this router does not route (for the request's model)."""
CODE_NO_REVISION = "revision_not_serving"
"""``X-Tandem-Revision`` named a revision with no serving pair in the pool (rolled back, still warming)."""
CODE_PIN_DISABLED = "revision_pin_disabled"
CODE_BAD_PIN = "invalid_revision_pin"

_TYPE_BY_STATUS: Final = {
    403: TYPE_PERMISSION,
    429: TYPE_RATE_LIMIT,
    503: TYPE_UNAVAILABLE,
    502: TYPE_UPSTREAM,
    504: TYPE_UPSTREAM,
}


def error_body(
    message: str, *, status: int, code: str | None = None, error_type: str | None = None
) -> dict[str, object]:
    """The OpenAI error document."""
    kind = error_type or _TYPE_BY_STATUS.get(status, TYPE_INVALID_REQUEST)
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def error_response(
    message: str,
    *,
    status: int,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    return web.Response(
        status=status,
        body=json.dumps(error_body(message, status=status, code=code)).encode(),
        content_type="application/json",
        headers=headers,
    )


def sse_error_event(message: str, code: str) -> bytes:
    """A final SSE event telling a streaming client the stream broke (vLLM sends errors the same way)."""
    return b"data: " + json.dumps(error_body(message, status=502, code=code)).encode() + b"\n\n"
