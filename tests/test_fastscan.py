"""The fast header scanner gives exactly what the pydicom path gives, or hands over to it.

Every comparison is between read_frames(fast=True) and read_frames(fast=False): equal frame
headers, or the same error type and message. Files are read in several orders, because the
scanner compares a file with earlier files of the same size (scan templates).
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable
from pathlib import Path

import pydicom
import pytest
from pydicom.dataelem import RawDataElement, convert_raw_data_element
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence
from pydicom.tag import BaseTag

from dicom.headers import scan
from dicom.headers.fast import clear_caches, read_frames_fast
from dicom.headers.frame import as_float, as_floats, as_int, as_text
from dicom.headers.read import read_frames
from dicom.headers.scanned import _plain_value
from dicom.index import build_series
from dicom.sources import iter_sources

BRAINIX_T2 = "brainix/BRAINIX/DICOM/T2"
DWI = "siemens_xa30/In/11001_DWI_dir80_AP"


def _outcome(path: str, fast: bool) -> object:
    try:
        return read_frames(path, fast=fast)
    except Exception as exc:  # the error is part of the output to compare
        return (type(exc).__name__, str(exc))


def _assert_same(paths: list[str], orders: int = 2) -> None:
    want = {p: _outcome(p, fast=False) for p in paths}
    for seed in range(orders):
        order = list(paths)
        if seed:
            random.Random(seed).shuffle(order)
        clear_caches()
        for p in order:
            assert _outcome(p, fast=True) == want[p], f"{p} (order {seed})"


def test_fast_and_pydicom_headers_agree_on_the_whole_corpus(corpus: Path) -> None:
    paths = list(iter_sources(corpus))
    want = [_outcome(p, fast=False) for p in paths]
    for seed in (0, 1):  # in folder order (templates hit) and shuffled (they mostly miss)
        order = list(range(len(paths)))
        if seed:
            random.Random(seed).shuffle(order)
        clear_caches()
        got: list[object] = [None] * len(paths)
        for i in order:
            got[i] = _outcome(paths[i], fast=True)
        for i, p in enumerate(paths):
            assert got[i] == want[i], p
    # The scanner is really used: all but the odd files (errors, mosaics, enhanced objects,
    # big endian, deeply nested sequences) take the fast path.
    clear_caches()
    fast = sum(read_frames_fast(p, 1 << 30) is not None for p in paths)
    assert fast >= 0.97 * len(paths)
    # And the series built from them are the same.
    frames_fast = [f for got_i in got if isinstance(got_i, list) for f in got_i]
    frames_slow = [f for w in want if isinstance(w, list) for f in w]
    a = [s.model_dump() for s in build_series(frames_fast)]
    b = [s.model_dump() for s in build_series(frames_slow)]
    assert a == b


def _variants(src: Path, out: Path, edits: dict[str, Callable[[Dataset], None]]) -> list[str]:
    paths = []
    for name, edit in edits.items():
        ds = pydicom.dcmread(src)
        edit(ds)
        path = out / f"{name}.dcm"
        ds.save_as(path, enforce_file_format=True)
        paths.append(str(path))
    return paths


def _nested(depth: int, undefined: bool) -> Sequence:
    item = Dataset()
    item.ReferencedSOPInstanceUID = "1.2.3.4"
    if depth > 1:
        item.ReferencedImageSequence = _nested(depth - 1, undefined)
    item.is_undefined_length_sequence_item = undefined
    seq = Sequence([item])
    seq.is_undefined_length = undefined
    return seq


def _set(**values: object) -> Callable[[Dataset], None]:
    def edit(ds: Dataset) -> None:
        for key, value in values.items():
            setattr(ds, key, value)

    return edit


def _implicit(ds: Dataset) -> None:
    ds.file_meta.TransferSyntaxUID = pydicom.uid.ImplicitVRLittleEndian


def _deflate(ds: Dataset) -> None:
    ds.file_meta.TransferSyntaxUID = pydicom.uid.DeflatedExplicitVRLittleEndian


def _private_un(ds: Dataset) -> None:
    ds.add_new((0x0019, 0x0010), "LO", "SIEMENS MR HEADER")
    ds.add_new((0x0019, 0x100C), "UN", b"1000")


def _private_is(ds: Dataset) -> None:
    ds.Manufacturer = "SIEMENS"
    ds.add_new((0x0019, 0x0010), "LO", "SIEMENS MR HEADER")
    ds.add_new((0x0019, 0x100C), "IS", "1000")
    ds.add_new((0x0019, 0x100E), "FD", [0.5, 0.5, 0.70710678])


def _undefined_sequences(ds: Dataset) -> None:
    ds.ReferencedImageSequence = _nested(3, undefined=True)
    ds.SourceImageSequence = _nested(2, undefined=False)


def _deep(ds: Dataset) -> None:
    ds.ReferencedImageSequence = _nested(20, undefined=True)


def _multi_window(ds: Dataset) -> None:
    ds.WindowCenter = ["40", "50.5"]
    ds.WindowWidth = ["80", "1e2"]


def _charset(ds: Dataset) -> None:
    ds.SpecificCharacterSet = "ISO_IR 192"
    ds.SeriesDescription = "Tête axiale Ø"
    ds.ProtocolName = "Голова"


def _contrast_sequence(ds: Dataset) -> None:
    code = Dataset()
    code.CodeMeaning = "Gadobutrol"
    ds.ContrastBolusAgentSequence = Sequence([code])


EDITS: dict[str, Callable[[Dataset], None]] = {
    "plain": lambda ds: None,
    "implicit": _implicit,
    "deflate": _deflate,
    "empty_values": _set(WindowCenter=None, InstanceNumber=None, SeriesDescription="", Rows=None),
    "odd_numbers": _set(InstanceNumber=" 0012", ImagePositionPatient=["+1", ".5", "-0"]),
    "multi_window": _multi_window,
    "charset": _charset,
    "private_un": _private_un,
    "private_is": _private_is,
    "undefined_sequences": _undefined_sequences,
    "deep_sequences": _deep,
    "contrast_sequence": _contrast_sequence,
    "longer_uid": _set(SOPInstanceUID="1.2.826.0.1.3680043.8.498.1234567890123456789012345"),
    "non_image": _set(SOPClassUID="1.2.840.10008.5.1.4.1.1.88.22"),
}


def test_edited_files_agree_with_pydicom(corpus: Path, tmp_path: Path) -> None:
    src = sorted((corpus / BRAINIX_T2).iterdir())[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        paths = _variants(src, tmp_path, EDITS)
        _assert_same(paths, orders=3)


def _raw_edit(data: bytes, tag: tuple[int, int], how: str | bytes) -> bytes:
    """Duplicate, move to the end of the header, or give a new value to the element ``tag``
    (explicit VR little endian, short VR), as bytes: pydicom would not write these."""
    key = tag[0].to_bytes(2, "little") + tag[1].to_bytes(2, "little")
    start = data.index(key, 132)
    length = int.from_bytes(data[start + 6 : start + 8], "little")
    element = data[start : start + 8 + length]
    pixel = data.index(b"\xe0\x7f\x10\x00", start)
    if how == "duplicate":
        return data[:pixel] + element + data[pixel:]
    if how == "move":
        return data[:start] + data[start + 8 + length : pixel] + element + data[pixel:]
    assert isinstance(how, bytes)
    new = element[:6] + len(how).to_bytes(2, "little") + how
    return data[:start] + new + data[start + 8 + length :]


def test_raw_oddities_agree_with_pydicom(corpus: Path, tmp_path: Path) -> None:
    files = sorted((corpus / BRAINIX_T2).iterdir())
    data = files[0].read_bytes()
    header_end = data.index(b"\xe0\x7f\x10\x00")
    variants = {
        "duplicate_description": _raw_edit(data, (0x0008, 0x103E), "duplicate"),
        "moved_rows": _raw_edit(data, (0x0028, 0x0010), "move"),
        "cut_in_header": data[: header_end * 2 // 3],
        "cut_in_pixels": data[: header_end + 1000],
        "cut_after_header": data[:header_end],
        "no_preamble": data[132:],
        "bad_thickness": _raw_edit(data, (0x0018, 0x0050), b"abc "),
        "bad_echo_time": _raw_edit(data, (0x0018, 0x0081), b"1,5 "),
        "float_instance": _raw_edit(data, (0x0020, 0x0013), b"7.5 "),
        "bad_position": _raw_edit(data, (0x0020, 0x0032), b"1\\2\\x "),
        "short_orientation": _raw_edit(data, (0x0020, 0x0037), b"1\\0\\0 "),
        "trailing_garbage": data + b"\x01\x02\x03",
    }
    paths = [str(f) for f in files[:3]]
    for name, blob in variants.items():
        path = tmp_path / f"{name}.dcm"
        path.write_bytes(blob)
        paths.append(str(path))
    _assert_same(paths, orders=3)


def test_siblings_that_differ_in_layout_agree_with_pydicom(corpus: Path, tmp_path: Path) -> None:
    """DWI siblings share size and layout; edits shift, grow or reorder their elements."""
    import gzip

    srcs = sorted((corpus / DWI).iterdir())[:6]
    paths = []
    for i, src in enumerate(srcs):
        path = tmp_path / f"{i}.dcm"
        path.write_bytes(gzip.decompress(src.read_bytes()))
        paths.append(str(path))
    edits = {
        "instance_grows": _set(InstanceNumber="123456"),
        "new_private": lambda ds: ds.add_new((0x0021, 0x10FF), "LO", "extra"),
        "blob_shorter": lambda ds: setattr(ds[(0x0021, 0x1019)], "value", b"\x00" * 1000),
        "position_grows": _set(
            ImagePositionPatient=["-100.4238510", "-156.0938453", "113.2239446"]
        ),
        "sequence_name": _set(SequenceName="ep_b0"),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, edit in edits.items():
            ds = pydicom.dcmread(paths[1])
            edit(ds)
            path = tmp_path / f"{name}.dcm"
            ds.save_as(path, enforce_file_format=True)
            paths.append(str(path))
        _assert_same(paths + paths[:3], orders=4)


def test_files_scan_alike_with_and_without_templates(corpus: Path, tmp_path: Path) -> None:
    import gzip

    for i, src in enumerate(sorted((corpus / DWI).iterdir())[:20]):
        (tmp_path / f"{i}.dcm").write_bytes(gzip.decompress(src.read_bytes()))
    clear_caches()
    for path in sorted(tmp_path.iterdir()):
        with open(path, "rb") as fp:
            a = scan.scan_file(fp, path.stat().st_size, templates=True)
        with open(path, "rb") as fp:
            b = scan.scan_file(fp, path.stat().st_size, templates=False)
        assert (a.stop, a.after, a.implicit) == (b.stop, b.after, b.implicit)
        assert {t: (r.VR, r.value) for t, r in a.elements.items()} == {
            t: (r.VR, r.value) for t, r in b.elements.items()
        }


@pytest.mark.parametrize(
    ("vr", "values"),
    [
        (
            "DS",
            [
                *(b"1", b"-100.424\\-156.094\\113.224 ", b" 12.5 ", b"1e3", b"1E+03", b"-0"),
                *(b".5", b"5.", b"+3.25", b"1.5\x00", b"1.5 \x00", b"12345678901234567"),
                *(b"1\\2", b"1 \\ 2 ", b"1e400", b"nan", b"1_0", b" ", b"1\\", b"0x10", b"\t1.5"),
            ],
        ),
        ("IS", [b"12", b" 12 ", b"-3", b"+4", b"1\\2", b"0012", b"12\x00", b"1.0", b"12a"]),
        ("UI", [b"1.2.3", b"1.2.3\x00", b"1.2.3 ", b"1.2..3", b"1" * 64, b"1" * 65, b"1.2 3"]),
    ],
)
def test_plain_numbers_read_as_pydicom_reads_them(vr: str, values: list[bytes]) -> None:
    tag = {"DS": 0x00200032, "IS": 0x00200013, "UI": 0x00080018}[vr]
    views: dict[str, tuple[Callable[[object], object], ...]] = {
        "DS": (as_float, lambda v: as_floats(v, 3), lambda v: as_floats(v, 2)),
        "IS": (as_int, as_float),
        "UI": (lambda v: as_text(v, 64), as_text),
    }
    checked = 0
    for value in values:
        raw = RawDataElement(BaseTag(tag), vr, len(value), value, 0, False, True)
        plain = _plain_value(vr, raw)
        if plain is None:
            continue  # left to pydicom
        checked += 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = convert_raw_data_element(raw, encoding="iso8859").value
        for view in views[vr]:
            assert repr(view(plain)) == repr(view(ref)), (vr, value)
    assert checked >= 5
