"""The HTTP/1.x responses on a connection, framed as HTTP frames them, so that two
servers' answers to the same requests are compared by what HTTP says they mean
(compare.py): the same body sent whole (Content-Length) or in chunks (Transfer-Encoding:
chunked), with the same headers in another order (RFC 9110 5.3: the order of fields
with different names is not significant; of fields with one name it is, and is kept),
names in any case.

A response's canonical form is its status line, its headers sorted by lower-cased name
(stable: lines of one name keep their order) without its framing (Transfer-Encoding's
`chunked`, Content-Length), a `content-length` line with the length of its body as the
client got it, a blank line, and that body (chunk data joined; chunk sizes, extensions
and trailers dropped).

The bytes are the guest's (hostile): a stream that does not parse as responses from some
point on (no `HTTP/1.` where a response starts, a header block over MAX_HEAD, a bad chunk
size or length) is not guessed at: parsing stops there (`Framed.bad`) and the caller
compares the rest as lines, as any connection. The parse is linear in the stream: each
byte is looked at a bounded number of times (one search per header block and chunk line).

Without the requests, two things are inferred from the response alone, alike on both
sides: a response to HEAD (a Content-Length, and the next response right after the
header block: `HTTP/1.` there) and a body that runs to the connection's close (neither
Content-Length nor chunked: complete only once the connection has closed).
"""
from __future__ import annotations

from dataclasses import dataclass

MAX_HEAD = 64 << 10         # bytes of a header block (nginx's proxy_buffer_size is 4-8 KiB)
MAX_CHUNK_LINE = 1024       # bytes of a chunk-size line with its extensions
START = b"HTTP/1."
NO_BODY = (204, 304)        # and 1xx: RFC 9112 6.3


@dataclass
class Response:
    start: int                      # offset of its first byte in the text parsed
    end: int                        # offset past its body
    status: bytes
    headers: list[tuple[bytes, bytes]]              # (lower-cased name, value), as sent
    body: tuple[int, int] | None = None     # (start, end) in the text of a body sent whole
    # A chunked body, its chunks' data joined (bytes, not a range per chunk: a guest sending
    # 1-byte chunks would make 100 bytes of Python objects of every 6 bytes it sends).
    chunked: bytes | None = None
    body_at: int = 0                        # offset of the body's first byte (its time)

    @property
    def has_body(self) -> bool:
        return self.body is not None or self.chunked is not None

    def body_length(self) -> int:
        if self.chunked is not None:
            return len(self.chunked)
        return self.body[1] - self.body[0] if self.body else 0

    def body_bytes(self, text: bytes) -> bytes:
        """The body as the client got it."""
        if self.chunked is not None:
            return self.chunked
        return text[self.body[0]:self.body[1]] if self.body else b""

    def canonical_head(self) -> bytes:
        """Status line and headers, sorted, unframed, with the body's length."""
        kept = []
        length = None
        for name, value in self.headers:
            if name == b"content-length":
                length = value          # a response to HEAD: its length, with no body
                continue
            if name == b"transfer-encoding":
                codings = [c.strip() for c in value.split(b",") if c.strip().lower() != b"chunked"]
                if not codings:
                    continue
                value = b", ".join(codings)
            kept.append((name, value))
        kept.sort(key=lambda h: h[0])
        if self.has_body or length is None:
            length = b"%d" % self.body_length()
        lines = [self.status] + [n + b": " + v for n, v in kept] + [b"content-length: " + length]
        return b"\r\n".join(lines) + b"\r\n\r\n"


@dataclass
class Framed:
    responses: list[Response]
    end: int            # offset past the last complete response
    bad: bool           # parsing stopped at bytes that are no response (else: the rest is incomplete)


def frame(text: bytes, closed: bool, start: int = 0) -> Framed:
    """The complete responses in text[start:]. `closed`: the connection has ended, so a
    body that runs to the close is complete."""
    out: list[Response] = []
    pos = start
    while pos < len(text):
        r = _response(text, pos, closed)
        if r is None or r is _BAD:
            return Framed(out, pos, r is _BAD)
        out.append(r)
        pos = r.end
    return Framed(out, pos, False)


_BAD = Response(-1, -1, b"", [])     # a sentinel: what is at this offset is no response


def _response(text: bytes, pos: int, closed: bool) -> Response | None:
    """The response at pos; None if it is incomplete, _BAD if it is not one."""
    if not text.startswith(START, pos):
        return _BAD if len(text) - pos >= len(START) or closed or not START.startswith(text[pos:]) else None
    head_end = _head_end(text, pos)
    if head_end is None:
        return _BAD if len(text) - pos > MAX_HEAD or closed else None
    lines = text[pos:head_end].split(b"\n")
    status = lines[0].rstrip(b"\r")
    headers = []
    for line in lines[1:]:
        line = line.rstrip(b"\r")
        if not line:
            continue
        name, colon, value = line.partition(b":")
        if not colon or not name or name[:1] in b" \t":
            return _BAD                 # no field (obsolete line folding is refused too)
        headers.append((name.strip().lower(), value.strip()))
    parts = status.split(b" ", 2)
    code = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() and len(parts[1]) == 3 else None
    if code is None:
        return _BAD
    fields = dict(headers)
    r = Response(pos, head_end, status, headers)
    if code < 200 or code in NO_BODY:
        return r
    te = fields.get(b"transfer-encoding", b"")
    if te and te.split(b",")[-1].strip().lower() == b"chunked":
        return _chunked(text, r, closed)
    if b"content-length" in fields:
        cl = fields[b"content-length"]
        if not cl.isdigit() or len(cl) > 18:
            return _BAD
        n = int(cl)
        if n and text.startswith(START, head_end):
            return r                    # a response to HEAD: its length, and the next response
        if n and len(text) - head_end < len(START) and START.startswith(text[head_end:]):
            if not closed:
                return None             # HEAD or a body: the next bytes will tell
            if len(text) == head_end:
                return r                # the connection's last response, to HEAD (or cut short)
        if len(text) - head_end < n:
            return _BAD if closed else None
        r.body, r.body_at, r.end = (head_end, head_end + n), head_end, head_end + n
        return r
    if not closed:
        return None                     # the body runs to the close
    r.body, r.body_at, r.end = (head_end, len(text)), head_end, len(text)
    return r


def _head_end(text: bytes, pos: int) -> int | None:
    """Offset past the blank line that ends the header block at pos (CRLF or bare LF)."""
    limit = pos + MAX_HEAD
    crlf = text.find(b"\n\r\n", pos, limit)
    lf = text.find(b"\n\n", pos, limit if crlf < 0 else crlf + 1)
    if lf >= 0:
        return lf + 2
    return crlf + 3 if crlf >= 0 else None


def _chunked(text: bytes, r: Response, closed: bool) -> Response | None:
    """A chunked body from r.end: its chunks' data, to past the last chunk's trailers."""
    pos = r.body_at = r.end
    body = bytearray()
    while True:
        eol = text.find(b"\n", pos, pos + MAX_CHUNK_LINE)
        if eol < 0:
            return _BAD if len(text) - pos >= MAX_CHUNK_LINE or closed else None
        size_text = text[pos:eol].rstrip(b"\r").split(b";")[0].strip()
        if not size_text or len(size_text) > 15 or any(c not in b"0123456789abcdefABCDEF" for c in size_text):
            return _BAD
        size = int(size_text, 16)
        data = eol + 1
        if size == 0:
            end = _head_end(text, eol - 1)      # trailers, then a blank line
            if end is None:
                return _BAD if len(text) - data > MAX_HEAD or closed else None
            r.chunked, r.end = bytes(body), end
            return r
        if len(text) < data + size + 2:
            return _BAD if closed else None
        body += text[data:data + size]
        after = data + size
        if text.startswith(b"\r\n", after):
            pos = after + 2
        elif text.startswith(b"\n", after):
            pos = after + 1
        else:
            return _BAD
