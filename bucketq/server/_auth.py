"""Authentication: the project of the presented API key, as a route dependency."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Query, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from ..errors import Overloaded
from ._admission import remaining
from ._http_errors import ApiError
from ._service import Svc

_api_key = APIKeyHeader(
    name="X-API-Key", auto_error=False, description="An API key (`bucketq keys create`)."
)
_bearer = HTTPBearer(auto_error=False, description="The same API key as a bearer token.")


class KeyConflict(ValueError):
    """A request carries two different keys: which one it meant is not for us to guess."""


def one_key(api_key: str | None, bearer: str | None) -> str | None:
    """The one key of a request from its ``X-API-Key`` and ``Authorization: Bearer``
    values (None: neither); the same key in both is that key, two different ones raise
    :class:`KeyConflict` (one would otherwise win silently: a script that sends a new key
    in one header and a stale one in the other works by luck of the order)."""
    given = {k.strip() for k in (api_key, bearer) if k and k.strip()}
    if len(given) > 1:
        raise KeyConflict(
            "X-API-Key and Authorization: Bearer carry two different keys; send one key (in "
            "one of them, or the same key in both)."
        )
    return given.pop() if given else None


async def project_of(
    svc: Svc,
    api_key: Annotated[str | None, Security(_api_key)] = None,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)] = None,
) -> str:
    """The project of the presented key; 401 when it is missing, unknown or revoked, 400
    when ``X-API-Key`` and ``Authorization: Bearer`` carry two different keys."""
    try:
        key = one_key(api_key, bearer.credentials if bearer is not None else None)
    except KeyConflict as exc:
        raise ApiError(400, "Bad request", str(exc)) from None
    return await _project_of_key(svc, key)


async def stream_project_of(
    svc: Svc,
    token: Annotated[str | None, Query(max_length=200, description=(
        "The API key, for clients that cannot send a header (a browser's EventSource): "
        "taken on this route only, as LogTide does, and never logged."))] = None,
    api_key: Annotated[str | None, Security(_api_key)] = None,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)] = None,
) -> str:  # fmt: skip
    """:func:`project_of`, the key also taken from the ``token`` query parameter."""
    try:
        key = one_key(api_key, bearer.credentials if bearer is not None else None)
        key = one_key(key, token)
    except KeyConflict as exc:
        raise ApiError(400, "Bad request", str(exc).replace(
            "X-API-Key and Authorization: Bearer", "The headers and `token`")) from None  # fmt: skip
    return await _project_of_key(svc, key)


async def _project_of_key(svc: Svc, key: str | None) -> str:
    if not key:
        raise ApiError(
            401, "Unauthorized", "Send an API key in X-API-Key or Authorization: Bearer."
        )
    try:
        # Within the request's deadline: a store that does not answer is a 503 in time.
        timeout = remaining(svc.config.ingest_timeout_ms / 1000)
        info = await svc.keys.lookup(key, timeout)  # type: ignore[union-attr]
    except Overloaded:
        raise  # too many lookups of keys not seen before: 429 (its own handler)
    except Exception as exc:
        raise svc.unavailable("The key store is unavailable.") from exc
    if info is None:
        raise ApiError(401, "Unauthorized", "Unknown API key.")
    if info.revoked:
        raise ApiError(401, "Unauthorized", f"API key {info.prefix}... was revoked.")
    if info.operator:
        raise ApiError(403, "Forbidden", "An operator key opens the console; send a project's key.")
    return info.project


#: A route's parameter for the authenticated project.
Project = Annotated[str, Depends(project_of)]
#: The same, the key also taken from ``token`` (the live stream's route only).
StreamProject = Annotated[str, Depends(stream_project_of)]
IdempotencyKey = Annotated[
    str | None,
    Header(
        max_length=200,
        description="Optional: a retried request with the same key is stored once.",
    ),
]
