from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pymongo import MongoClient

from bucketq.server import _keys

from .helpers import Serve


@pytest.fixture(scope="session")
def server_db(mongo_uri: str, mongo_client: MongoClient) -> Iterator[str]:
    name = f"bqs_{uuid.uuid4().hex[:10]}"
    yield name
    mongo_client.drop_database(name)


@pytest.fixture(scope="session")
def serve(
    mongo_uri: str, server_db: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Serve]:
    """One ``bucketq serve`` (buffer off) shared by the service's tests."""
    s = Serve(mongo_uri, server_db, Path(tmp_path_factory.mktemp("serve")) / "serve.log").start()
    yield s
    s.terminate()


@pytest.fixture(scope="session")
def keys(mongo_client: MongoClient, server_db: str):
    """Make a key for a project directly in the service's database."""

    def make(project: str) -> str:
        return _keys.create_key(mongo_client[server_db], project)

    return make
