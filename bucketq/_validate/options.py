"""The one configuration mechanism: an option declared once, read from keywords, the
environment or text.

An option is declared beside its field with :func:`option` (its default, its check and
the check's limits; for an environment variable or a string option also its name and
help). The same check serves keyword arguments (:func:`check_options`), environment
variables (:func:`read_env`) and Spark's string options (:func:`read_text`): text is
first read by the check's type (one reader per check: :func:`parse`), so ``1_000`` is a
thousand everywhere. :func:`settings` lists a configuration's variables. No I/O besides
reading the environment mapping given.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from ..errors import ConfigurationError
from .checks import MONGODB_SCHEMES, choice, count, flag, number, timeout, url


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
