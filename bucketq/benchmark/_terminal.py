"""What ``bucketq bench`` shows in the terminal while it runs (rich): a headline, a bar
for the runs and one per phase of the current run, one line per finished run. The
runner (``_runner``) decides what runs and when; this module only shows it."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ._stats import RunResult


def make_console(console: Any = None) -> Any:
    """``console``, or a ``rich.console.Console`` as wide as the terminal (180 columns
    when stdout is not a terminal, so a log file keeps whole table rows)."""
    from rich.console import Console

    return console or Console(width=None if sys.stdout.isatty() else 180)


class Terminal:
    """``console``: a ``rich.console.Console`` (default: see ``make_console``)."""

    def __init__(self, console: Any = None) -> None:
        self.console = make_console(console)
        self._bar: Any = None
        self._overall: Any = None
        self._phases: tuple[Any, Any] | None = None

    def headline(self, text: str) -> None:
        self.console.print(text)

    @contextmanager
    def runs(self, total: int) -> Iterator[None]:
        """The bars, while ``total`` runs go (gone once they are done)."""
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        columns = (
            TextColumn("{task.description:<58}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=self.console, transient=True) as bar:
            self._bar = bar
            self._overall = bar.add_task("runs", total=total)
            try:
                yield
            finally:
                self._bar = None

    def run_started(self, label: str, n: int) -> Callable[[int, int], None]:
        """A bar per phase of the run ``label``; returns ``progress(pushed, committed)``."""
        bar = self._bar
        pt = bar.add_task(f"{label}: push", total=n)
        ct = bar.add_task(f"{label}: consume", total=n)
        self._phases = (pt, ct)

        def progress(p: int, c: int) -> None:
            bar.update(pt, completed=p)
            bar.update(ct, completed=c)

        return progress

    def _run_ended(self) -> None:
        if self._phases is not None:
            for task in self._phases:
                self._bar.remove_task(task)
            self._phases = None
        self._bar.advance(self._overall)

    def run_failed(self, label: str, exc: BaseException) -> None:
        self._run_ended()
        self._bar.console.print(f"[red]✗ {label}: {exc}[/]")

    def run_done(self, label: str, r: RunResult) -> None:
        self._run_ended()
        self._bar.console.print(
            f"{'✓' if r.items_ok else '✗'} {label}: push {r.push_rate:,.0f}/s, consume {r.consume_rate:,.0f}/s, "
            f"end-to-end {r.e2e_rate:,.0f}/s; {r.cpu_us_per_item:,.1f} CPU µs/item, "
            f"{r.commands_per_1000:,.1f} commands/1k items"
            + ("" if r.items_ok else f"; [red]{r.items_problem}[/]")
        )
