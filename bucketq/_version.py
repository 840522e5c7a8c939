"""The installed package's version, read from its metadata (pyproject.toml is the one place
it is written)."""

from __future__ import annotations


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as of

    try:
        return of("bucketq")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"
