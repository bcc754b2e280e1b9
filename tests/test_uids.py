"""One DICOM UID rule (PS3.5 9.1, dicom/uids.py), and every former caller goes through it: the
gateway's check_uid (C-STORE, Orthanc, the cache, the spool key, the viewer), the viewer's
DICOMweb proxy paths and a NIfTI sidecar's UIDs."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from dicom import InvalidUIDError, check_uid, valid_uid

ROOT = Path(__file__).resolve().parents[1]

VALID = [
    "0",
    "1",
    "1.2.840.10008.5.1.4.1.1.4",  # MR Image Storage
    "2.25.329800735698586629295641978511506172918",  # a UUID-derived UID (PS3.5 B.2)
    "1.0.2",  # a component that is "0" may stand anywhere
    "1." + "2" * 62,  # 64 characters
]
INVALID = [
    "",
    "1.02",  # a leading zero
    "01.2",
    "1.2.00",
    "1..2",  # an empty component
    ".1.2",
    "1.2.",
    "1.2.a",  # not digits
    "1.2 .3",
    "1,2",
    "1." + "2" * 63,  # 65 characters
    "１.２",  # fullwidth digits are not DICOM's
    "../../etc",
]


@pytest.mark.parametrize("text", VALID)
def test_valid_uids(text: str) -> None:
    assert valid_uid(text)
    assert check_uid(text) == text


@pytest.mark.parametrize("text", INVALID)
def test_invalid_uids(text: str) -> None:
    assert not valid_uid(text)
    with pytest.raises(InvalidUIDError, match="not a DICOM UID"):
        check_uid(text)


def test_a_peers_padding_is_not_part_of_the_uid() -> None:
    assert check_uid(" 1.2.3\0") == "1.2.3"
    assert not valid_uid("1.2.3\0") and not valid_uid("1.2\n")  # the rule itself strips nothing


@pytest.mark.parametrize("text", ["1.02.3", "1..2", "1." + "2" * 63])
def test_every_former_caller_refuses_what_the_rule_refuses(text: str) -> None:
    from dicom.nifti import _Sidecar
    from gateway.cache import CacheKey
    from gateway.study_key import StudyKey
    from gateway.viewer import viewer_url
    from gateway.viewer_pacs import dicomweb_read_path

    with pytest.raises(InvalidUIDError):
        CacheKey("0a1b", "f00d", text)
    with pytest.raises(InvalidUIDError):
        _ = StudyKey(study_uid=text, patient_id="P").name
    with pytest.raises(InvalidUIDError):
        viewer_url(text, "1.2.3")
    assert not dicomweb_read_path(f"studies/{text}/series")
    sidecar = _Sidecar({"SeriesInstanceUID": text}, "x.json")
    assert sidecar.uid("SeriesInstanceUID") == "" and sidecar.warnings


def test_every_former_caller_takes_a_valid_uid() -> None:
    from dicom.nifti import _Sidecar
    from gateway.cache import CacheKey
    from gateway.study_key import StudyKey
    from gateway.viewer import viewer_url
    from gateway.viewer_pacs import dicomweb_read_path

    uid = "1.2.840.10008.0.1"
    CacheKey("0a1b", "f00d", uid)
    assert StudyKey(study_uid=uid, patient_id="P").name.startswith(uid + "_")
    assert uid in viewer_url(uid, uid)
    assert dicomweb_read_path(f"studies/{uid}/series")
    assert dicomweb_read_path(f"studies/{uid}/series/{uid}/instances/{uid}/bulk/7fe00010")
    assert dicomweb_read_path(f"studies/{uid}/series/{uid}/instances/{uid}/frames/1,2")
    assert _Sidecar({"SeriesInstanceUID": uid}, "x.json").uid("SeriesInstanceUID") == uid


# Regexes that *find* UID-like numbers in text (to hide them from logs, to map them in a
# de-identified copy) or match a URL's shape before valid_uid checks each UID in it: not rules.
SEARCHES = {
    "gateway/logs.py",  # redact_uids: UIDs in log lines become hashes
    "dicom/deid_study.py",  # UID tokens in the bytes of a de-identified copy
    "gateway/viewer_pacs.py",  # the DICOMweb paths' shape; each UID then valid_uid
}


def test_no_other_module_writes_its_own_uid_rule() -> None:
    """A regex of dotted digit runs repeated (``[0-9]+(\\.[0-9]+)*``, ``\\d+(?:\\.\\d+){4,}``) is a
    UID rule; a decimal number's ``(?:\\.\\d+)?`` is not."""
    shape = re.compile(r"(\[0-9\]\+|\\d\+)\((\?:)?\\\.(\[0-9\]\+|\\d\+)\)[*+{]")
    assert shape.search(r"^[0-9]+(\.[0-9]+)*$") and not shape.search(r"(\d+(?:\.\d+)?)")
    offenders = []
    for top in ("dicom", "evaluation", "gateway"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "dicom/uids.py" or rel in SEARCHES:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes):
                    value = node.value
                    text = value if isinstance(value, str) else value.decode("latin-1")
                    if shape.search(text):
                        offenders.append(f"{rel}:{node.lineno} {text!r}")
    assert offenders == [], "use dicom.valid_uid / check_uid"
