"""The service's ASGI middleware, one concern each; ``create_app`` stacks them (outermost
first): :class:`RequestId`, :class:`Observe`, :class:`LastResort`, :class:`BodyLimit`,
:class:`JsonBody`."""

from .body_limit import BodyLimit
from .json_body import JsonBody
from .last_resort import LastResort
from .observe import HttpMetrics, Observe
from .request_id import RequestId

__all__ = ["BodyLimit", "HttpMetrics", "JsonBody", "LastResort", "Observe", "RequestId"]
