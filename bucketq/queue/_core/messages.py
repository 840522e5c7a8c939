"""Delivered items: ``Message``, item ids, and which message a commit or rollback may take."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bson import ObjectId

from ...errors import ConfigurationError
from .times import to_datetime


def check_message(msg: Any, origin: Any, what: str) -> Any:
    """``msg`` must be a :class:`Message` this queue object delivered (``origin`` is the
    queue object; a message's bucket remembers who claimed it)."""
    if not isinstance(msg, Message):
        raise ConfigurationError(
            f"{what} takes a Message returned by reserve() of this queue; got {msg!r}."
        )
    if getattr(msg.bucket, "origin", None) is not origin:
        raise ConfigurationError(
            f"{what}: message {msg.id} was delivered by another queue object; commit or roll "
            "it back on the queue object whose reserve() returned it."
        )
    return msg


def is_current(msg: Message) -> bool:
    """Whether ``msg`` is the item's latest delivery here: a rollback (counted in the
    bucket's ``tries``) ends a delivery, so a commit of the earlier Message is refused
    even when the item was served again at once."""
    return msg.tries == msg.bucket.tries.get(msg.index, 0)


def item_id(bucket_id: ObjectId, index: int) -> str:
    return f"{bucket_id}.{index}"


def parse_item_id(value: Any) -> tuple[ObjectId, int]:
    """``'<24 hex digits>.<index>'`` (as in ``Receipt.id`` and ``Message.id``) split into the
    bucket id and a whole index from 0 to 65535 (written in plain decimal digits)."""
    try:
        bid, idx = value.rsplit(".", 1)
        if not idx.isdigit() or not idx.isascii() or (len(idx) > 1 and idx[0] == "0"):
            raise ValueError("bad index")
        index = int(idx)
        if index >= 65536:
            raise ValueError("index out of range")
        return ObjectId(bid), index
    except Exception as exc:
        raise ConfigurationError(
            f"{value!r} is not a bucketq item id (they look like '<24 hex digits>.<index>' with "
            "an index from 0 to 65535, as in Receipt.id and Message.id)."
        ) from exc


@dataclass(slots=True, eq=False, repr=False, match_args=False)
class Message:
    """One delivered item. ``tries`` counts earlier deliveries that did not end in a commit.

    One is made per delivered item: slots and the generated ``__init__`` keep that as
    cheap as plain assignments. Messages compare by identity (``eq=False``): two
    deliveries of the same item are different messages (see ``is_current``)."""

    bucket: Any
    index: int
    payload: Any
    headers: dict | None
    tries: int
    _mature: float  # epoch seconds; ``mature`` gives it as a datetime

    @property
    def id(self) -> str:
        return item_id(self.bucket.id, self.index)

    @property
    def mature(self) -> datetime:
        return to_datetime(self._mature)

    def __repr__(self) -> str:
        return f"Message(id={self.id!r}, tries={self.tries}, payload={self.payload!r})"
