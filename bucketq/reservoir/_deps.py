"""Lazy imports of the reservoir's optional dependencies (the ``reservoir`` extra)."""

from __future__ import annotations

from .._deps import requirer

require = requirer("The reservoir buffer", "bucketq[reservoir]")
