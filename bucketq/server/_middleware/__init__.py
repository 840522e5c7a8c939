"""The service's ASGI middleware, one concern each; ``create_app`` stacks them (outermost
first): :class:`AnswerHeaders`, :class:`RequestId`, :class:`Observe`, :class:`RequestHead`,
:class:`LastResort`, :class:`BodyLimit` (with admission control between the last two)."""

from .answer_headers import AnswerHeaders
from .body_limit import BodyLimit
from .last_resort import LastResort
from .observe import HttpMetrics, Observe
from .request_head import RequestHead
from .request_id import RequestId

__all__ = [
    "AnswerHeaders",
    "BodyLimit",
    "HttpMetrics",
    "LastResort",
    "Observe",
    "RequestHead",
    "RequestId",
]
