"""What the commands share: argparse ``type=`` functions that read text as settings do,
the one ``--mongodb-uri`` option with its rule, and deprecated command names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import ConfigurationError
from .checks import MONGODB_SCHEMES, count, number, url
from .options import MONGODB_URI_ENV, env_mongodb_uri, parse


def cli_type(check: Callable[..., Any], what: str, **limits: Any) -> Any:
    """An argparse ``type`` that reads the text as settings do (:func:`parse`): the same
    reader and check, argparse's error without the option's name (argparse adds it)."""
    import argparse

    def read(text: str) -> Any:
        try:
            return parse(check, "it", text, **limits)
        except ConfigurationError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix("it ").rstrip(".")) from None

    read.__name__ = what
    return read


def cli_count(lo: int = 0, hi: int | None = None) -> Any:
    """An argparse ``type`` for a whole number in ``[lo, hi]``."""
    return cli_type(count, "whole number", lo=lo, hi=hi)


def cli_number(
    lo: float | None = 0.0, hi: float | None = None, *, open_lo: bool = False, unit: str = ""
) -> Any:
    """An argparse ``type`` for a finite number in ``[lo, hi]`` (``(lo, hi]`` when
    ``open_lo``): never NaN or infinity."""
    return cli_type(number, "number", lo=lo, hi=hi, open_lo=open_lo, unit=unit)


def cli_count_list(lo: int = 1) -> Any:
    """An argparse ``type`` for a comma-separated list of whole numbers >= ``lo``."""
    import argparse

    one = cli_count(lo)

    def parse(text: str) -> list[int]:
        values = [one(x.strip()) for x in text.split(",") if x.strip()]
        if not values:
            raise argparse.ArgumentTypeError(f"must be whole numbers like 1,2,4; got {text!r}")
        return values

    return parse


def cli_url(*schemes: str) -> Any:
    """An argparse ``type`` for a URL with one of ``schemes``."""
    import argparse

    def parse(text: str) -> str:
        try:
            return url("the URL", text, schemes, optional=True)
        except ConfigurationError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix("the URL ")) from None

    return parse


def deprecated_alias(
    subparsers: Any, old: str, new: str, dest: str, build: Callable[[Any], Any]
) -> Any:
    """Add ``old`` to ``subparsers`` as a hidden alias of the command ``new`` (argparse
    lists a command only when it has a help text): ``build(parser)`` adds the command's
    arguments and its ``func``; ``dest`` becomes ``new``'s name, so the command runs as
    itself, after one line on stderr that names the new spelling. Old spellings are kept
    so for a release. The caller gives ``subparsers`` a ``metavar`` of the shown names."""
    import sys

    p = subparsers.add_parser(old)
    build(p)
    func = p.get_default("func")
    prog = p.prog.rsplit(" ", 1)[0]

    def run(args: Any) -> Any:
        print(f"{prog} {old}: deprecated, use `{prog} {new}` (the old name goes in a later "
              "release)", file=sys.stderr)  # fmt: skip
        return func(args)

    p.set_defaults(func=run, **{dest: new})
    return p


#: The fallbacks a command's ``--mongodb-uri`` help names after ``$BUCKETQ_MONGODB_URI``.
FROM_STORE = "the embedded store of a running `bucketq store` or `bucketq serve`"
STARTS_ONE = "an embedded store started for the run"


def add_mongodb_uri(
    p: Any, fallback: str = FROM_STORE, *flags: str, dest: str = "mongodb_uri"
) -> None:
    """Add the one ``--mongodb-uri`` option to the argparse parser ``p``: checked as a
    mongodb:// URL; ``fallback`` says what the command uses when neither it nor
    ``$BUCKETQ_MONGODB_URI`` is given (docs/operations.md, "Which MongoDB a command uses");
    ``flags`` are other spellings the command kept."""
    p.add_argument("--mongodb-uri", *flags, dest=dest, type=cli_url(*MONGODB_SCHEMES),
                   default=None, metavar="URI",
                   help=f"MongoDB URI (default: ${MONGODB_URI_ENV}, else {fallback})")  # fmt: skip


def mongodb_uri(given: str | None, *, running_store: bool = True) -> str:
    """Which MongoDB a command uses: ``given`` (its ``--mongodb-uri``), else
    ``$BUCKETQ_MONGODB_URI``, else (``running_store``) the URI file of the embedded store
    a running ``bucketq store`` or ``bucketq serve`` is starting or runs; "" when none
    (the command then starts a store or says so). The one rule, for every command."""
    uri = given or env_mongodb_uri()
    if not uri and running_store:
        from ..embedded import embedded_uri

        uri = embedded_uri() or ""
    return uri


def require_mongodb_uri(given: str | None, purpose: str) -> str:
    """:func:`mongodb_uri`, or :class:`~bucketq.errors.BucketQError` saying the three
    ways to give one when there is none (``purpose``: "read", "consume from", ...)."""
    from ..errors import BucketQError

    uri = mongodb_uri(given)
    if not uri:
        raise BucketQError(
            f"No MongoDB to {purpose}: give --mongodb-uri, set {MONGODB_URI_ENV}, or start "
            "the embedded store first (`bucketq store`, or `bucketq serve`)."
        )
    return uri
