"""Text as it may go into one line of a log or of a command's stderr."""

from __future__ import annotations


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


def counted(n: int, one: str, many: str = "") -> str:
    """``n`` and the word for that many: ``counted(1, "delivery", "deliveries")`` is
    "1 delivery", ``counted(2, "time")`` "2 times" (``many``: ``one`` + "s")."""
    return f"{n} {one if n == 1 else (many or one + 's')}"


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
