"""``bucketq keys create --operator``: a console key, told apart from project keys."""

from __future__ import annotations

from pymongo import AsyncMongoClient

from bucketq.cli import main
from bucketq.server._keys import KeyCache


async def test_an_operator_key_is_stored_as_one_and_looked_up_as_one(db, mongo_uri, capsys):
    args = ["--mongodb-uri", mongo_uri, "--database", db.name]
    assert main(["keys", "create", *args]) == 1  # neither --project nor --operator
    assert main(["keys", "create", "--operator", "--project", "shop", *args]) == 1
    assert "--operator" in capsys.readouterr().err
    assert main(["keys", "create", "--operator", *args]) == 0
    key = capsys.readouterr().out.strip().splitlines()[-1]
    assert main(["keys", "create", "--project", "shop", *args]) == 0
    project_key = capsys.readouterr().out.strip().splitlines()[-1]
    assert main(["keys", "list", *args]) == 0
    rows = capsys.readouterr().out.strip().splitlines()[1:]  # under the header
    assert sorted(row.split()[1] for row in rows) == ["*operator*", "shop"]
    client: AsyncMongoClient = AsyncMongoClient(mongo_uri)
    try:
        cache = KeyCache(client[db.name])
        op, proj = await cache.lookup(key), await cache.lookup(project_key)
        assert op is not None and op.operator and not op.revoked
        assert proj is not None and not proj.operator and proj.project == "shop"
    finally:
        await client.close()
