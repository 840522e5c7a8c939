# GENERATED from bucketq/queue/_async/sizes.py by scripts/unasync.py. Do not edit;
# edit the async file and run `python scripts/unasync.py`.
"""What both queue classes answer about what is stored: ``size()``, ``total_size()``,
``sched_size()``, ``resv_size()`` and ``next_t()``, written once. Which documents each
looks at is ``_core``'s filters; a class says how it counts the items of the documents
that match (``_count``: a bucket holds many, an element one) and how its reads are
bounded (``_read_bounded``).

The async file is the source; ``scripts/unasync.py`` generates the sync twin from it.
"""

from __future__ import annotations

import time
from typing import Any

from ... import bucket
from ..._driver import boundary
from .. import _core as core

_now = time.time


class Sizes:
    """Base of the queue classes' size questions; see the module docstring."""

    _col: Any

    def _count(self, flt: dict[str, Any]) -> int:
        """The items of the documents that match ``flt`` (not yet consumed)."""
        raise NotImplementedError

    def _read_bounded(self, what: str) -> Any:
        """A context in which the driver calls get ``op_timeout`` (a timeout names ``what``)."""
        raise NotImplementedError

    @boundary("size()")
    def size(self) -> int:
        """Items ready to be delivered now (stored, mature, not leased)."""
        return self._count(core.ready_filter(_now()))

    @boundary("total_size()")
    def total_size(self) -> int:
        """Every stored item not yet consumed."""
        return self._count({})

    @boundary("sched_size()")
    def sched_size(self) -> int:
        """Stored items not yet mature."""
        return self._count(core.sched_filter(_now()))

    @boundary("resv_size()")
    def resv_size(self) -> int:
        """Stored items leased by a consumer."""
        return self._count(core.leased_filter(_now()))

    @boundary("next_t()")
    def next_t(self) -> Any:
        """The mature time of the next item to become deliverable (None if empty)."""
        with self._read_bounded("next_t()"):
            doc = self._col.find_one(
                bucket.not_leased(bucket.to_datetime(_now())),
                {"mature": 1},
                sort=bucket.CLAIM_SORT,
            )
        return doc["mature"] if doc else None
