"""Check the database object handed to a queue, with a message that says what to pass."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigurationError


def _describe(db: Any) -> str:
    return f"{type(db).__module__}.{type(db).__qualname__}"


def check_async_database(db: Any) -> Any:
    from pymongo.asynchronous.database import AsyncDatabase

    if isinstance(db, AsyncDatabase):
        return db
    mod = type(db).__module__
    if mod.startswith("motor"):
        raise ConfigurationError(
            "AsyncQueue takes a pymongo AsyncDatabase; Motor is past its end of life. Pass "
            "pymongo.AsyncMongoClient(uri)[db_name] instead of a Motor database."
        )
    if mod.startswith("pymongo"):
        raise ConfigurationError(
            f"AsyncQueue takes a pymongo AsyncDatabase, not {_describe(db)}. Use Queue for a "
            "synchronous MongoClient, or pass pymongo.AsyncMongoClient(uri)[db_name]."
        )
    raise ConfigurationError(
        f"AsyncQueue takes a pymongo AsyncDatabase, such as pymongo.AsyncMongoClient(uri)[db_name]; "
        f"got {_describe(db)}."
    )


def check_database(db: Any) -> Any:
    from pymongo.synchronous.database import Database

    if isinstance(db, Database):
        return db
    mod = type(db).__module__
    if mod.startswith(("motor", "pymongo.asynchronous")):
        raise ConfigurationError(
            f"Queue takes a synchronous pymongo Database, not {_describe(db)}. Use AsyncQueue "
            "with pymongo.AsyncMongoClient, or pass pymongo.MongoClient(uri)[db_name]."
        )
    if mod.startswith("mongomock"):
        raise ConfigurationError(
            "mongomock cannot serve a queue: its updates are not atomic. Use a real MongoDB, "
            "or the embedded server (`bucketq store`, or bucketq.embedded.EmbeddedServer)."
        )
    raise ConfigurationError(
        f"Queue takes a pymongo Database, such as pymongo.MongoClient(uri)[db_name]; got {_describe(db)}."
    )
