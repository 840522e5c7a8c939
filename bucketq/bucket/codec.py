"""How items sit inside a bucket: one binary of concatenated BSON documents.

Each item is encoded once, at push time, as ``{"p": payload}`` (plus ``"h": headers``
when there are any); a bucket stores the concatenation as a single BSON binary.
The server then sees one element per bucket instead of one per item, and the
client decodes a whole bucket with one ``bson.decode_all`` call. Measured on the
embedded server, this costs about the same as encoding the payload alone
(the BSON floor) and far less than an array of sub-documents.
"""

from __future__ import annotations

from typing import Any

import bson
from bson.errors import BSONError, InvalidDocument

from ..errors import DecodeError, PayloadNotEncodable

__all__ = ["encode_item", "decode_items", "may_have_headers", "CODEC_OPTIONS", "collection"]

CODEC_OPTIONS: bson.CodecOptions[dict[str, Any]] = bson.CodecOptions(
    tz_aware=True, tzinfo=bson.tz_util.utc
)


def collection(db: Any, name: str, write_concern: Any = None) -> Any:
    """Collection ``name`` of ``db`` as every queue object reads it (``CODEC_OPTIONS``)."""
    return db.get_collection(name, codec_options=CODEC_OPTIONS, write_concern=write_concern)


_encode = bson.encode
_decode_all = bson.decode_all


def encode_item(payload: Any, headers: dict[str, Any] | None = None) -> bytes:
    """Encode one item; raises :class:`PayloadNotEncodable` with the reason."""
    doc = {"p": payload} if not headers else {"p": payload, "h": headers}
    try:
        return _encode(doc)
    except RecursionError as exc:
        raise PayloadNotEncodable(
            "The payload cannot be stored: it contains itself (or nests deeper than BSON "
            "encoding can follow). Push a tree of dicts and lists without cycles."
        ) from exc
    except (InvalidDocument, TypeError, OverflowError, ValueError) as exc:
        raise PayloadNotEncodable(
            f"The payload cannot be stored: it is not BSON-encodable ({exc}). "
            "Push dicts, lists, strings, numbers, booleans, None, bytes, datetimes "
            "or ObjectIds; convert other types first (for example with json.dumps)."
        ) from exc


#: An item's headers in its BSON: an embedded document (type 0x03) named ``h``.
_HEADERS_MARK = b"\x03h\x00"


def may_have_headers(blob: bytes) -> bool:
    """False when no item of a bucket's binary has headers (its bytes lack the headers'
    element), so a reader need not look at each item for them; True when some may."""
    return _HEADERS_MARK in blob


def decode_items(blob: bytes) -> list[dict[str, Any]]:
    """Decode every item of a bucket's binary, in push order."""
    try:
        return _decode_all(blob, CODEC_OPTIONS)
    except (BSONError, ValueError) as exc:
        raise DecodeError(f"A bucket's items cannot be decoded: {exc}") from exc
