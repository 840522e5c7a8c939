"""The bucket kernel: what every bucket-packing queue kind shares, under ``bucketq.queue``
(the bucket queue) and ``bucketq.stream`` (ordered stream mode).

- the bucket document: its fields and item ids (``document``), the item codec
  (``codec``), item values between BSON and JSON (``convert``), damage checks and
  quarantine records (``damage``);
- options, limits and name checks (``options``), times (``times``), packing pushed
  items into buckets (``packing``);
- the write path: a write's outcome, transient errors, the back-off between tries and
  the write-concern rule (``writes``), deadlines and health (``deadline``);
- the sync and async primitives (``concurrency``) and the database check (``db``);
- the I/O shells both kinds compose, in both flavours: the producer, the runtime (its
  background loops and health), the change-stream watcher, quarantine and closing.

Each module here is public to the packages above it (``queue``, ``stream``, ``spark``,
``reservoir``, ``server``, ``sdk``, the benchmarks); this package names their common
names once. It imports nothing above it (``scripts/check_layers.py`` enforces that).
The async files in ``_async/`` are the source; ``scripts/unasync.py`` generates ``_sync/``.
"""

from typing import TYPE_CHECKING

from .. import _lazy
from .codec import *  # noqa: F403
from .concurrency import AsyncReceipt as AsyncReceipt
from .concurrency import Receipt as Receipt
from .damage import *  # noqa: F403
from .document import *  # noqa: F403
from .options import *  # noqa: F403
from .packing import *  # noqa: F403
from .times import *  # noqa: F403
from .writes import *  # noqa: F403

# The I/O shells load on first use (PEP 562), each flavour on its own: a process that
# uses one (a Spark Python worker uses the sync one) does not import the other.
_LAZY = {
    "AsyncClosing": "._async.closing",
    "AsyncProducer": "._async.producer",
    "AsyncQuarantine": "._async.quarantine",
    "AsyncRuntime": "._async.runtime",
    "AsyncWakeWatcher": "._async.wake",
    "Closing": "._sync.closing",
    "Producer": "._sync.producer",
    "Quarantine": "._sync.quarantine",
    "Runtime": "._sync.runtime",
    "WakeWatcher": "._sync.wake",
}

if TYPE_CHECKING:
    from ._async.closing import AsyncClosing as AsyncClosing
    from ._async.producer import AsyncProducer as AsyncProducer
    from ._async.quarantine import AsyncQuarantine as AsyncQuarantine
    from ._async.runtime import AsyncRuntime as AsyncRuntime
    from ._async.wake import AsyncWakeWatcher as AsyncWakeWatcher
    from ._sync.closing import Closing as Closing
    from ._sync.producer import Producer as Producer
    from ._sync.quarantine import Quarantine as Quarantine
    from ._sync.runtime import Runtime as Runtime
    from ._sync.wake import WakeWatcher as WakeWatcher


__getattr__, __dir__ = _lazy.attributes(__name__, _LAZY, _LAZY)
