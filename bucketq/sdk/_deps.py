"""Lazy import of the SDK's HTTP library (the ``sdk`` extra)."""

from __future__ import annotations

from .._deps import requirer

require = requirer("The logging SDK", "bucketq[sdk]")
