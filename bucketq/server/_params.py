"""Query parameters a read route does not take are refused, never ignored.

``GET /api/v1/logs?trace_id=...`` on a route without ``trace_id`` answered the unfiltered
page as if it were the filtered one; a careless client (or a client written for another
version) then reads wrong data without a word. A route declares :data:`KnownQuery` among
its dependencies (``@router.get(..., dependencies=[KnownQuery])``, or its router's), and
a parameter it does not take is answered 400 naming it and the ones it takes.

A parameter is given once, unless the route takes it as a list (``level=info&level=error``,
as LogTide takes ``level`` and ``service``): then at most :data:`MAX_VALUES` times. A
second value of any other parameter would silently replace the first, so it is refused
too (400). The request-head middleware refuses repetition on every route; it lets a name
of :data:`REPEATABLE` repeat under :data:`REPEATABLE_UNDER` only, where every route
declares :data:`KnownQuery`, which decides for the matched route.

The accepted names are the route's declared query parameters, its dependencies' included
(their aliases: ``from``, not ``from_``; a Pydantic model given as ``Query()`` counts
its fields), read from FastAPI's own description of the route once per route: a
parameter added to the route is accepted with it, there is no list to keep.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from fastapi import Depends, Request
from pydantic import BaseModel

from ._http_errors import ApiError

#: Values a list parameter takes at most (``Query(max_length=MAX_VALUES)`` on the route).
MAX_VALUES = 8
#: Names the request-head middleware lets repeat, under this path only.
REPEATABLE = frozenset({"level", "service"})
REPEATABLE_UNDER = "/api/v1/logs"

#: Each route's accepted names and its list parameters' names, computed at its first
#: request with a query: by the route's id, with the route itself (held, so that its id is
#: not another's; FastAPI's routes cannot be keys, they are not hashable).
_ACCEPTED: dict[int, tuple[Any, frozenset[str], frozenset[str]]] = {}


def _is_list(kind: Any) -> bool:
    """Whether a parameter's annotation is a list (or an optional one)."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return any(_is_list(a) for a in typing.get_args(kind))
    return typing.get_origin(kind) in (list, tuple, set, frozenset)


def query_names(dependant: Any) -> tuple[frozenset[str], frozenset[str]]:
    """The query parameter names of a FastAPI ``Dependant`` and its dependencies, and
    those of them it takes as lists."""
    names: set[str] = set()
    lists: set[str] = set()
    stack = [dependant]
    while stack:
        d = stack.pop()
        for f in d.query_params:
            kind = getattr(f.field_info, "annotation", None)
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                names.update(x.alias or n for n, x in kind.model_fields.items())
            else:
                names.add(f.alias)
                if _is_list(kind):
                    lists.add(f.alias)
        stack.extend(d.dependencies)
    return frozenset(names), frozenset(lists)


def accepted_query(dependant: Any) -> frozenset[str]:
    """The query parameter names of a FastAPI ``Dependant`` and its dependencies."""
    return query_names(dependant)[0]


async def known_query(request: Request) -> None:
    """Refuse (400) a query parameter the matched route does not declare."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None or not request.query_params:
        return
    held = _ACCEPTED.get(id(route))
    if held is None or held[0] is not route:
        held = _ACCEPTED[id(route)] = (route, *query_names(dependant))
    _, accepted, lists = held
    given: dict[str, int] = {}
    for name, _ in request.query_params.multi_items():
        given[name] = given.get(name, 0) + 1
    for name, n in given.items():
        if n > 1 and name not in lists:
            raise ApiError(400, "Bad request",
                           f"The query parameter {name[:100]!r} is given more than once; "
                           "give each parameter once.")  # fmt: skip
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
