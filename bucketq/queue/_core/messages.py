"""Delivered items: ``Message``, item ids, and which message a commit or rollback may take."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ...bucket.document import item_id
from ...bucket.times import to_datetime
from ...errors import ConfigurationError


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
