"""Every error bucketq raises, in one tree rooted at :class:`BucketQError`.

::

    BucketQError
    ├── ConfigurationError          an option or environment variable is invalid
    │   └── MissingDependency       an optional extra is not installed (also an ImportError)
    ├── PayloadError                a pushed item cannot be stored
    │   ├── PayloadNotEncodable     not BSON-encodable
    │   └── PayloadTooLarge         can never fit in a bucket
    ├── DecodeError                 a stored bucket cannot be decoded
    │   └── DamagedBucket           a stored bucket is damaged; names it and why
    ├── QueueClosed                 the queue was drained or closed
    ├── QueueFull                   max_pending_bytes reached with pending_policy="raise"
    ├── PushFailed                  a bucket insert failed after its retry budget
    │   └── WriteConcernNotConfirmed  stored, but the write concern was not confirmed
    ├── LeaseLost                   another consumer owns the bucket now
    │   └── Fenced                  an older stream consumer epoch was fenced off
    ├── AckOutOfOrder               a stream ack is not the next delivered seq
    ├── OperationFailed             a MongoDB operation failed (the driver's error is the cause)
    │   ├── ServerUnavailable       MongoDB could not be reached
    │   └── OperationTimeout        MongoDB did not answer an operation within its deadline
    ├── EmbeddedServerError         the embedded MongoDB-wire server did not start
    ├── Overloaded                  over an admission limit; retry after ``retry_after``
    ├── NotSupported                a feature other brokers have and bucketq lacks (also a
    │                               NotImplementedError): Celery's fan-out, topics, priorities
    └── TransportError              a reservoir transport failed
        ├── TransportTimeout
        ├── TransportUnavailable
        └── CircuitOpen             the breaker is open; see ``retry_after``

Driver errors are translated where they leave the I/O layer (``bucketq._driver``),
always with ``raise ... from`` so the original stays attached. No class shadows a builtin.
"""

from __future__ import annotations


class BucketQError(Exception):
    """Root of every error bucketq raises."""


class ConfigurationError(BucketQError, ValueError):
    """An option or environment variable has an invalid value."""


class MissingDependency(ConfigurationError, ImportError):
    """A part needs an optional dependency that is not installed; the message names the
    extra to install (``pip install 'bucketq[EXTRA]'``). Also an :class:`ImportError`, so
    code that guards an optional import catches it as one."""


class PayloadError(BucketQError, ValueError):
    """A pushed item cannot be stored; no other item is affected."""


class PayloadNotEncodable(PayloadError):
    """The payload or its headers cannot be encoded to BSON."""


class PayloadTooLarge(PayloadError):
    """The encoded item can never fit in a bucket of ``bucket_max_bytes``."""


class DecodeError(BucketQError):
    """A stored bucket or item cannot be decoded."""


class DamagedBucket(DecodeError):
    """A stored bucket is damaged (its items do not decode, their count is not the
    bucket's, a field is missing or ill-typed). ``reason`` says what; ``bucket_id``
    (a bucket queue) or ``seq`` (a stream) says which, when known.

    A bucket queue sets such a bucket aside by itself (see ``Queue.quarantined()``);
    a stream consumer raises this so the gap in the order is never silent: call
    ``consumer.quarantine(seq)`` to set the bucket aside and go on."""

    def __init__(
        self, message: str, *, reason: str = "", bucket_id: object = None, seq: int | None = None
    ) -> None:
        super().__init__(message)
        self.reason = reason or message
        self.bucket_id = bucket_id
        self.seq = seq


class QueueClosed(BucketQError):
    """The queue was drained or closed; open a new one to go on."""


class QueueFull(BucketQError):
    """``max_pending_bytes`` of pushed items are waiting to be written."""


class PushFailed(BucketQError):
    """A bucket could not be inserted within the retry budget; its items were not stored."""


class WriteConcernNotConfirmed(PushFailed):
    """The item IS stored, but the server did not confirm the queue's write concern
    (e.g. ``{"w": 2}`` with fewer data-bearing nodes, or a ``wtimeout``). Do not push it
    again: that would store it twice."""


class LeaseLost(BucketQError):
    """The bucket's lease passed to another consumer; its items will be delivered there."""


class Fenced(LeaseLost):
    """A newer stream consumer opened; this one may no longer acknowledge anything."""


class AckOutOfOrder(BucketQError, ValueError):
    """A stream ack named a sequence number that is not the next one delivered and unacked."""


class OperationFailed(BucketQError):
    """A MongoDB operation failed; the driver's error is attached as ``__cause__``."""


class ServerUnavailable(OperationFailed):
    """MongoDB could not be reached (refused, no server selected, connection lost)."""


class OperationTimeout(OperationFailed, TimeoutError):
    """MongoDB did not answer within the operation's deadline (the server is unreachable,
    frozen or stalled); the queue's ``health()`` says since when. Nothing is lost: retry
    once the server answers."""


class EmbeddedServerError(BucketQError):
    """The embedded MongoDB-wire server could not be started or stopped."""


class Overloaded(BucketQError):
    """A limit on work in flight was reached (the ingest service's admission control):
    nothing was done; retry after ``retry_after`` seconds."""

    def __init__(self, message: str, retry_after: float, *, status: int = 503) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        #: The HTTP status the service answers with (503 overloaded, 429 too many of one thing).
        self.status = status


class NotSupported(BucketQError, NotImplementedError):
    """Something a Celery app asked of its broker needs a feature bucketq does not have
    (fan-out or topic exchanges, priorities); the message says what to do instead. Also a
    :class:`NotImplementedError`, as kombu's virtual transports say the same."""


class TransportError(BucketQError):
    """A reservoir transport failed."""


class TransportTimeout(TransportError):
    """A transport operation did not finish in time."""


class TransportUnavailable(TransportError):
    """The transport's backing service cannot be reached."""


class CircuitOpen(TransportError):
    """The circuit breaker is open; try again after ``retry_after`` seconds."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after
