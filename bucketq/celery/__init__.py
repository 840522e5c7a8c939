"""bucketq as a Celery broker: a kombu transport on bucketq queues.

A Celery app switches with its broker URL, ``bucketq://HOST[:PORT]/DATABASE`` or
``bucketq+`` followed by any MongoDB URI, once ``bucketq[celery]`` is installed (the
alias is registered when Python starts; see ``_alias``). Importing this package
registers it too. What maps to what, and what is refused: docs/celery.md.
"""

from .._deps import require

require("kombu", "celery")

import kombu.transport  # noqa: E402 - after the check that names the extra

from ._alias import ALIAS, TARGET, register  # noqa: E402
from ._core import BrokerOptions  # noqa: E402
from ._transport import Channel, QoS, Transport  # noqa: E402

register(kombu.transport)

__all__ = ["ALIAS", "TARGET", "BrokerOptions", "Channel", "QoS", "Transport", "register"]
