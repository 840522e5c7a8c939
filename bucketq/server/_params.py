"""Query parameters a read route does not take are refused, never ignored.

``GET /api/v1/logs?trace_id=...`` on a route without ``trace_id`` answered the unfiltered
page as if it were the filtered one; a careless client (or a client written for another
version) then reads wrong data without a word. A route declares :data:`KnownQuery` among
its dependencies (``@router.get(..., dependencies=[KnownQuery])``, or its router's), and
a parameter it does not take is answered 400 naming it and the ones it takes.

The accepted names are the route's declared query parameters, its dependencies' included
(their aliases: ``from``, not ``from_``; a Pydantic model given as ``Query()`` counts
its fields), read from FastAPI's own description of the route once per route: a
parameter added to the route is accepted with it, there is no list to keep.
"""

from __future__ import annotations

from typing import Any

from fastapi import Depends, Request
from pydantic import BaseModel

from ._http_errors import ApiError

#: Each route's accepted names, computed at its first request with a query: by the route's
#: id, with the route itself (held, so that its id is not another's; FastAPI's routes
#: cannot be keys, they are not hashable).
_ACCEPTED: dict[int, tuple[Any, frozenset[str]]] = {}


def accepted_query(dependant: Any) -> frozenset[str]:
    """The query parameter names of a FastAPI ``Dependant`` and its dependencies."""
    names: set[str] = set()
    stack = [dependant]
    while stack:
        d = stack.pop()
        for f in d.query_params:
            kind = getattr(f.field_info, "annotation", None)
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                names.update(x.alias or n for n, x in kind.model_fields.items())
            else:
                names.add(f.alias)
        stack.extend(d.dependencies)
    return frozenset(names)


async def known_query(request: Request) -> None:
    """Refuse (400) a query parameter the matched route does not declare."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None or not request.query_params:
        return
    held = _ACCEPTED.get(id(route))
    if held is None or held[0] is not route:
        held = _ACCEPTED[id(route)] = (route, accepted_query(dependant))
    accepted = held[1]
    for name in request.query_params:
        if name not in accepted:
            takes = ", ".join(sorted(accepted)) or "none"
            raise ApiError(
                400,
                "Unknown query parameter",
                f"The query parameter {name[:100]!r} is not one this route takes, and it would "
                f"not filter the answer; it takes: {takes}.",
            )


#: The dependency a route declares to refuse query parameters it does not take.
KnownQuery = Depends(known_query)
