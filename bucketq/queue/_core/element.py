"""The per-element baseline (``ElementQueue``): one document per item."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bson import ObjectId

from ...bucket.times import to_datetime


@dataclass(slots=True, eq=False, match_args=False)
class ElementRef:
    """What a per-element message points at: its document and the claim's token
    (compared by identity, as a ``Message.bucket`` is)."""

    id: ObjectId
    token: ObjectId | None = None
    batch: Any = None
    origin: Any = None
    lost: bool = field(default=False, init=False)
    released: bool = field(default=False, init=False)


def element_document(payload: Any, headers: dict | None, mature: float) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "_id": ObjectId(),
        "mature": to_datetime(mature),
        "p": payload,
        "tries": 0,
        "lease": None,
    }
    if headers:
        doc["h"] = headers
    return doc


def element_rollback_update(not_before: float) -> dict[str, Any]:
    return {"$set": {"mature": to_datetime(not_before), "lease": None}, "$inc": {"tries": 1}}
