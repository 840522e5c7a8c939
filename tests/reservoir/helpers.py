"""Small helpers shared by the reservoir tests."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from waiting import eventually_async


def logs(
    n: int, project: str = "proj", start: int = 0, poison: set[int] | None = None
) -> list[dict[str, Any]]:
    poison = poison or set()
    return [
        {
            "project_id": f"{project}{i % 5}",
            "service": "api",
            "level": "info",
            "message": f"poison-{i}" if i in poison else f"rec-{i}",
            "metadata": {"seq": i},
        }
        for i in range(start, start + n)
    ]


async def eventually(
    check: Callable[[], Any | Awaitable[Any]], timeout: float = 30.0, what: str = ""
) -> Any:
    """Poll ``check`` until it returns something truthy (progress of real background
    work, not a timing assertion): the suite's ``eventually_async`` (tests/waiting.py)."""
    return await eventually_async(check, timeout=timeout, what=what)


async def settled(buf: Any, timeout: float = 45.0) -> None:
    """Wait until the transport holds nothing for the buffer (every record stored or
    dead-lettered)."""

    async def empty() -> bool:
        return sum((await buf.transport.pending()).values()) == 0

    await eventually(empty, timeout, "the buffer to settle")
