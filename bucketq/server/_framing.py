"""Request heads that two HTTP parsers could read two ways are refused before h11 reads
them (RFC 9112): a proxy in front of the service and the service itself must agree on
where a request ends, or a second request hides in the first one's body (request
smuggling).

:func:`head_problem` is the pure check of one raw head; :class:`StrictConnection` is
h11's connection with that check before each request head it parses. uvicorn's h11
protocol (``_admission.GuardedH11Protocol``) answers a refused head 400 and closes the
connection, whatever was pipelined behind it.
"""

from __future__ import annotations

import re
from typing import Any

import h11

#: Where a head ends as h11 reads it: the first empty line, with or without its CR.
_HEAD_END = re.compile(rb"\n\r?\n")
#: Control characters but the line ends (CR, LF) and HTAB (allowed in a field value), and
#: a table that turns each into NUL (a NUL in the translated head: one of them is there).
_CTL = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_CTL_BYTES = bytes([*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F])
_TO_NUL = bytes.maketrans(_CTL_BYTES, b"\0" * len(_CTL_BYTES))
#: A Host value: a host name, an IPv4 or a bracketed IPv6 address, and a port
#: (RFC 3986's reg-name, IP-literal and port characters, percent-encoding included).
_HOST = re.compile(rb"^[A-Za-z0-9\-._~!$&'()*+,;=:\[\]%]*$")


def head_problem(data: bytes) -> str | None:
    """Why the request head at the start of ``data`` must be refused, or None (also
    while the head is not whole yet: h11 then waits for the rest, within its limits).

    Refused: a line that ends in a bare LF, or a bare CR (RFC 9112 §2.2); control
    characters in the request target or a field value (§2.2, RFC 9110 §5.5); a folded
    header line (§5.2); both ``Content-Length`` and ``Transfer-Encoding`` (§6.1: which
    one frames the body is the question smuggling exploits); ``Host`` given more than
    once, or with characters a host and port cannot have (§3.2). A few passes in C over
    the head; a line at a time only to name what is refused."""
    end = _HEAD_END.search(data)
    if end is None:
        return None
    head = data[: end.end()]
    crlf = head.count(b"\r\n")
    if head.count(b"\n") != crlf:
        return "A line of the request head ends in a bare LF; end every line with CRLF."
    if head.count(b"\r") != crlf or b"\0" in head.translate(_TO_NUL):
        return _named_control(head)
    if b"\r\n " in head or b"\r\n\t" in head:
        return (
            "A header line is folded onto the next one (obsolete line folding); send "
            "each field on one line."
        )
    # Field names end at their colon (h11 refuses a space before it).
    lower = head.lower()
    if b"\r\ncontent-length:" in lower and b"\r\ntransfer-encoding:" in lower:
        return (
            "The request has both Content-Length and Transfer-Encoding: which one frames its "
            "body is ambiguous (RFC 9112 section 6.1). Send one of them."
        )
    hosts = lower.count(b"\r\nhost:")
    if hosts > 1:
        return "The header Host is given more than once; give it once."
    if hosts:
        at = lower.index(b"\r\nhost:") + 7
        if not _HOST.match(head[at : head.index(b"\r\n", at)].strip(b" \t")):
            return "The header Host holds characters a host name and port cannot have."
    return None


def _named_control(head: bytes) -> str:
    """The refusal of a head holding a control character (or a bare CR): where it is."""
    lines = head[:-4].split(b"\r\n")
    if _CTL.search(lines[0]) or b"\r" in lines[0]:
        return "The request target holds a control character; percent-encode it."
    for line in lines[1:]:
        if _CTL.search(line) or b"\r" in line:
            return f"The header {_shown(line.partition(b':')[0])} holds a control character."
    return "The request head holds a control character."


def _shown(name: bytes) -> str:
    return name[:100].decode("latin-1").encode("unicode_escape").decode("ascii")


class StrictConnection(h11.Connection):
    """h11's server connection that checks each request head with :func:`head_problem`
    before it parses it. A refused head leaves its reason in :attr:`refusal` and the
    connection answers :data:`h11.PAUSED` from then on (uvicorn stops reading); the
    protocol then answers 400 and closes the connection."""

    refusal: str | None = None

    def next_event(self) -> Any:
        if self.refusal is not None:
            return h11.PAUSED
        if self.their_state is h11.IDLE:
            data, _closed = self.trailing_data
            if data:
                self.refusal = head_problem(data)
                if self.refusal is not None:
                    return h11.PAUSED
        return super().next_event()
