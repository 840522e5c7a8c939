"""Checks of every option and argument where it enters bucketq, in one pure place.

Each check takes the argument's name and value and returns the value (converted
where that is safe, e.g. a float for a number option); a bad value raises
:class:`~bucketq.errors.ConfigurationError` whose message names the argument and the
accepted range. Booleans are never counts or seconds, and NaN or infinity is never a
number of anything.

The one configuration mechanism: an option is declared once, beside its field, with
:func:`option` (its default, its check and the check's limits; for an environment
variable or a string option also its name and help). The same check serves keyword
arguments (:func:`check_options`), environment variables (:func:`read_env`) and Spark's
string options (:func:`read_text`): text is first read by the check's type (one reader
per check: :func:`parse`), so ``1_000`` is a thousand everywhere. :func:`settings` lists
a configuration's variables and :func:`settings_table` renders them for the docs. No I/O
besides reading the environment mapping given.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

from .errors import ConfigurationError

#: The longest any time option may be (30 days, in seconds): longer is a mistake in
#: units, and a background loop's wait must stay within what a thread can wait.
MAX_OPTION_SECONDS = 30 * 86400.0
#: The longest ``delay`` of a push or rollback (100 years, in seconds).
MAX_DELAY = 100 * 365 * 86400.0
#: The latest ``mature`` / ``next_t`` (the end of year 9999, the last a BSON datetime
#: and Python's datetime share), in seconds since the epoch.
MAX_TIMESTAMP = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()


def _fail(name: str, need: str, value: Any) -> ConfigurationError:
    return ConfigurationError(f"{name} must be {need}; got {value!r}.")


def _n(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _range(lo: float | None, hi: float | None, *, open_lo: bool, unit: str) -> str:
    u = f" {unit}" if unit else ""
    if lo is not None and hi is not None:
        if open_lo:
            return f"greater than {_n(lo)} and at most {_n(hi)}{u}"
        return f"from {_n(lo)} to {_n(hi)}{u}"
    if lo is not None:
        return f"{'greater than' if open_lo else 'at least'} {_n(lo)}{u}"
    if hi is not None:
        return f"at most {_n(hi)}{u}"
    return "finite"


def number(
    name: str,
    value: Any,
    *,
    lo: float | None = 0.0,
    hi: float | None = MAX_OPTION_SECONDS,
    open_lo: bool = False,
    unit: str = "seconds",
) -> float:
    """A finite real number (int or float, not bool) in ``[lo, hi]`` (``(lo, hi]`` when
    ``open_lo``)."""
    # The message is built only for a bad value: this check runs on every reserve().
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or (lo is not None and (value < lo or (open_lo and value == lo)))
        or (hi is not None and value > hi)
    ):
        raise _fail(name, f"a finite number {_range(lo, hi, open_lo=open_lo, unit=unit)}", value)
    return float(value)


def optional_number(name: str, value: Any, **kw: Any) -> float | None:
    return None if value is None else number(name, value, **kw)


def timeout(name: str, value: Any) -> float | None:
    """A wait: None (no limit) or seconds from 0 to :data:`MAX_DELAY`."""
    if (type(value) is float or type(value) is int) and 0.0 <= value <= MAX_DELAY:
        return value  # the common case, checked first: reserve(timeout) is called per item
    return optional_number(name, value, lo=0.0, hi=MAX_DELAY)


def count(
    name: str, value: Any, *, lo: int = 0, hi: int | None = None, unit: str = "", note: str = ""
) -> int:
    """A whole number (int, not bool) in ``[lo, hi]``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < lo
        or (hi is not None and value > hi)
    ):
        need = f"a whole number {_range(lo, hi, open_lo=False, unit=unit)}{note}"
        raise _fail(name, need, value)
    return value


def partition_key(value: Any, name: str = "key") -> str | bytes | int | None:
    """A push's partition key: None (the producer's partition), a str, bytes, or a whole
    number (int, not bool: it picks partition ``key % partitions``)."""
    if value is None or isinstance(value, (str, bytes)):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise _fail(name, "a str, bytes, or a whole number >= 0", value)
        return value
    raise _fail(
        name, "a str, bytes, or a whole number >= 0 (or None: the producer's partition)", value
    )


def flag(name: str, value: Any, *, optional: bool = False) -> bool | None:
    if value is None and optional:
        return None
    if not isinstance(value, bool):
        raise _fail(name, "True or False" + (" (or None)" if optional else ""), value)
    return value


def choice(name: str, value: Any, options: tuple[str, ...]) -> str:
    if value not in options:
        raise _fail(name, "one of " + ", ".join(repr(o) for o in options), value)
    return value


def text(name: str, value: Any, *, optional: bool = False, hi: int | None = None) -> str | None:
    """A non-empty string (of at most ``hi`` characters); None too when ``optional``."""
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value or (hi is not None and len(value) > hi):
        need = "a non-empty string" + (f" of at most {hi} characters" if hi else "")
        raise _fail(name, need + (" (or None)" if optional else ""), value)
    return value


def collection_name(name: str, value: Any, *, optional: bool = False) -> str:
    """A name MongoDB accepts for a collection (bucketq also adds suffixes such as
    ``.dlq`` and ``.meta`` to it, and the reservoir ``:<shard>``): the one check of a
    queue, stream or collection name. Empty is allowed (unset) when ``optional``."""
    if optional and value == "":
        return value
    need = (
        "a non-empty string of at most 200 bytes, without '$' or NUL, not starting or "
        "ending with '.', without '..', and not starting with 'system.'"
    )
    if (
        not isinstance(value, str)
        or not value
        or "$" in value
        or "\0" in value
        or value.startswith(".")
        or value.endswith(".")
        or ".." in value
        or value.startswith("system.")
        or len(value.encode("utf-8", "surrogatepass")) > 200
    ):
        raise _fail(name, need, value)
    return value


#: Characters MongoDB refuses in a database name (on any platform).
_DB_FORBIDDEN = frozenset('/\\. "$*<>:|?\0')


def database_name(name: str, value: Any, *, optional: bool = False) -> str:
    """A name MongoDB accepts for a database. Empty is allowed (unset) when ``optional``."""
    if optional and value == "":
        return value
    if (
        not isinstance(value, str)
        or not value
        or any(c in _DB_FORBIDDEN for c in value)
        or len(value.encode("utf-8", "surrogatepass")) > 63
    ):
        need = 'a non-empty string of at most 63 bytes without /\\. "$*<>:|? or NUL'
        raise _fail(name, need + (" (or empty: unset)" if optional else ""), value)
    return value


def headers(value: Any, name: str = "headers") -> dict[str, Any] | None:
    """Item headers: None, or a dict (any mapping) with string keys."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise _fail(name, "None or a dict with string keys", value)
    bad = [k for k in value if not isinstance(k, str) or not k or "\0" in k]
    if bad:
        raise ConfigurationError(
            f"{name} must be a dict with non-empty string keys (without NUL); "
            f"key {bad[0]!r} is not one."
        )
    return value if isinstance(value, dict) else dict(value)


def delay(value: Any, name: str = "delay") -> float:
    """Seconds from now: from 0 to :data:`MAX_DELAY`."""
    return number(name, value, lo=0.0, hi=MAX_DELAY)


def timestamp(value: Any, name: str = "mature") -> float:
    """A point in time: an aware or naive (UTC) datetime, or seconds since the epoch,
    from 1970 to the end of year 9999."""
    if isinstance(value, datetime):
        d = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        try:
            t = d.timestamp()
        except (OverflowError, ValueError, OSError) as exc:
            raise _fail(name, "a datetime from 1970 to 9999", value) from exc
        if not 0 <= t <= MAX_TIMESTAMP:
            raise _fail(name, "a datetime from 1970 to 9999", value)
        return t
    need = (
        "a datetime, or seconds since the epoch (a finite number from 0 to "
        f"{MAX_TIMESTAMP:.0f}, the end of year 9999)"
    )
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _fail(name, need, value)
    if not math.isfinite(value) or not 0 <= value <= MAX_TIMESTAMP:
        raise _fail(name, need, value)
    return float(value)


def payloads(value: Any, name: str = "payloads") -> list[Any]:
    """An iterable of payloads; a str, bytes or dict is one payload, not several."""
    if isinstance(value, str | bytes | bytearray | memoryview | Mapping):
        raise ConfigurationError(
            f"{name} must be a list (or another iterable) of payloads, not a "
            f"{type(value).__name__}: wrap a single payload in a list, e.g. push_many([item])."
        )
    try:
        return list(value)
    except TypeError:
        raise _fail(name, "a list (or another iterable) of payloads", value) from None


def write_concern(name: str, value: Any) -> Any:
    """None, a pymongo ``WriteConcern``, or a dict of its keywords; an unacknowledged one
    (``w=0``) is refused: receipts could not say whether an item was stored."""
    from pymongo.write_concern import WriteConcern

    if value is None:
        return None
    if isinstance(value, dict):
        try:
            wc = WriteConcern(**value)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"{name} {value!r} is not a valid write concern ({exc}); give a dict of "
                "pymongo WriteConcern keywords such as {'w': 'majority', 'wtimeout': 5000}."
            ) from None
    elif isinstance(value, WriteConcern):
        wc = value
    else:
        raise _fail(name, "None, a pymongo WriteConcern or a dict like {'w': 'majority'}", value)
    if not wc.acknowledged:
        raise ConfigurationError(
            f"{name} {value!r} is unacknowledged (w=0): a receipt could not say whether its "
            "item was stored. Use w=1 or more, or 'majority'."
        )
    return value


def url(name: str, value: Any, schemes: tuple[str, ...], *, optional: bool = True) -> str:
    """A URL with one of ``schemes`` (empty is allowed when ``optional``)."""
    if not isinstance(value, str):
        raise _fail(name, "a string", value)
    v = value.strip()
    if not v and optional:
        return v
    scheme, sep, rest = v.partition("://")
    if not sep or scheme.lower() not in schemes or not rest:
        raise ConfigurationError(
            f"{name} must be a URL starting with "
            + " or ".join(f"{s}://" for s in schemes)
            + f"; got {value!r}."
        )
    return v


# -- options and settings: one declaration, read from keywords, the environment or text --


def option(
    default: Any = MISSING,
    check: Callable[..., Any] | None = None,
    *,
    factory: Callable[[], Any] | None = None,
    env: str | None = None,
    help: str | None = None,
    tag: str = "",
    shown: str | None = None,
    **limits: Any,
) -> Any:
    """A dataclass field with its default (or ``factory``) and its check, called as
    ``check(name, value, **limits)`` by :func:`check_options`: an option's type and range
    are declared once, beside the option.

    With ``help`` the field is also a setting read from text (:func:`settings`): an
    environment variable named ``env`` (by default the prefix given to :func:`settings`
    and the field's name in capitals); ``tag`` follows the help in the docs' table, and
    ``shown`` stands for a default computed when the option is built (e.g. a path)."""
    meta: dict[str, Any] = {} if check is None else {"check": (check, limits)}
    if help is not None:
        meta["setting"] = (env, help, tag, shown)
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def check_options(obj: Any, named: Iterable[Setting] = ()) -> None:
    """Run the checks of a dataclass's :func:`option` fields, in their order, keeping
    what each check returns (frozen dataclasses too: call it from ``__post_init__``).
    A field that is one of the settings ``named`` is called ``field (VARIABLE)``."""
    label = {s.field: f"{s.field} ({s.name})" for s in named}
    for f in fields(obj):
        spec = f.metadata.get("check")
        if spec is not None:
            check, limits = spec
            value = check(label.get(f.name, f.name), getattr(obj, f.name), **limits)
            object.__setattr__(obj, f.name, value)


#: The checks :func:`maybe` made (they accept None besides what their check accepts).
_OR_NONE: set[Callable[..., Any]] = set()


def maybe(check: Callable[..., Any]) -> Callable[..., Any]:
    """``check`` that also accepts None (an option that is off unless set); as text,
    empty is None."""

    def check_or_none(name: str, value: Any, **limits: Any) -> Any:
        return None if value is None else check(name, value, **limits)

    inner = reader(check)
    _READERS[check_or_none] = lambda text: None if not text.strip() else inner(text)
    _OR_NONE.add(check_or_none)
    return check_or_none


def _read_whole(text: str) -> Any:
    t = text.strip()
    try:
        return int(t) if t.isascii() else text  # int() takes Python's 1_000, not 1e3
    except ValueError:
        return text  # the check refuses it, naming the setting and what it accepts


def _read_number(text: str) -> Any:
    t = text.strip()
    try:
        return float(t) if t.isascii() else text
    except ValueError:
        return text


def _read_flag(text: str) -> Any:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    return text


#: How text (an environment variable, a Spark option, a command-line argument) becomes
#: the value a check takes: one reader per type. Text a reader cannot convert is given
#: to the check as it is, which refuses it with its message. Other checks get the text
#: without surrounding spaces.
_READERS: dict[Callable[..., Any], Callable[[str], Any]] = {
    count: _read_whole,
    number: _read_number,
    timeout: lambda t: None if not t.strip() else _read_number(t),
    flag: _read_flag,
    choice: lambda t: t.strip().lower(),
}


def reader(check: Callable[..., Any]) -> Callable[[str], Any]:
    """The text reader of ``check``'s type."""
    return _READERS.get(check, str.strip)


def reads(read: Callable[[str], Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare the text reader of a check defined elsewhere (a decorator)."""

    def register(check: Callable[..., Any]) -> Callable[..., Any]:
        _READERS[check] = read
        return check

    return register


def parse(check: Callable[..., Any], name: str, text: str, **limits: Any) -> Any:
    """``text`` read by ``check``'s type, then checked: the value, or a
    :class:`~bucketq.errors.ConfigurationError` naming ``name`` and quoting ``text``."""
    value = reader(check)(text)
    try:
        return check(name, value, **limits)
    except ConfigurationError as exc:
        said = f"; got {value!r}."
        if value is text or not str(exc).endswith(said):
            raise
        raise ConfigurationError(f"{str(exc)[: -len(said)]}; got {text!r}.") from None


class _Refused:
    """A value every check refuses (:attr:`Setting.accepts` asks a check what it wants)."""

    def __repr__(self) -> str:
        return "<refused>"


_NOTHING_ACCEPTS_THIS = _Refused()


@dataclass(frozen=True, slots=True)
class Setting:
    """One option read from text: its ``name`` (an environment variable, or a Spark
    option), the ``field`` it sets, its default (as a value), what it does (``help``,
    and ``tag`` after it in the docs), and its check with the check's limits."""

    name: str
    field: str
    default: Any
    help: str
    check: Callable[..., Any]
    limits: Mapping[str, Any]
    tag: str = ""
    shown: str | None = None

    def parse(self, text: str, label: str = "{}") -> Any:
        """``text`` as this setting's value (``label`` formats its name in errors)."""
        return parse(self.check, label.format(self.name), text, **self.limits)

    @property
    def accepts(self) -> str:
        """What the check accepts, in the words of the error it raises for a bad value."""
        try:
            self.check(self.name, _NOTHING_ACCEPTS_THIS, **self.limits)
        except ConfigurationError as exc:
            said = str(exc)
            if " must be " in said:
                need = said.split(" must be ", 1)[1].rsplit("; got ", 1)[0]
                return f"None or {need}" if self.check in _OR_NONE else need
        return "any value"

    @property
    def default_text(self) -> str:
        """The default as the environment writes it (empty when unset or ``shown``)."""
        d = self.default
        if d is None:
            return ""
        if isinstance(d, bool):
            return str(d).lower()
        if isinstance(d, frozenset | set | tuple | list):
            return ",".join(sorted(map(str, d)))
        if isinstance(d, float) and d.is_integer():
            return str(int(d))
        return str(d)


def settings(cls: type, prefix: str = "", *, keywords: bool = False) -> tuple[Setting, ...]:
    """The settings of dataclass ``cls``: its :func:`option` fields that have ``help``,
    in field order, each named by its ``env``, else ``prefix`` + the field in capitals
    (with ``keywords``: the field's name, for a table of keyword options)."""
    out = []
    for f in fields(cls):
        if "setting" not in f.metadata:
            continue
        env, help, tag, shown = f.metadata["setting"]
        check, limits = f.metadata.get("check", (_as_is, {}))
        if f.default is not MISSING:
            default = f.default
        elif f.default_factory is not MISSING:
            default = None if shown is not None else f.default_factory()
        else:
            default = None
        name = f.name if keywords else env or prefix + f.name.upper()
        out.append(Setting(name, f.name, default, help, check, limits, tag, shown))
    return tuple(out)


def setting_of(cls: type, field_name: str, name: str, help: str = "") -> Setting:
    """A setting named ``name`` for the :func:`option` field ``field_name`` of ``cls``,
    with that field's check (e.g. a Spark option that is a stream option)."""
    f = next(f for f in fields(cls) if f.name == field_name)
    check, limits = f.metadata["check"]
    return Setting(name, field_name, f.default, help, check, limits)


def _as_is(name: str, value: Any) -> Any:
    return value


def read_text(
    table: Iterable[Setting], source: Mapping[str, str], *, label: str = "{}",
    casefold: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """The settings of ``table`` that ``source`` gives (by name; any case with
    ``casefold``, whose ``source`` keys are lower case), each parsed and checked, by field.
    A bad one raises :class:`~bucketq.errors.ConfigurationError` naming it."""
    values: dict[str, Any] = {}
    for s in table:
        raw = source.get(s.name.lower() if casefold else s.name)
        if raw is not None:
            values[s.field] = s.parse(raw, label)
    return values


def read_env(table: Iterable[Setting], environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """:func:`read_text` from ``environ`` (default ``os.environ``): the variables set."""
    env = os.environ if environ is None else environ
    try:
        return read_text(table, env)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{exc} Fix or unset the variable.") from None


def env_var(
    name: str, check: Callable[..., Any], environ: Mapping[str, str] | None = None, **limits: Any
) -> Any:
    """One environment variable read and checked (None when unset), for a variable that
    is a fallback of a command-line option rather than a row of a configuration."""
    env = os.environ if environ is None else environ
    raw = env.get(name)
    if raw is None:
        return None
    try:
        return parse(check, name, raw, **limits)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{exc} Fix or unset the variable.") from None


#: The MongoDB every part uses when it is not given one (commands, Spark, the server).
MONGODB_URI_ENV = "BUCKETQ_MONGODB_URI"


def env_mongodb_uri(environ: Mapping[str, str] | None = None) -> str:
    """``$BUCKETQ_MONGODB_URI``, checked: a mongodb:// URL, or "" when unset or empty."""
    return env_var(MONGODB_URI_ENV, url, environ, schemes=MONGODB_SCHEMES) or ""


def settings_table(
    table: Iterable[Setting], *, first: str = "Variable", keywords: bool = False
) -> str:
    """The settings as a Markdown table of name, default and meaning (the docs' tables).
    With ``keywords`` (a table of keyword arguments) the defaults are Python values and a
    column says what each accepts, in the words of its check's error."""
    if keywords:
        lines = [f"| {first} | Default | Accepted | Meaning |", "|---|---|---|---|"]
    else:
        lines = [f"| {first} | Default | Meaning |", "|---|---|---|"]
    for s in table:
        if s.shown is not None:
            default = s.shown
        elif keywords:
            d = s.default
            default = f"`{int(d) if isinstance(d, float) and d.is_integer() else d!r}`"
        else:
            default = f"`{s.default_text}`" if s.default_text else "(unset)"
        takes = f" {s.accepts} |" if keywords else ""
        lines.append(f"| `{s.name}` | {default} |{takes} {s.help}{s.tag} |")
    return "\n".join(lines) + "\n"


# -- command-line arguments (argparse ``type=`` functions) --------------------------------


def one_line(exc: BaseException | str) -> str:
    """An error's message on one line for a command's stderr or a log line (the driver's
    topology dumps, configured timeouts and a server's whole error document are cut off)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    for cut in (
        " (configured timeouts",
        ", Timeout: ",
        ", Topology Description:",
        ", full error: ",
    ):
        text = text.split(cut, 1)[0]
    return text[:400]


def printable(text: object, limit: int = 1000) -> str:
    """``text`` as it may go into a log line: a name someone gave (a queue's, a request's
    path) with a line break in it must not start a line of its own in the log, nor an
    escape sequence rewrite the operator's terminal. Every character that is not
    printable (line breaks, tabs, ESC, Unicode line separators, lone surrogates) is
    written as its escape (``\\n``, ``\\x1b``, ``\\u2028``); past ``limit`` characters
    the text is cut and says how long it was. The one helper wherever such a name is
    logged."""
    s = str(text)
    if len(s) > limit:
        s = f"{s[:limit]}...({len(s)} characters)"
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in s)


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
FROM_SERVE = "the embedded store of a running `bucketq serve`"
STARTS_ONE = "an embedded store started for the run"


def add_mongodb_uri(
    p: Any, fallback: str = FROM_SERVE, *flags: str, dest: str = "mongodb_uri"
) -> None:
    """Add the one ``--mongodb-uri`` option to the argparse parser ``p``: checked as a
    mongodb:// URL; ``fallback`` says what the command uses when neither it nor
    ``$BUCKETQ_MONGODB_URI`` is given (docs/operations.md, "Which MongoDB a command uses");
    ``flags`` are other spellings the command kept."""
    p.add_argument("--mongodb-uri", *flags, dest=dest, type=cli_url(*MONGODB_SCHEMES),
                   default=None, metavar="URI",
                   help=f"MongoDB URI (default: ${MONGODB_URI_ENV}, else {fallback})")  # fmt: skip


def mongodb_uri(given: str | None, *, serve: bool = True) -> str:
    """Which MongoDB a command uses: ``given`` (its ``--mongodb-uri``), else
    ``$BUCKETQ_MONGODB_URI``, else (``serve``) the URI file of a running ``bucketq serve``
    whose embedded store is starting or running; "" when none (the command then starts a
    store or says so). The one rule, for every command."""
    uri = given or env_mongodb_uri()
    if not uri and serve:
        from .embedded import embedded_uri

        uri = embedded_uri() or ""
    return uri


def require_mongodb_uri(given: str | None, purpose: str) -> str:
    """:func:`mongodb_uri`, or :class:`~bucketq.errors.BucketQError` saying the three
    ways to give one when there is none (``purpose``: "read", "consume from", ...)."""
    from .errors import BucketQError

    uri = mongodb_uri(given)
    if not uri:
        raise BucketQError(
            f"No MongoDB to {purpose}: give --mongodb-uri, set {MONGODB_URI_ENV}, or start "
            "`bucketq serve` (its embedded store) first."
        )
    return uri


REDIS_SCHEMES = ("redis", "rediss", "unix")
MONGODB_SCHEMES = ("mongodb", "mongodb+srv")
