"""bucketq as a Celery broker: a kombu transport on bucketq queues.

A Celery app switches with its broker URL, ``bucketq://HOST[:PORT]/DATABASE`` or
``bucketq+`` followed by any MongoDB URI, once ``bucketq[celery]`` is installed: the
wheel's ``.pth`` line registers the alias when Python starts (``site-packages/`` here holds
what it installs). Importing this package registers it too. What maps to what, and what
is refused: docs/celery.md.
"""

from .._deps import require

require("kombu", "celery")

import kombu.transport  # noqa: E402 - after the check that names the extra

from ._core import ALIAS, TARGET, BrokerOptions  # noqa: E402
from ._transport import Channel, QoS, Transport  # noqa: E402


def register() -> None:
    """Make ``bucketq://`` (and ``bucketq+mongodb://...``) a kombu transport."""
    kombu.transport.TRANSPORT_ALIASES.setdefault(ALIAS, TARGET)


register()

__all__ = ["ALIAS", "TARGET", "BrokerOptions", "Channel", "QoS", "Transport", "register"]
