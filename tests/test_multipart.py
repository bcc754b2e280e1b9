"""The multipart/related codec of DICOMweb (gateway/pacs/multipart.py), on hostile bodies."""

from __future__ import annotations

import io
import random

import pytest

from gateway.pacs.multipart import (
    MultipartError,
    MultipartReader,
    PartTooLargeError,
    encode_related,
    related_boundary,
)


def _read(body: bytes, boundary: str, chunk: int, **kw: int) -> list[bytes]:
    parts: list[io.BytesIO] = []

    def on_part(headers: dict[str, str]) -> io.BytesIO:
        parts.append(io.BytesIO())
        return parts[-1]

    r = MultipartReader(boundary, on_part, kw.get("max_part_bytes", 1 << 20),
                        kw.get("max_parts", 100))  # fmt: skip
    for i in range(0, len(body), chunk):
        r.feed(body[i : i + chunk])
    r.close()
    return [p.getvalue() for p in parts]


def _encoded(parts: list[bytes]) -> tuple[str, bytes]:
    ct, chunks = encode_related(parts)
    return related_boundary(ct), b"".join(chunks)


@pytest.mark.parametrize("chunk", [1, 2, 7, 64, 1 << 20])
def test_parts_come_back_exactly_whatever_the_chunking(chunk: int) -> None:
    rnd = random.Random(7)
    boundary = "xyz"
    data = [
        b"",
        b"\r\n--xy\r\n--xyz-not-quite"[:12],  # CRLF and a near-delimiter in the data
        bytes(rnd.getrandbits(8) for _ in range(3000)),
        b"\r\n",
    ]
    body = b"preamble text\r\n" + b"".join(
        b"--xyz\r\nContent-Type: application/dicom\r\n\r\n" + d + b"\r\n" for d in data
    ) + b"--xyz--\r\nepilogue"  # fmt: skip
    assert _read(body, boundary, chunk) == data
    b, enc = _encoded(data)
    assert _read(enc, b, chunk) == data


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"--b\r\nContent-Type: application/dicom\r\n\r\nabc", "ended in part 1"),
        (b"no boundary at all", "ended before its first part"),
        (b"--b--\r\n", "no part"),
        (b"--b\r\nContent-Type application/dicom\r\n\r\nabc\r\n--b--", "malformed header"),
        (b"--bGARBAGE\r\n\r\nabc\r\n--b--", "garbage after the boundary"),
        (b"--b\r\n" + b"X-A: " + b"a" * 20000, "headers over"),
    ],
)
def test_a_malformed_body_is_a_clear_error(body: bytes, error: str) -> None:
    with pytest.raises(MultipartError, match=error):
        _read(body, "b", 5)


def test_bounds_are_checked_as_the_bytes_come() -> None:
    b, enc = _encoded([b"x" * 100, b"y"])
    with pytest.raises(PartTooLargeError, match="part 1 is over 50 bytes"):
        _read(enc, b, 10, max_part_bytes=50)
    b, enc = _encoded([b"a", b"b", b"c"])
    with pytest.raises(PartTooLargeError, match="more than 2 parts"):
        _read(enc, b, 10, max_parts=2)


def test_the_content_type_must_be_related_dicom() -> None:
    assert related_boundary('multipart/related; type="application/dicom"; boundary="a b"') == "a b"
    assert related_boundary("multipart/related; boundary=abc") == "abc"  # type omitted
    for bad in ("application/dicom", "multipart/form-data; boundary=x",
                'multipart/related; type="application/json"; boundary=x',
                'multipart/related; type="application/dicom"'):  # fmt: skip
        with pytest.raises(MultipartError):
            related_boundary(bad)


@pytest.mark.parametrize(
    "header",
    [
        "multipart/related; boundary=\u20ac",  # not ASCII: was a UnicodeEncodeError (a 500)
        'multipart/related; boundary="a\\"b"',
        "multipart/related; boundary=a\x01b",
        'multipart/related; boundary="ends with space "',
        'multipart/related; boundary="a;b"',
    ],
)
def test_a_boundary_outside_rfc_2046_is_refused(header: str) -> None:
    with pytest.raises(MultipartError, match="boundary"):
        related_boundary(header)
    with pytest.raises(MultipartError, match="boundary"):
        MultipartReader("\u20ac\r\n", lambda h: io.BytesIO(), 10, 10)


def test_a_header_with_control_characters_is_refused() -> None:
    body = b"--b\r\nContent-Type: application/dicom\x00\x1b[2J\r\n\r\nx\r\n--b--\r\n"
    with pytest.raises(MultipartError, match="control characters"):
        _read(body, "b", 64)
