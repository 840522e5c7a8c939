"""The worker's decisions, with no I/O: its options, what a handler's outcome does to its
items (commit, or roll back after which delay), time limits and touches, the stop state
machine, the counters, health, and what a supervisor does when a worker process exits.

The I/O shells (``_async/worker.py``, its generated sync twin, ``processes.py``) read
the clock, call the queue and the handler, and ask these what to do.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Self

from .. import _validate as v
from .._guard import backoff
from ..errors import ConfigurationError

DEFAULT_CONCURRENCY = 1
MAX_CONCURRENCY = 1024
#: A handler running longer than this is stopped where it can be and its items rolled
#: back (None: no limit).
DEFAULT_TIME_LIMIT = 300.0
MAX_BATCH = 10_000
#: The control loop's longest sleep (seconds): how soon a stop, a signal or an overdue
#: handler is seen.
CONTROL_PERIOD = 0.1
#: A handler past its time limit and still running this long after it (a sync handler:
#: a thread cannot be stopped; an async one that ignores its cancellation) is stuck.
STUCK_AFTER = 1.0
#: Why a worker stopped itself when ``stop_when_stuck``.
STUCK_REASON = "a handler is stuck past its time limit"
#: Seconds between two reports of a worker process to its supervisor.
REPORT_PERIOD = 1.0
#: The exit status of a worker process that stopped because a handler is stuck: its
#: supervisor starts another at once (the stuck thread ends with the process).
EXIT_STUCK = 3

#: Upper bounds (seconds) of the handler duration histogram.
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0)

#: What happened to a delivery's items, one counter each (``stats()``, and the
#: ``outcome`` label of ``bucketq_worker_items_total``): a fixed set.
OUTCOMES = (
    "committed",  # the handler returned; committed
    "failed",  # the handler raised; rolled back with the back-off
    "retried",  # the handler raised Retry; rolled back with its delay
    "timed_out",  # the time limit passed; rolled back (the handler stopped where it could be)
    "dead_letter",  # rolled back (any of the three above) for the max_tries-th time: dead-lettered
    "late",  # the handler finished after its time limit: its result was ignored
    "lost",  # its commit or rollback was refused: the bucket is no longer held here
)


class Retry(Exception):
    """Raise it from a handler to roll its item back, delivered again ``delay`` seconds
    later (None: the worker's ``retry_for``, else the queue's back-off). Past the queue's
    ``max_tries`` the item goes to the dead-letter queue, as with any failure.
    ``raise Retry(60) from exc`` keeps the cause in the logs."""

    def __init__(self, delay: float | None = None, reason: str | None = None) -> None:
        self.delay = None if delay is None else v.delay(delay, "Retry(delay)")
        self.reason = reason
        super().__init__(reason or ("retry" if delay is None else f"retry in {delay:g} s"))


class TimeLimitExceeded(Exception):
    """How a delivery whose handler ran past ``time_limit`` failed: it is what the log
    line names, and a ``retry_for`` key sets the delay of such items."""


# -- options ---------------------------------------------------------------------------


def check_retry_for(name: str, value: Any) -> dict[type[BaseException], Any] | None:
    """``retry_for``: None, or a mapping of exception classes to a delay in seconds or a
    function of the item's tries returning one."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ConfigurationError(
            f"{name} must be a dict of exception classes to delays in seconds (or to "
            f"functions of the tries returning one), e.g. {{TimeoutError: 30}}; got {value!r}."
        )
    out: dict[type[BaseException], Any] = {}
    for k, d in value.items():
        if not (isinstance(k, type) and issubclass(k, BaseException)):
            raise ConfigurationError(f"{name}: {k!r} is not an exception class.")
        out[k] = d if callable(d) else v.delay(d, f"{name}[{k.__name__}]")
    return out


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """Every worker option with its default; the ones with help are also ``bucketq
    worker``'s command-line options and the table in docs/worker.md."""

    KIND: ClassVar[str] = "worker"

    concurrency: int = v.option(
        DEFAULT_CONCURRENCY, v.count, lo=1, hi=MAX_CONCURRENCY, unit="handlers",
        help="handlers running at once in this process (async: tasks; sync: threads)",
    )  # fmt: skip
    batch: int | None = v.option(
        None, v.maybe(v.count), lo=1, hi=MAX_BATCH, unit="items",
        help="hand the handler a list of up to this many items (committed or rolled back "
             "together); unset: one item",
    )  # fmt: skip
    time_limit: float | None = v.option(
        DEFAULT_TIME_LIMIT, v.maybe(v.number), open_lo=True,
        help="seconds a handler may run on one delivery; then its items are rolled back "
             "(an async handler is cancelled, a sync one's result ignored); none: no limit",
    )  # fmt: skip
    drain_timeout: float | None = v.option(
        None, v.maybe(v.number),
        help="on a stop, seconds the items in hand get to finish before the rest is "
             "released (default: the queue's drain_timeout)",
    )  # fmt: skip
    max_items: int | None = v.option(
        None, v.maybe(v.count), lo=1, unit="items",
        help="stop after handing this many items to the handler (default: run until stopped)",
    )  # fmt: skip
    log_details: bool = v.option(
        False, v.flag,
        help="failure log lines carry the exception's message and traceback (they may "
             "quote the payload; by default only its type)",
    )  # fmt: skip
    #: {exception class: delay in seconds, or tries -> seconds} for failures of that
    #: class (the most specific class of the exception's MRO that is named wins).
    retry_for: Mapping[type[BaseException], Any] | None = v.option(None, check_retry_for)
    #: Install SIGTERM and SIGINT handlers while running (in the main thread only).
    signals: bool = v.option(True, v.flag)
    #: Stop once a handler is stuck past its time limit (``bucketq worker --processes``
    #: then starts a fresh process).
    stop_when_stuck: bool = v.option(False, v.flag)

    def __post_init__(self) -> None:
        v.check_options(self)

    @classmethod
    def build(cls, **options: Any) -> Self:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ConfigurationError(
                f"Unknown worker option(s): {', '.join(unknown)}. Known options: "
                f"{', '.join(sorted(known))}."
            )
        return cls(**options)


#: The options given on the command line and in the docs' table.
SETTINGS: tuple[v.Setting, ...] = v.settings(WorkerOptions, keywords=True)


def options_table() -> str:
    """The options as the Markdown table in docs/worker.md: the keyword, its
    ``bucketq worker`` flag, the default, what it does."""
    lines = ["| Option | Command line | Default | Meaning |", "|---|---|---|---|"]
    for s in SETTINGS:
        default = f"`{s.default_text}`" if s.default_text else "(unset)"
        lines.append(f"| `{s.field}` | `--{s.field.replace('_', '-')}` | {default} | {s.help} |")
    return "\n".join(lines) + "\n"


# -- outcomes --------------------------------------------------------------------------


def failure_delay(
    exc: BaseException, tries: int, retry_for: Mapping[type[BaseException], Any] | None
) -> float | None:
    """Seconds before a failed item is delivered again (None: the queue's back-off):
    ``Retry(delay)``'s own, else ``retry_for``'s entry for the most specific class of
    ``exc`` it names (a function is called with ``tries``, this delivery counted)."""
    if isinstance(exc, Retry) and exc.delay is not None:
        return exc.delay
    if not retry_for:
        return None
    for cls in type(exc).__mro__:
        if cls in retry_for:
            d = retry_for[cls]
            return v.delay(d(tries) if callable(d) else d, f"retry_for[{cls.__name__}]")
    return None


def failure_reason(exc: BaseException) -> str:
    """The dead letter's ``x-reason`` if this failure is the item's last: the exception's
    type and message, cut short (a dead letter keeps its payload anyway)."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"[:500] if text else type(exc).__name__


def outcome_of(exc: BaseException) -> str:
    """The counter a handler's exception goes to."""
    return "retried" if isinstance(exc, Retry) else "failed"


def exception_name(exc: BaseException) -> str:
    """The exception's type for a log line; ``Retry`` names its cause's too."""
    name = type(exc).__name__
    cause = exc.__cause__ or exc.__context__
    if isinstance(exc, Retry) and cause is not None:
        return f"{name} (from {type(cause).__name__})"
    return name


def summary(counts: Mapping[str, Any]) -> str:
    """What a worker did, for its stop line: each outcome it counted, else says so."""
    return ", ".join(f"{k} {counts[k]}" for k in OUTCOMES if counts[k]) or "nothing handled"


def drain_plan(in_hand: int, drain_timeout: float) -> str:
    """What a stopping worker waits for, for its stopping line."""
    if not in_hand:
        return "nothing in hand"
    held = v.counted(in_hand, "delivery", "deliveries")
    return f"the {held} in hand may take {drain_timeout:.3g} s to finish"


def dead_after(tries: int, max_tries: int | None) -> bool:
    """Whether a rollback that makes ``tries`` sends the item to the dead-letter queue
    (the queue's rule: rolled back ``max_tries`` times)."""
    return max_tries is not None and tries >= max_tries


#: Fields of a failure's log record (``extra``), for structured formatters.
LOG_FIELDS = ("queue", "items", "tries", "exception", "outcome", "retry_in")


def failure_record(
    queue: str,
    ids: list[str],
    tries: int,
    exc_type: str,
    outcome: str,
    retry_in: float | None,
) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    """A failure's log line: (format, args, extra). Item ids, tries, the exception's type
    and what happens next; never the payload (nor, unless ``log_details``, the message)."""
    shown = ", ".join(ids[:10]) + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")
    if outcome == "dead_letter":
        then = "to the dead-letter queue"
    elif retry_in is None:
        then = "delivered again"
    else:
        then = f"delivered again in {retry_in:.3g} s"
    extra = {"queue": queue, "items": ids, "tries": tries, "exception": exc_type,
             "outcome": outcome, "retry_in": retry_in}  # fmt: skip
    return "queue %s: item %s failed (try %d): %s; %s", (queue, shown, tries, exc_type, then), extra


# -- slots: what each handler runs on, and the control loop's view of them -------------


#: What a slot's handler runs on now, one tuple (set in one assignment, so another thread
#: reads it whole, and cheap: one is made per delivery): its message (a list of them with
#: ``batch``), when it started, when its time limit passes (monotonic seconds), and the
#: slot's delivery number.
Delivery = tuple[Any, float, float, int]


def messages(delivered: Any) -> list[Any]:
    """A delivery's messages as a list (one item at a time, the message alone is kept)."""
    return delivered if isinstance(delivered, list) else [delivered]


class Tally:
    """Counters of one slot (or of the control loop), one attribute per outcome: each is
    written by one thread only, so no lock is needed; ``tally_stats`` adds them up."""

    __slots__ = (*OUTCOMES, "hist", "seconds")

    def __init__(self) -> None:
        self.committed = self.failed = self.retried = 0
        self.timed_out = self.dead_letter = self.late = self.lost = 0
        self.hist = [0] * (len(DURATION_BUCKETS) + 1)
        self.seconds = 0.0

    def add(self, outcome: str, n: int = 1) -> None:
        setattr(self, outcome, getattr(self, outcome) + n)

    def observe(self, seconds: float) -> None:
        self.hist[bisect_left(DURATION_BUCKETS, seconds)] += 1
        self.seconds += seconds


class Slot:
    """One handler's place. ``current`` is its :data:`Delivery` while its handler runs
    (else None); ``gen`` the number of its last delivery; ``expired`` the delivery number the control loop rolled back at its time
    limit; ``touched`` when its items' stall clock was last restarted; ``task`` /
    ``future`` the shell's handles to cancel an async handler."""

    __slots__ = ("index", "current", "gen", "expired", "touched", "tally", "task", "future")

    def __init__(self, index: int) -> None:
        self.index = index
        self.current: Delivery | None = None
        self.gen = 0  # the last delivery's number: never used twice in a slot
        self.expired = 0
        self.touched = 0.0
        self.tally = Tally()
        self.task: Any = None
        self.future: tuple[int, Any] | None = None


def deadline_of(started: float, time_limit: float | None) -> float:
    return math.inf if time_limit is None else started + time_limit


def overdue(slots: Iterable[Slot], now: float) -> Iterator[tuple[Slot, Delivery]]:
    """Slots whose delivery passed its time limit and was not yet rolled back."""
    for s in slots:
        d = s.current
        if d is not None and d[2] <= now and s.expired != d[3]:
            yield s, d


def in_hand(slots: Iterable[Slot]) -> int:
    """Deliveries whose handler runs and that are still this worker's to settle (not
    rolled back at their time limit)."""
    n = 0
    for s in slots:
        d = s.current
        if d is not None and s.expired != d[3]:
            n += 1
    return n


def stuck(slots: Iterable[Slot], now: float) -> int:
    """Handlers still running ``STUCK_AFTER`` seconds past their time limit."""
    n = 0
    for s in slots:
        d = s.current
        if d is not None and s.expired == d[3] and now - d[2] >= STUCK_AFTER:
            n += 1
    return n


def touch_due(slots: Iterable[Slot], now: float, every: float) -> Iterator[Any]:
    """The message (or list of them) of each delivery whose stall clock should be
    restarted now (``every`` seconds since the last), marked as touched."""
    for s in slots:
        d = s.current
        if d is not None and s.expired != d[3] and now - max(s.touched, d[1]) >= every:
            s.touched = now
            yield d[0]


def touch_period(lease: float, reject_timeout_grace: float) -> float:
    """How often a running handler's items are touched: a third of the queue's stall
    limit (``lease + reject_timeout_grace``), so the queue never rolls them back itself
    while the handler runs."""
    return (lease + reject_timeout_grace) / 3


def next_look(slots: Iterable[Slot], now: float) -> float:
    """Seconds until the control loop must look again: the next time limit, at most
    ``CONTROL_PERIOD``."""
    wait = CONTROL_PERIOD
    for s in slots:
        d = s.current
        if d is not None and s.expired != d[3]:
            wait = min(wait, d[2] - now)
    return max(wait, 0.0)


# -- stopping --------------------------------------------------------------------------

#: The stop levels, in order: a request only ever moves a worker forward.
RUNNING, STOPPING, ABORTING, STOPPED = 0, 1, 2, 3
LEVELS = ("running", "stopping", "aborting", "stopped")


class StopState:
    """RUNNING → STOPPING (take no new items, let those in hand finish within the drain
    deadline, release the rest) → ABORTING (release what is held at once) → STOPPED
    (``run()`` returned; set by :meth:`end`, never by a request). A signal moves
    one level on; ``request`` moves to at least a level (so a parent's "stop" and the same
    SIGTERM sent to the whole process group count once). Plain attribute writes: safe
    from a signal handler and from other threads."""

    __slots__ = ("level", "reason", "signals", "_told")

    def __init__(self) -> None:
        self.level = RUNNING
        self.reason = ""
        self.signals = 0
        self._told = RUNNING

    def signal(self, name: str) -> None:
        self.signals += 1
        self.request(min(self.level + 1, ABORTING), name)  # never STOPPED: run() says that

    def request(self, level: int, reason: str) -> None:
        if level > self.level:
            self.level = level
            self.reason = reason

    def end(self, reason: str) -> None:
        """The run is over (or failed): nothing runs on; the reason kept if there was one."""
        self.reason = self.reason or reason
        self.level = STOPPED

    def news(self) -> int | None:
        """The level reached since the last call, once (for the shell to log), or None."""
        if self.level != self._told:
            self._told = self.level
            return self.level
        return None


# -- stats and health --------------------------------------------------------------------


def tally_stats(tallies: Iterable[Tally]) -> dict[str, Any]:
    out: dict[str, Any] = dict.fromkeys(OUTCOMES, 0)
    hist = [0] * (len(DURATION_BUCKETS) + 1)
    seconds = 0.0
    for t in tallies:
        for k in OUTCOMES:
            out[k] += getattr(t, k)
        for i, c in enumerate(t.hist):
            hist[i] += c
        seconds += t.seconds
    out["handler_seconds"] = {"counts": hist, "sum": seconds}
    return out


def add_stats(total: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """``total`` plus the counters of ``more`` (worker ``stats()``): what the supervisor
    keeps of its processes that exited, so its counters never go back."""
    out = {k: total.get(k, 0) + int(more.get(k, 0)) for k in OUTCOMES}
    a = total.get("handler_seconds") or {"counts": [0] * (len(DURATION_BUCKETS) + 1), "sum": 0.0}
    b = more.get("handler_seconds") or {"counts": [], "sum": 0.0}
    counts = list(a["counts"])
    for i, c in enumerate(b["counts"][: len(counts)]):
        counts[i] += int(c)
    out["handler_seconds"] = {"counts": counts, "sum": a["sum"] + float(b["sum"])}
    return out


def health(
    level: int, concurrency: int, stuck_n: int, tick_age: float, queue_ok: bool
) -> tuple[bool, str]:
    """Whether a worker does its job, and if not why: its control loop looks (a frozen
    one cannot time anything out), MongoDB answers, and not every handler is stuck."""
    if tick_age > max(10 * CONTROL_PERIOD, 5.0):
        return False, f"the control loop has not run for {tick_age:.0f} s"
    if not queue_ok:
        return False, "MongoDB does not answer the queue's operations"
    if stuck_n >= concurrency:
        return False, f"every handler ({stuck_n}) is stuck past its time limit"
    return True, LEVELS[level]


# -- processes ---------------------------------------------------------------------------


class Restarts:
    """What a supervisor does when one of its worker processes exits while it runs: start
    another after a back-off that grows while they keep dying young, and give up after
    ``give_up`` young deaths in a row (a fault a new process will not fix)."""

    def __init__(self, young: float = 10.0, give_up: int = 5, base: float = 0.5, cap: float = 30.0):
        self.young, self.give_up, self.base, self.cap = young, give_up, base, cap
        self.in_a_row = 0

    def exited(self, code: int | None, lived: float) -> float | None:
        """Seconds to wait before starting its replacement, or None: give up."""
        if code == EXIT_STUCK:
            return 0.0  # it stopped itself to be replaced
        if lived >= self.young:
            self.in_a_row = 0
            return 0.0
        self.in_a_row += 1
        if self.in_a_row >= self.give_up:
            return None
        return backoff(self.in_a_row, self.base, self.cap)


def exit_status(codes: Iterable[int | None]) -> int:
    """A supervisor's exit status once every process ended on a stop: 0 if each exited 0."""
    return 0 if all(c == 0 for c in codes) else 1


def check_handler(handler: Any) -> Callable[..., Any]:
    if not callable(handler):
        raise ConfigurationError(
            f"The handler must be a function (or another callable) taking a Message; got {handler!r}."
        )
    return handler
