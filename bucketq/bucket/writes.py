"""The write concern every acknowledged write uses (:func:`durable_write_concern`), the
outcome of a write and whether to try it again: bulk write errors, an unconfirmed write
concern, transient errors (the back-off between tries is ``bucketq._guard.backoff``); and
the change-stream watcher's (``_async/wake.py``): a server without change streams, and
its timings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def durable_write_concern(chosen: Any, inherited: Any = None) -> Any:
    """The write concern of every write whose success bucketq reports to a caller: a push
    receipt, a durable push, a stream bucket, a state flush, a dead-letter move, the
    reservoir's storage write, the ingest service's idempotency claim, Spark's writes.

    ``chosen`` (a ``write_concern`` option: a pymongo ``WriteConcern`` or a dict of its
    keywords, already checked) is used as given: the user chose. None (the default) means
    on disk: ``inherited`` (the database's write concern: the URI's ``w``, ``wtimeoutMS``,
    ``journal``; empty for the server's default) with ``j: True`` added, unless it says
    ``j`` or ``fsync`` itself. Without ``j`` a server may acknowledge a write its journal
    does not have yet, and a kill (or a power cut) then loses it; ``w: "majority"`` alone
    is not enough where majority writes are not journaled (the embedded server), while a
    replica set that journals them pays nothing more for the ``j``. An unacknowledged
    database write concern (``w=0``) is refused: nothing could be reported stored.
    """
    from pymongo.write_concern import WriteConcern

    from ..errors import ConfigurationError

    if chosen is not None:
        return WriteConcern(**chosen) if isinstance(chosen, dict) else chosen
    doc = dict(getattr(inherited, "document", None) or {})
    if doc.get("w") == 0:
        raise ConfigurationError(
            f"The database's write concern {doc} is unacknowledged (w=0, from its URI or "
            "client): bucketq could not say whether anything was stored. Remove w=0 from the "
            "URI, or pass write_concern={'w': 1, 'j': True}."
        )
    if "j" in doc or "fsync" in doc:
        return inherited
    return WriteConcern(**{**doc, "j": True})


def bulk_failed_indexes(exc: Any) -> set[int]:
    """The positions of the writes a ``BulkWriteError`` says failed."""
    return {int(e["index"]) for e in exc.details.get("writeErrors", []) if "index" in e}


def bulk_error_of(exc: Any, index: int) -> str:
    for e in exc.details.get("writeErrors", []):
        if e.get("index") == index:
            return str(e.get("errmsg") or e)
    return str(exc)


def split_write_errors(exc: Any) -> tuple[list[Any], set[Any]]:
    """A ``BulkWriteError`` of an insert: (ids that exist already, ids that failed otherwise).
    An existing id is an earlier attempt that landed, or for a stream, someone else's number."""
    errs = exc.details.get("writeErrors", [])
    dups = [e["op"]["_id"] for e in errs if e.get("code") == 11000]
    failed = {e["op"]["_id"] for e in errs if e.get("code") != 11000}
    return dups, failed


@dataclass(frozen=True, slots=True)
class InsertOutcome:
    """What an insert of documents that raised left behind."""

    #: ``_id``s found taken: an earlier attempt of ours landed, or (a stream) another's number.
    taken: list[Any]
    #: ``_id``s not stored for another reason.
    failed: set[Any]
    #: The others were stored but the server did not confirm the write concern.
    unconfirmed: bool


def insert_outcome(exc: BaseException, ids: list[Any]) -> InsertOutcome | None:
    """What a failed insert of the documents with ``ids`` stored, the one reading of a
    write error every insert shares (bucket queue, stream, per-element queue): a bulk
    write's errors, one document's duplicate key, a write concern not confirmed. None for
    any other error: it says nothing of what was stored."""
    from pymongo.errors import BulkWriteError, DuplicateKeyError, WriteConcernError

    if isinstance(exc, BulkWriteError):
        taken, failed = split_write_errors(exc)
        return InsertOutcome(taken, failed, bulk_write_concern_failed(exc))
    if isinstance(exc, DuplicateKeyError):  # insert_one
        return InsertOutcome(list(ids), set(), False)
    if isinstance(exc, WriteConcernError):
        return InsertOutcome([], set(), True)
    return None


def write_concern_unconfirmed(kind: str, name: str, exc: BaseException) -> BaseException:
    """The receipt error of items that were stored while the write concern was not
    confirmed (a ``WriteConcernError``, or a bulk write's ``writeConcernErrors``)."""
    from ..errors import WriteConcernNotConfirmed

    err = WriteConcernNotConfirmed(
        f"The item IS stored in {kind} {name!r}, but the server did not confirm the write "
        f"concern ({exc}). Do not push it again (that would store it twice); fix the write "
        "concern or the replica set."
    )
    err.__cause__ = exc
    return err


def bulk_write_concern_failed(exc: Any) -> bool:
    """Whether a ``BulkWriteError`` also reports write concern errors."""
    return bool(exc.details.get("writeConcernErrors"))


def may_retry(exc: BaseException, elapsed: float, budget: float) -> bool:
    """Whether a failed write is tried again: a transient error, within the retry budget."""
    return elapsed < budget and is_transient(exc)


def is_transient(exc: BaseException) -> bool:
    """Errors worth retrying with backoff: the server is away or busy, not wrong."""
    from pymongo.errors import ConnectionFailure, OperationFailure, WTimeoutError

    if isinstance(exc, ConnectionFailure | WTimeoutError):
        return True
    if isinstance(exc, OperationFailure):
        return bool(
            exc.has_error_label("RetryableWriteError")
            or exc.has_error_label("TransientTransactionError")
            or exc.code in (6, 7, 89, 91, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436)
        )
    return False


def no_change_streams(exc: BaseException) -> bool:
    """Whether a failure to open or read a change stream means this server (or this
    user) has none: the watcher then leaves waking to polling for good. Anything
    transient (a failover's "not primary", a dropped connection) is tried again."""
    from pymongo.errors import OperationFailure

    return isinstance(exc, OperationFailure) and not is_transient(exc)


#: How long one read of a change stream waits on the server for an event (ms): the
#: longest a closed consumer's watcher goes on.
WATCH_AWAIT_MS = 500
#: A watcher whose reader has not waited for this long closes its change stream and
#: ends (it is started again at the reader's next wait).
WATCH_IDLE_CLOSE = 30.0
