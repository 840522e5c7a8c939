"""The settings as the docs' Markdown tables, rendered from their declarations."""

from __future__ import annotations

from collections.abc import Iterable

from .options import Setting


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
