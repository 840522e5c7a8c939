"""The service's ASGI middleware, one concern each; ``create_app`` stacks them (outermost
first): :class:`RequestId`, :class:`Observe`, :class:`RequestHead`, :class:`LastResort`,
:class:`BodyLimit`."""

from .body_limit import BodyLimit
from .last_resort import LastResort
from .observe import HttpMetrics, Observe
from .request_head import RequestHead
from .request_id import RequestId

__all__ = ["BodyLimit", "HttpMetrics", "LastResort", "Observe", "RequestHead", "RequestId"]
