"""The one multipart/related codec of DICOMweb (WADO-RS answers, STOW-RS requests).

``MultipartReader`` is a push parser: bytes are fed as they arrive, each part's bytes go to the
file its ``on_part`` callback opened for its headers, and nothing is held in memory beyond a
delimiter's length (and a part's headers, bounded). Every bound is checked as the bytes come:
a part over ``max_part_bytes``, more than ``max_parts`` parts, a header block over
``max_header_bytes`` or a body that ends before its closing delimiter is a ``MultipartError``
saying which. ``encode_related`` writes the same format.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Iterable, Iterator
from email.message import Message
from pathlib import Path
from typing import BinaryIO

MAX_BOUNDARY = 70  # RFC 2046
# RFC 2046 5.1.1: 1-70 of these characters, the last not a space
_BOUNDARY = re.compile(r"[0-9A-Za-z'()+_,\-./:=? ]{0,69}[0-9A-Za-z'()+_,\-./:=?]")
_CHUNK = 1 << 20


class MultipartError(ValueError):
    """A multipart body or its Content-Type is malformed; the message says what and where."""


class PartTooLargeError(MultipartError):
    """A part, or the number of parts, is over its bound."""


def related_boundary(content_type: str, part_type: str = "application/dicom") -> str:
    """The boundary of ``multipart/related; type="<part_type>"; boundary=...``; MultipartError
    when the header names another type (a ``type`` parameter, when given, must be part_type)."""
    msg = Message()
    msg["content-type"] = content_type[:1000]
    if msg.get_content_type() != "multipart/related":
        raise MultipartError(
            f'Content-Type must be multipart/related; type="{part_type}", not '
            f"{msg.get_content_type()!r}"
        )
    declared = msg.get_param("type")
    if declared is not None and str(declared).lower() != part_type:
        raise MultipartError(f"multipart/related of type {str(declared)[:80]!r}, not {part_type!r}")
    boundary = msg.get_param("boundary")
    if not isinstance(boundary, str) or not _BOUNDARY.fullmatch(boundary):
        raise MultipartError(
            "multipart/related without a valid boundary parameter (1-70 of RFC 2046's characters)"
        )
    return boundary


class MultipartReader:
    """Feed a multipart body in chunks; each part is written to the file ``on_part`` returns."""

    def __init__(
        self,
        boundary: str,
        on_part: Callable[[dict[str, str]], BinaryIO],
        max_part_bytes: int,
        max_parts: int,
        max_header_bytes: int = 16384,
    ) -> None:
        if not _BOUNDARY.fullmatch(boundary):
            raise MultipartError(f"not an RFC 2046 boundary: {boundary[:80]!r}")
        self._delim = b"\r\n--" + boundary.encode("ascii")
        self._on_part = on_part
        self.max_part_bytes = max_part_bytes
        self.max_parts = max_parts
        self.max_header_bytes = max_header_bytes
        self._buf = bytearray(b"\r\n")  # the first delimiter may open the body without a CRLF
        self._state = "preamble"  # preamble | after | headers | body | done
        self._out: BinaryIO | None = None
        self._part_bytes = 0
        self.parts = 0
        self.bytes_read = 0

    # ------------------------------------------------------------------ feeding

    def feed(self, chunk: bytes) -> None:
        self.bytes_read += len(chunk)
        if self._state == "done":
            return  # the epilogue is ignored
        self._buf += chunk
        while self._step():
            pass

    def close(self) -> int:
        """The number of parts read; MultipartError when the body is not complete."""
        if self._state != "done":
            where = f"in part {self.parts}" if self.parts else "before its first part"
            raise MultipartError(f"the body ended {where}, before the closing boundary")
        if self.parts == 0:
            raise MultipartError("the body has no part")
        return self.parts

    # ------------------------------------------------------------------ states

    def _step(self) -> bool:
        """Advance as far as the buffer allows; True when the state changed."""
        if self._state == "preamble":
            i = self._buf.find(self._delim)
            if i < 0:
                if len(self._buf) > self.max_header_bytes + len(self._delim):
                    raise MultipartError("no boundary where the body should start")
                return False
            del self._buf[: i + len(self._delim)]
            self._state = "after"
            return True
        if self._state == "after":  # after a delimiter: "--" ends, else padding and CRLF
            if len(self._buf) < 2:
                return False
            if self._buf[:2] == b"--":
                self._state = "done"
                self._buf.clear()
                return False
            j = self._buf.find(b"\r\n")
            if j < 0:
                if len(self._buf) > 256:
                    raise MultipartError(f"garbage after the boundary of part {self.parts + 1}")
                return False
            if self._buf[:j].strip(b" \t"):
                raise MultipartError(f"garbage after the boundary of part {self.parts + 1}")
            del self._buf[: j + 2]
            self._state = "headers"
            return True
        if self._state == "headers":
            j = self._buf.find(b"\r\n\r\n")
            if self._buf.startswith(b"\r\n"):
                j, skip = 0, 2  # no headers at all
            else:
                skip = 4
            if j < 0:
                if len(self._buf) > self.max_header_bytes:
                    raise MultipartError(
                        f"part {self.parts + 1}: headers over {self.max_header_bytes} bytes"
                    )
                return False
            if j > self.max_header_bytes:
                raise MultipartError(
                    f"part {self.parts + 1}: headers over {self.max_header_bytes} bytes"
                )
            headers = self._headers(bytes(self._buf[:j]))
            del self._buf[: j + skip]
            self.parts += 1
            if self.parts > self.max_parts:
                raise PartTooLargeError(f"more than {self.max_parts} parts")
            self._out = self._on_part(headers)
            self._part_bytes = 0
            self._state = "body"
            return True
        if self._state == "body":
            i = self._buf.find(self._delim)
            if i < 0:
                keep = len(self._delim) - 1
                if len(self._buf) > keep:
                    self._write(bytes(self._buf[:-keep]))
                    del self._buf[:-keep]
                return False
            self._write(bytes(self._buf[:i]))
            del self._buf[: i + len(self._delim)]
            self._out = None
            self._state = "after"
            return True
        return False

    def _write(self, data: bytes) -> None:
        if not data:
            return
        self._part_bytes += len(data)
        if self._part_bytes > self.max_part_bytes:
            raise PartTooLargeError(f"part {self.parts} is over {self.max_part_bytes} bytes")
        assert self._out is not None
        self._out.write(data)

    def _headers(self, block: bytes) -> dict[str, str]:
        out: dict[str, str] = {}
        for raw in block.split(b"\r\n")[:64] if block else []:
            line = raw.decode("latin-1")
            name, sep, value = line.partition(":")
            if not sep or not name.strip() or any(c in name for c in " \t"):
                raise MultipartError(f"part {self.parts + 1}: a malformed header line")
            if any((ord(c) < 0x20 and c != "\t") or ord(c) == 0x7F for c in line):
                raise MultipartError(f"part {self.parts + 1}: a header with control characters")
            out[name.strip().lower()[:100]] = value.strip()[:1000]
        return out


def encode_related(
    parts: Iterable[bytes | Path], part_type: str = "application/dicom"
) -> tuple[str, Iterator[bytes]]:
    """(The Content-Type header, the body's chunks) of a multipart/related body of ``parts``
    (bytes, or files streamed from disk)."""
    boundary = "nsbx-" + secrets.token_hex(16)
    content_type = f'multipart/related; type="{part_type}"; boundary={boundary}'

    def body() -> Iterator[bytes]:
        head = f"--{boundary}\r\nContent-Type: {part_type}\r\n\r\n".encode()
        for part in parts:
            yield head
            if isinstance(part, Path):
                with open(part, "rb") as fh:
                    while chunk := fh.read(_CHUNK):
                        yield chunk
            else:
                yield part
            yield b"\r\n"
        yield f"--{boundary}--\r\n".encode()

    return content_type, body()
