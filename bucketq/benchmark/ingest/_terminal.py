"""What ``bucketq bench ingest`` shows in the terminal while it runs (rich): a
headline, a bar per mode while it runs, one line per finished run. The runner
(``_runner``) decides what runs and when; this module only shows it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .._terminal import make_console


class IngestTerminal:
    """``console``: a ``rich.console.Console`` (default: see ``make_console``)."""

    def __init__(self, console: Any = None) -> None:
        self.console = make_console(console)
        self._bar: Any = None

    def headline(self, text: str) -> None:
        self.console.print(text)

    def skipped(self, mode: str, why: str) -> None:
        self.console.print(f"[yellow]skipping {mode}: {why}[/]")

    @contextmanager
    def runs(self) -> Iterator[None]:
        """The bars, while the runs go (gone once they are done)."""
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        columns = (TextColumn("{task.description:<44}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("{task.fields[seen]}"), TimeElapsedColumn())  # fmt: skip
        with Progress(*columns, console=self.console, transient=True) as bar:
            self._bar = bar
            try:
                yield
            finally:
                self._bar = None

    @contextmanager
    def mode_running(self, mode: str, rate: float) -> Iterator[Callable[[int, int, int], None]]:
        """A bar while ``mode`` runs at ``rate``; yields ``progress(done, total, seen)``."""
        bar = self._bar
        task = bar.add_task(f"{mode} at {rate:g} req/s", total=None, seen="")

        def progress(done: int, total: int, seen: int) -> None:
            bar.update(task, completed=done, total=total, seen=f"{seen:,} records stored")

        try:
            yield progress
        finally:
            bar.remove_task(task)

    def failed(self, what: str, exc: BaseException) -> None:
        self._print(f"[red]✗ {what}: {exc}[/]")

    def result(self, r: dict[str, Any], prefix: str = "") -> None:
        self._print(prefix + _line(r))

    def say(self, text: str) -> None:
        """A line of plain text (no markup) above the bars."""
        from rich.markup import escape

        self._print(escape(text))

    def _print(self, text: str) -> None:
        (self._bar.console if self._bar is not None else self.console).print(text)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


def _line(r: dict[str, Any]) -> str:
    lat, ld = r["load"]["latency"], r["load"]
    ok = r["stored_ok"] and not ld["errors"]
    return (
        f"{'✓' if ok else '✗'} {r['mode']} at {r['rate']:g} req/s: p50 {_fmt(lat['p50_ms'])} ms, "
        f"p95 {_fmt(lat['p95_ms'])} ms, p99 {_fmt(lat['p99_ms'])} ms; {ld['errors']} errors; "
        f"{ld['records_accepted']:,} accepted, {r['records_stored']:,} stored; "
        f"{_fmt(r['commands_per_1000_records'])} MongoDB commands / 1k records"
        + ("" if ld["kept_schedule"] else "; [yellow]the generator fell behind its schedule[/]")
    )
