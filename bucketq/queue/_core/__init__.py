"""The bucket queue's decisions, with no I/O, one module per seam:

- ``messages``: ``Message``, which message a commit or rollback may take;
- ``claims``: the claim, leases no one holds, partitions and a consumer's rotation;
- ``held``: a claimed bucket's state in this process and the state flush's plan;
- ``redelivery``: a rolled-back item's next time, the over-tried rule, dead letters;
- ``counts``: size queries, the drain report, the stats counters;
- ``element``: the per-element baseline (one document per item).

The sync and async shells (``_sync/``, ``_async/``) build a request with these, make
one driver call, and hand the answer back here; they reach every module's names
through this package (``from .. import _core as core``), and what every queue kind
shares (options, times, packing, the write path) through the bucket kernel
(``from ... import bucket``).
"""

from .claims import *  # noqa: F403
from .counts import *  # noqa: F403
from .element import *  # noqa: F403
from .held import *  # noqa: F403
from .messages import *  # noqa: F403
from .redelivery import *  # noqa: F403
