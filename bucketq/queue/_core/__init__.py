"""The queue's decisions, with no I/O, one module per seam:

- ``options``: defaults, limits, ``QueueOptions``, the checks of names and arguments;
- ``times``: epoch seconds in memory, BSON datetimes in MongoDB, a push's mature time;
- ``messages``: ``Message``, item ids, which message a commit or rollback may take;
- ``packing``: open buckets, packing pushed items and sealing buckets, their documents;
- ``writes``: a write's outcome, transient errors, the backoff between tries, a server
  without change streams and the change-stream watcher's timings;
- ``claims``: the claim, leases no one holds, partitions and a consumer's rotation;
- ``held``: a claimed bucket's state in this process and the state flush's plan;
- ``redelivery``: a rolled-back item's next time, the over-tried rule, dead letters;
- ``counts``: size queries, the drain report, the stats counters;
- ``element``: the per-element baseline (one document per item).

The sync and async shells (``_sync/``, ``_async/``) build a request with these, make
one driver call, and hand the answer back here; they reach every module's names
through this package (``from .. import _core as core``). Tests and other packages
import from the module that makes the decision.
"""

from .claims import *  # noqa: F403
from .counts import *  # noqa: F403
from .element import *  # noqa: F403
from .held import *  # noqa: F403
from .messages import *  # noqa: F403
from .options import *  # noqa: F403
from .packing import *  # noqa: F403
from .redelivery import *  # noqa: F403
from .times import *  # noqa: F403
from .writes import *  # noqa: F403
