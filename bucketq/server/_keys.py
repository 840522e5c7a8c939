"""API keys: ``bq_`` + 64 hex characters + an 8-hex checksum, stored only as their SHA-256.

The checksum is an HMAC of the rest of the key under a secret of the deployment (kept in
the ``api_keys.checksum`` collection, made with the first key): the service rejects a key
whose checksum is wrong without a database call, so a flood of invented keys costs no
lookups and cannot crowd out a real key's first use. Keys made before the checksum
(``bq_`` + 64 hex characters) still work: they are looked up, within
``BUCKETQ_KEY_LOOKUPS_PER_S`` (a flood of invented keys of that form is refused 429
beyond it, and says so).

The pure part makes keys, checks and hashes them and builds the documents; :class:`KeyCache`
resolves a key to its project with a lookup cached for at most ``key_cache_ms``
(so a revoked key stops working within a second); the ``*_key(s)`` functions are the
synchronous admin operations behind ``bucketq keys``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..errors import ConfigurationError, OperationTimeout, Overloaded

#: The collection holding the keys (in the service's database).
KEYS_COLLECTION = "api_keys"
#: The collection holding the checksums' secret (one document, :data:`SECRET_ID`).
SECRET_COLLECTION = "api_keys.checksum"
SECRET_ID = "checksum"
KEY_PREFIX = "bq_"
#: Hex characters of a key's random part, and of its checksum.
RANDOM_HEX = 64
CHECK_HEX = 8
#: Characters of a key shown by ``keys list`` and accepted by ``keys revoke``.
SHOWN = len(KEY_PREFIX) + 8
#: Known keys remembered at most, and unknown keys remembered at most (each its own LRU).
DEFAULT_CACHE_SIZE = 10_000
#: Lookups per second of keys without a checksum in neither map (a token bucket of as
#: many tokens).
DEFAULT_LOOKUPS_PER_S = 200
#: Lookups of keys in neither map in flight at once (keys with a checksum and keys without
#: one each have as many).
DEFAULT_LOOKUP_CONCURRENCY = 32
#: A key's format: with a checksum, or made before keys had one.
CHECKED, LEGACY = "checked", "legacy"
_KEY = re.compile(rf"^bq_[0-9a-f]{{{RANDOM_HEX}}}(?:[0-9a-f]{{{CHECK_HEX}}})?$")
_PROJECT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def new_key(secret: bytes) -> str:
    """A new key, its checksum made with the deployment's ``secret``."""
    body = KEY_PREFIX + secrets.token_hex(RANDOM_HEX // 2)
    return body + checksum(secret, body)


def checksum(secret: bytes, body: str) -> str:
    return hmac.new(secret, body.encode(), hashlib.sha256).hexdigest()[:CHECK_HEX]


def key_format(key: str) -> str | None:
    """:data:`CHECKED`, :data:`LEGACY` or None (not a key bucketq made)."""
    if not _KEY.match(key):
        return None
    return CHECKED if len(key) == len(KEY_PREFIX) + RANDOM_HEX + CHECK_HEX else LEGACY


def checksum_ok(secret: bytes, key: str) -> bool:
    """Whether a :data:`CHECKED` key's checksum is right under ``secret``."""
    body, given = key[:-CHECK_HEX], key[-CHECK_HEX:]
    return hmac.compare_digest(checksum(secret, body), given)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def looks_like_key(key: str) -> bool:
    return key_format(key) is not None


def secret_document() -> dict[str, Any]:
    return {"_id": SECRET_ID, "secret": secrets.token_bytes(32), "created_at": datetime.now(UTC)}


def secret_collection(db: Any) -> Any:
    """The secret's collection, written with a journaled write concern: a secret lost
    after it was used would leave every key made with it failing its checksum."""
    from pymongo import WriteConcern

    return db.get_collection(SECRET_COLLECTION, write_concern=WriteConcern(j=True))


def check_project(project: str) -> str:
    if not isinstance(project, str) or not _PROJECT.match(project):
        raise ConfigurationError(
            f"project must be 1-100 letters, digits, '.', '_' or '-' (starting with a letter or digit); got {project!r}."
        )
    return project


#: The ``project`` of an operator key: it opens the console and writes to no project.
OPERATOR = "*operator*"


def key_document(
    key: str, project: str, name: str = "", *, operator: bool = False
) -> dict[str, Any]:
    doc = {
        "_id": hash_key(key),
        "prefix": key[:SHOWN],
        "project": OPERATOR if operator else check_project(project),
        "name": name,
        "created_at": datetime.now(UTC),
        "revoked_at": None,
    }
    if operator:
        doc["operator"] = True
    return doc


@dataclass(frozen=True, slots=True)
class KeyInfo:
    project: str
    prefix: str
    revoked: bool
    operator: bool = False


#: What a lookup ended as (the ``result`` label of ``bucketq_key_lookups_total``):
#: ``bad_checksum`` and ``refused`` made no database call.
LOOKUP_RESULTS = ("found", "unknown", "failed", "refused", "bad_checksum")


class KeyCache:
    """Resolve a presented key to :class:`KeyInfo` (or None when unknown), reading the
    ``api_keys`` collection of a pymongo ``AsyncDatabase`` at most once per ``ttl``
    seconds per key.

    A lookup is shared: while one is in flight for a key, every other request with that
    key awaits it instead of sending its own. Without that, when the entry expires under
    load every concurrent request misses at once, each sends a ``find``, and on a slow
    storage server the lookups outlive the ``ttl`` so that every request keeps missing.
    The entry is stamped with the lookup's start,
    so a revoked key still stops working within ``ttl`` of its revocation being read.

    Every wait is bounded by the caller's ``timeout`` (its request's remaining budget):
    past it the lookup raises ``OperationTimeout``. While MongoDB does not answer, a key
    looked up before keeps its last known state (after half the budget), so a buffer with its own transport
    (redis, memory) goes on accepting records; a key never seen raises.

    Known and unknown keys are remembered in two LRU maps of ``size`` entries each, so a
    flood of invented keys never evicts a known one. A key in neither (a "cold" lookup:
    the only kind an attacker with random keys can cause) is checked before it costs a
    lookup: a key with a wrong checksum is unknown at once (the deployment's secret is
    read once, at the first such key); one with a right checksum takes one of
    ``concurrency`` slots; a key without a checksum (made before keys had one) takes a
    token of a bucket refilled at ``lookups_per_s`` and one of ``concurrency`` slots of
    its own. Without either it raises ``Overloaded`` (429) at once, with no database
    call, and saying which limit it met: invented keys of the old form can exhaust the
    old form's limit, never the checked keys'. Refreshes of known keys are not limited:
    there are at most ``size`` of them per ``ttl``."""

    def __init__(
        self,
        db: Any,
        *,
        ttl: float = 1.0,
        size: int = DEFAULT_CACHE_SIZE,
        lookups_per_s: float = DEFAULT_LOOKUPS_PER_S,
        concurrency: int = DEFAULT_LOOKUP_CONCURRENCY,
        retry_after: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        counted: Callable[[str], None] | None = None,
    ) -> None:
        self.col = db.get_collection(KEYS_COLLECTION)
        self.secret_col = secret_collection(db)
        self.ttl = ttl
        self.size = size
        self.rate = float(lookups_per_s)
        self.concurrency = concurrency
        self.retry_after = retry_after
        self.clock = clock
        #: Called with each lookup's result (one of :data:`LOOKUP_RESULTS`).
        self.counted = counted or (lambda _result: None)
        self._known: OrderedDict[str, tuple[float, KeyInfo]] = OrderedDict()
        self._unknown: OrderedDict[str, float] = OrderedDict()
        self._inflight: dict[str, asyncio.Task[KeyInfo | None]] = {}
        self._cold = {CHECKED: 0, LEGACY: 0}  # cold lookups in flight, by key format
        self._tokens = self.rate
        self._refilled = clock()
        self._secret: bytes | None = None
        self._secret_task: asyncio.Task[bytes] | None = None

    async def lookup(self, key: str, timeout: float = 5.0) -> KeyInfo | None:
        form = key_format(key)
        if form is None:
            return None  # never reaches the database
        h = hash_key(key)
        now = self.clock()
        hit = self._known.get(h)
        if hit is not None:
            self._known.move_to_end(h)
            if now - hit[0] < self.ttl:
                return hit[1]
        else:
            seen = self._unknown.get(h)
            if seen is not None and now - seen < self.ttl:
                return None
            if form == CHECKED:
                started = self.clock()
                if not checksum_ok(await self.secret(timeout), key):
                    self.counted("bad_checksum")
                    return None
                timeout = max(0.001, timeout - (self.clock() - started))
        task = self._inflight.get(h)
        if task is None:
            pool = form if hit is None else None
            if pool is not None:
                self._admit_cold(self.clock(), pool)
            # A task of its own: a caller that is cancelled (its client went away) does
            # not cancel the lookup the others wait for.
            task = self._inflight[h] = asyncio.ensure_future(self._fetch(h, timeout, pool))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved
        # A known key waits for its refresh half of the budget at most: past it, its last
        # known state answers and the rest of the budget is the request's storage's.
        wait = timeout if hit is None else timeout / 2
        try:
            return await asyncio.wait_for(asyncio.shield(task), max(wait, 0.001))
        except Exception as exc:
            if hit is not None:
                return hit[1]
            if isinstance(exc, TimeoutError) and not isinstance(exc, OperationTimeout):
                raise OperationTimeout(
                    f"The key store did not answer within {timeout:.3g} s."
                ) from exc
            raise

    async def secret(self, timeout: float) -> bytes:
        """The deployment's checksum secret: read (made, the first time) once, shared by
        the callers waiting for it; a read that fails is tried again by the next caller."""
        if self._secret is not None:
            return self._secret
        if self._secret_task is None or self._secret_task.done():
            self._secret_task = asyncio.ensure_future(self._read_secret(timeout))
            self._secret_task.add_done_callback(lambda t: t.cancelled() or t.exception())
        try:
            self._secret = await asyncio.wait_for(asyncio.shield(self._secret_task),
                                                  max(timeout, 0.001))  # fmt: skip
        except TimeoutError as exc:
            raise OperationTimeout(f"The key store did not answer within {timeout:.3g} s.") from exc
        return self._secret

    async def _read_secret(self, timeout: float) -> bytes:
        from pymongo import timeout as mongo_timeout
        from pymongo.errors import DuplicateKeyError

        with mongo_timeout(max(timeout, 0.001)):
            doc = await self.secret_col.find_one({"_id": SECRET_ID})
            if doc is None:
                try:
                    await self.secret_col.insert_one(secret_document())
                except DuplicateKeyError:
                    pass  # made meanwhile (another process, `bucketq keys create`)
                doc = await self.secret_col.find_one({"_id": SECRET_ID})
        return _secret_of(doc)

    def _admit_cold(self, now: float, form: str) -> None:
        if form == LEGACY:
            self._tokens = min(self.rate, self._tokens + (now - self._refilled) * self.rate)
            self._refilled = now
            if self._tokens < 1 or self._cold[LEGACY] >= self.concurrency:
                self.counted("refused")
                raise Overloaded(
                    "Too many lookups of API keys not seen before in the old form, without a "
                    "checksum (BUCKETQ_KEY_LOOKUPS_PER_S): this key is one of them. Make a "
                    "new key with `bucketq keys create` (its checksum spares it this limit) "
                    "and revoke this one",
                    self.retry_after,
                    status=429,
                )
            self._tokens -= 1
        elif self._cold[CHECKED] >= self.concurrency:
            self.counted("refused")
            raise Overloaded(
                f"Too many lookups of API keys not seen before at once ({self.concurrency})",
                self.retry_after,
                status=429,
            )

    async def _fetch(self, h: str, timeout: float, pool: str | None) -> KeyInfo | None:
        """One lookup; ``pool``: the cold lookups' slots it holds meanwhile (a key's format),
        None for a known key's refresh."""
        from pymongo import timeout as mongo_timeout

        now = self.clock()
        if pool is not None:
            self._cold[pool] += 1
        try:
            # pymongo's own deadline as well as the caller's: the connection is then not
            # left waiting on a server that does not answer.
            with mongo_timeout(max(timeout, 0.001)):
                doc = await self.col.find_one(
                    {"_id": h}, {"project": 1, "prefix": 1, "revoked_at": 1, "operator": 1}
                )
        except Exception:
            self.counted("failed")
            raise
        finally:
            if pool is not None:
                self._cold[pool] -= 1
            self._inflight.pop(h, None)
        if doc is None:
            self.counted("unknown")
            self._known.pop(h, None)
            self._remember(self._unknown, h, now)
            return None
        self.counted("found")
        info = KeyInfo(
            doc["project"],
            doc.get("prefix", ""),
            doc.get("revoked_at") is not None,
            bool(doc.get("operator")),
        )
        self._unknown.pop(h, None)
        self._remember(self._known, h, (now, info))  # kept even with ttl 0: the last known state
        return info

    def _remember(self, lru: OrderedDict[str, Any], h: str, value: Any) -> None:
        lru[h] = value
        lru.move_to_end(h)
        while len(lru) > self.size:
            lru.popitem(last=False)


# -- admin (synchronous pymongo, for the command line) ------------------------------------


def _secret_of(doc: Any) -> bytes:
    secret = doc.get("secret") if isinstance(doc, dict) else None
    if not isinstance(secret, bytes) or len(secret) < 16:
        raise ConfigurationError(
            f"The API keys' checksum secret in the collection {SECRET_COLLECTION!r} is "
            "missing or damaged: restore its document from a backup. Deleting it makes a new "
            "secret, under which every key made before fails its checksum (make them anew)."
        )
    return secret


def checksum_secret(db: Any) -> bytes:
    """The deployment's checksum secret, made the first time (synchronous pymongo)."""
    from pymongo.errors import DuplicateKeyError

    col = secret_collection(db)
    doc = col.find_one({"_id": SECRET_ID})
    if doc is None:
        try:
            col.insert_one(secret_document())
        except DuplicateKeyError:
            pass  # made meanwhile
        doc = col.find_one({"_id": SECRET_ID})
    return _secret_of(doc)


def create_key(db: Any, project: str, name: str = "", *, operator: bool = False) -> str:
    """Store a new key for ``project`` (or, ``operator``, a console key) and return it
    (the only time it is seen in clear)."""
    key = new_key(checksum_secret(db))
    db.get_collection(KEYS_COLLECTION).insert_one(
        key_document(key, project, name, operator=operator)
    )
    return key


def list_keys(db: Any, project: str | None = None) -> list[dict[str, Any]]:
    flt = {} if project is None else {"project": project}
    return list(
        db.get_collection(KEYS_COLLECTION)
        .find(
            flt, {"_id": 0, "prefix": 1, "project": 1, "name": 1, "created_at": 1, "revoked_at": 1}
        )
        .sort("created_at", 1)
    )


def revoke_key(db: Any, given: str) -> dict[str, Any]:
    """Revoke the one key whose shown prefix starts with ``given`` (or which is ``given``).
    Raises ConfigurationError when none or several match."""
    given = given.strip()
    col = db.get_collection(KEYS_COLLECTION)
    if looks_like_key(given):
        matches = list(col.find({"_id": hash_key(given)}))
    else:
        if len(given) < len(KEY_PREFIX) + 4 or not given.startswith(KEY_PREFIX):
            raise ConfigurationError(
                f"KEY_PREFIX must be the start of a key as `bucketq keys list` shows it "
                f"(at least {len(KEY_PREFIX) + 4} characters, e.g. bq_1a2b); got {given!r}."
            )
        matches = list(col.find({"prefix": {"$regex": "^" + re.escape(given[:SHOWN])}}))
    if not matches:
        raise ConfigurationError(f"No key starts with {given!r}; see `bucketq keys list`.")
    if len(matches) > 1:
        raise ConfigurationError(
            f"{len(matches)} keys start with {given!r}; give more characters of the key."
        )
    doc = matches[0]
    if doc.get("revoked_at") is None:
        doc["revoked_at"] = datetime.now(UTC)
        col.update_one({"_id": doc["_id"]}, {"$set": {"revoked_at": doc["revoked_at"]}})
    return {k: doc.get(k) for k in ("prefix", "project", "name", "revoked_at")}


#: Each project's settings (``{_id: project, retention_days}``): kept beside its keys.
PROJECTS_COLLECTION = "api_keys.projects"


def set_retention(db: Any, project: str, days: int) -> None:
    """Keep ``project``'s log records ``days`` days (0: forever); ``bucketq serve`` takes
    it within a minute, for the buckets it writes and the ones stored."""
    if not isinstance(days, int) or isinstance(days, bool) or days < 0:
        raise ConfigurationError(f"days must be a whole number, 0 or more; got {days!r}.")
    db.get_collection(PROJECTS_COLLECTION).update_one(
        {"_id": check_project(project)}, {"$set": {"retention_days": days}}, upsert=True
    )


def retention_settings(db: Any) -> dict[str, int]:
    """Each project's retention in days, where one was set (0: forever)."""
    return {
        str(d["_id"]): int(d["retention_days"])
        for d in db.get_collection(PROJECTS_COLLECTION).find({}, {"retention_days": 1})
        if isinstance(d.get("retention_days"), int)
    }
