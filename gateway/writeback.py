"""The one write-back: what goes back into the PACS for a run, built and stored one way.

The pipeline (every study it evaluates, the demo's included) and the re-issue of a verified
case both come here:

- ``evidence``: the SR's evidence from the study's one index (the first header of each
  evaluated series, kept by ``dicom.index_path(keep_headers=True)``, and the SOP Instance UIDs
  the spool and the PACS download name their files by): no file is read again;
- ``evidence_refs`` / ``evidence_headers``: that evidence as the run log records it in the
  run's ``GatewayRun`` (``EvidenceRef``: the kept first header of each series without pixel
  data or long values, a plain reference for every other instance), so that the re-issue of a
  verified case attaches its VERIFIED SR to exactly what the UNVERIFIED one named, without
  asking the PACS for the headers again; ``load_evidence`` reads the ``evidence.json`` of a
  bundle written before (``save_evidence``, kept for bundles handed in);
- ``build_unverified``: one UNVERIFIED Comprehensive 3D SR per model that answered (its review
  block, ``evaluation.unverified_content``); ``checklist_pdf``: the checklist as Encapsulated
  PDF;
- ``store``: every object built before the first is stored; each stored in Orthanc (or a
  configured PACS), in order;
- ``keep`` / ``deliver``: the pipeline's write-back to the configured destination
  (``NEUROSANDBOX_PACS_FILE``'s ``writeback:``, default the local Orthanc): each object's file
  is kept before the first store, a few quick tries are made, and an object not stored stays
  pending in the run's record (``WriteBack``: attempts, the reason, when to try again) with its
  file kept, until ``gateway.writeback_retry`` stores it. Nothing is lost.

``gateway.review.reissue`` builds the VERIFIED objects of a signed-off case from the recorded evidence
and stores them through ``store`` too.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydicom.dataelem import DataElement
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence as DicomSequence
from pydicom.valuerep import BYTES_VR, VR

from dicom import (
    FileTooLargeError,
    IndexResult,
    InvalidUIDError,
    NotRegularFileError,
    atomic_write,
    check_uid,
    read_regular,
)
from evaluation.log import EvidenceRef, RunData, WriteBack
from evaluation.review import report_blocks, unverified_content
from gateway.orthanc import OrthancClient
from gateway.pacs import PacsClient, PacsRequestError, StoreResult
from gateway.sr import build_pdf, build_sr, encode, header_warnings, model_of

PDF_TITLE = "NeuroSandbox AI checklist"
EVIDENCE_FILE = "evidence.json"  # in the run's report bundle
MAX_EVIDENCE_BYTES = 64 * 1024 * 1024
MAX_EVIDENCE_ITEMS = 100_000  # instances; a reference is ~300 bytes of JSON
MAX_VALUE_BYTES = 1024  # a recorded value over this (pixels, vendor blobs, long text) is dropped
_PIXELS = {0x7FE00008, 0x7FE00009, 0x7FE00010}  # Float, Double Float, Pixel Data
_VRS = frozenset(str(v.value) for v in VR if " or " not in v.value)  # not "OB or OW"
_EVIDENCE_UIDS = ("SOPClassUID", "SOPInstanceUID", "SeriesInstanceUID", "StudyInstanceUID")


class NoEvidenceError(RuntimeError):
    """No readable source instance to attach the report to."""


def evidence(index: IndexResult, series_uids: Iterable[str]) -> list[Dataset]:
    """The SR's evidence: per evaluated series, its kept first header, then one reference per
    other instance, by the SOP Instance and SOP Class UIDs the index read from its header
    (never from a file's name); an instance whose UIDs are not valid UIDs is left out."""
    wanted = set(series_uids)
    sops: dict[str, dict[str, str]] = {}  # series UID -> SOP Instance UID -> its SOP Class UID
    for s in index.series:  # a series may be several stacks, an instance several frames
        if not wanted or s.series_uid in wanted:
            of = sops.setdefault(s.series_uid, {})
            for f in (f for v in s.volumes for f in v):
                of.setdefault(f.sop_instance_uid, f.sop_class_uid)
    out: list[Dataset] = []
    for uid, instances in sops.items():
        first = index.series_headers.get(uid)
        if first is None or str(first.get("SeriesInstanceUID", "")) != uid:
            continue
        out.append(first)
        for sop, sop_class in sorted(instances.items()):
            if sop == str(first.SOPInstanceUID):
                continue
            try:
                ref = Dataset()
                ref.SOPClassUID = check_uid(sop_class)
                ref.SOPInstanceUID = check_uid(sop)
            except InvalidUIDError:
                continue
            ref.SeriesInstanceUID = uid
            ref.StudyInstanceUID = first.StudyInstanceUID
            out.append(ref)
    if not out:
        raise NoEvidenceError("no readable source instance to attach the report to")
    return out


def _small(ds: Dataset) -> Dataset:
    """A copy of ``ds`` without pixel data and without any value over ``MAX_VALUE_BYTES``."""
    out = Dataset()
    for tag in list(ds.keys()):
        if tag in _PIXELS:
            continue
        try:
            elem = ds[tag]
        except Exception:  # a value pydicom cannot decode: not recorded (as suppress_invalid_tags)
            continue
        if elem.VR not in _VRS:
            continue  # an ambiguous VR pydicom could not resolve: no DICOM JSON for it
        value = elem.value
        if elem.VR == "SQ":
            out[tag] = DataElement(tag, "SQ", DicomSequence([_small(item) for item in value]))
        elif isinstance(value, bytes | bytearray):
            if len(value) <= MAX_VALUE_BYTES:
                out[tag] = elem
        elif elem.VR not in BYTES_VR and len(str(value)) <= MAX_VALUE_BYTES:
            out[tag] = elem
    return out


def save_evidence(headers: list[Dataset], folder: Path) -> Path:
    """Record the SR's evidence in ``folder`` (the run's report bundle) as ``evidence.json``: a
    list of DICOM JSON model objects, without pixel data or values over ``MAX_VALUE_BYTES``."""
    if not headers:
        raise NoEvidenceError("no source instance to record as the report's evidence")
    if len(headers) > MAX_EVIDENCE_ITEMS:
        raise ValueError(
            f"{len(headers)} evidence instances: more than the {MAX_EVIDENCE_ITEMS} a report "
            "bundle records"
        )
    items = [_small(ds).to_json_dict(suppress_invalid_tags=True) for ds in headers]
    path = folder / EVIDENCE_FILE
    with atomic_write(path, fsync=False) as fh:
        fh.write(json.dumps(items, separators=(",", ":")).encode())
    return path


def load_evidence(folder: Path) -> list[Dataset]:
    """The evidence recorded by ``save_evidence`` in ``folder``. The file is hostile input:
    anything but a list of at most ``MAX_EVIDENCE_ITEMS`` DICOM JSON objects of one study, each
    naming its instance, raises ``NoEvidenceError``."""
    path = folder / EVIDENCE_FILE
    try:
        data: Any = json.loads(read_regular(path, MAX_EVIDENCE_BYTES))  # a pipe: never opened
    except FileTooLargeError as exc:
        size = f"{exc.size / 2**20:.0f} MiB, over" if exc.size else "over"
        raise NoEvidenceError(
            f"{path}: {size} the {MAX_EVIDENCE_BYTES // 2**20} MiB an evidence file may have"
        ) from None
    except FileNotFoundError:
        raise NoEvidenceError(f"{path}: no recorded evidence (file missing)") from None
    except NotRegularFileError as exc:
        raise NoEvidenceError(f"{path}: unreadable evidence ({exc})") from None
    except (OSError, ValueError, RecursionError) as exc:  # unreadable, not UTF-8, not JSON
        raise NoEvidenceError(f"{path}: unreadable evidence ({type(exc).__name__})") from None
    if not isinstance(data, list) or not data:
        raise NoEvidenceError(f"{path}: not a non-empty list of DICOM JSON objects")
    if len(data) > MAX_EVIDENCE_ITEMS:
        raise NoEvidenceError(f"{path}: {len(data)} items, over {MAX_EVIDENCE_ITEMS}")
    return _checked(data, str(path))


def _checked(data: list[Any], where: str) -> list[Dataset]:
    """Recorded evidence items (DICOM JSON objects) as datasets: each must be an instance
    header of valid UIDs, all of one study, else ``NoEvidenceError``."""
    out: list[Dataset] = []
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise NoEvidenceError(f"{where}: item {i} is not a DICOM JSON object")
        try:
            ds = Dataset.from_json(item)
            for elem in ds.iterall():  # pydicom converts values as they are read: read each now
                if elem.VR not in _VRS:
                    raise ValueError(f"{elem.tag}: {str(elem.VR)[:16]!r} is not a DICOM VR")
            missing = [kw for kw in _EVIDENCE_UIDS if kw not in ds]
            for kw in _EVIDENCE_UIDS:
                if kw not in missing:
                    check_uid(str(ds[kw].value))
        except Exception as exc:  # hostile content: pydicom raises many kinds; refuse it all
            raise NoEvidenceError(
                f"{where}: item {i} is not a DICOM JSON instance header ({type(exc).__name__}: "
                f"{str(exc)[:200]})"
            ) from None
        if missing:
            raise NoEvidenceError(f"{where}: item {i} has no {', '.join(missing)}")
        if out and str(ds.StudyInstanceUID) != str(out[0].StudyInstanceUID):
            raise NoEvidenceError(f"{where}: item {i} is of another study than item 0")
        out.append(ds)
    return out


def evidence_refs(headers: list[Dataset]) -> list[EvidenceRef]:
    """The SR's evidence as the run's record keeps it: each series' kept first header (DICOM
    JSON, without pixel data or values over ``MAX_VALUE_BYTES``), a reference for the rest."""
    if not headers:
        raise NoEvidenceError("no source instance to record as the report's evidence")
    if len(headers) > MAX_EVIDENCE_ITEMS:
        raise ValueError(
            f"{len(headers)} evidence instances: more than the {MAX_EVIDENCE_ITEMS} a run records"
        )
    out = []
    for ds in headers:
        plain = set(ds.dir()) <= set(_EVIDENCE_UIDS)
        header = (
            None
            if plain
            else json.dumps(
                _small(ds).to_json_dict(suppress_invalid_tags=True), separators=(",", ":")
            )
        )
        out.append(
            EvidenceRef(
                series_uid=str(ds.SeriesInstanceUID),
                sop_instance_uid=str(ds.SOPInstanceUID),
                sop_class_uid=str(ds.SOPClassUID),
                header=header,
            )
        )
    return out


def evidence_headers(refs: list[EvidenceRef], where: str) -> list[Dataset]:
    """The evidence a run recorded (``evidence_refs``) as datasets, checked as
    ``load_evidence`` checks a file (the record is read back: hostile all the same);
    ``NoEvidenceError`` when there is none or it does not hold."""
    if not refs:
        raise NoEvidenceError(f"{where}: no recorded evidence")
    if len(refs) > MAX_EVIDENCE_ITEMS:
        raise NoEvidenceError(f"{where}: {len(refs)} items, over {MAX_EVIDENCE_ITEMS}")
    study = None
    items: list[Any] = []
    for i, r in enumerate(refs):
        if r.header is not None:
            try:
                item = json.loads(r.header)
            except ValueError:
                raise NoEvidenceError(f"{where}: item {i}'s header is not JSON") from None
            if isinstance(item, dict):
                study = item.get("0020000D", {}).get("Value", [study])[0]
            items.append(item)
        else:
            items.append(
                {
                    "00080016": {"vr": "UI", "Value": [r.sop_class_uid]},
                    "00080018": {"vr": "UI", "Value": [r.sop_instance_uid]},
                    "0020000E": {"vr": "UI", "Value": [r.series_uid]},
                    "0020000D": {"vr": "UI", "Value": [study]} if study else {"vr": "UI"},
                }
            )
    return _checked(items, where)


@dataclass
class Unverified:
    """What a run writes back first: per model its SR, and what was left out."""

    srs: dict[str, Dataset] = field(default_factory=dict)  # model -> SR
    left_out: list[str] = field(default_factory=list)  # header values outside the standard
    no_sr: list[str] = field(default_factory=list)  # models without an answer, and why

    @property
    def warnings(self) -> list[str]:
        return [*self.left_out, *self.no_sr]


def build_unverified(
    run: RunData,
    models: Iterable[str],
    headers: list[Dataset],
    version: int,
    evaluator: str,
    previous: Sequence[Dataset] = (),
    no_answer: Callable[[str], str] = lambda model: "no answer",
) -> Unverified:
    """The UNVERIFIED SR of every model that answered. ``previous``: earlier SRs of the study
    (each model's is named as predecessor); ``no_answer(model)`` says why a model without an
    answer has no SR."""
    out = Unverified()
    # header values outside the standard are left out of the SR and PDF, and said so
    out.left_out = [f"SR/PDF: {w}" for w in header_warnings(headers[0])]
    blocks = {b.model: b for b in report_blocks(run.samples, run.images)}  # with the points
    for model in models:
        if model not in blocks:
            out.no_sr.append(f"no SR for {model}: no answer to report ({no_answer(model)})")
            continue
        prev = [d for d in previous if model_of(d) == model]
        content = unverified_content(blocks[model])
        out.srs[model] = build_sr(headers, content, model, evaluator, version, prev,
                                  tracking=run.run_id)  # fmt: skip
    return out


def warm() -> None:
    """Load ahead what a process's first write-back loads on first use (the gateway calls it
    while idle): the lexicon the review blocks name each diagnosis by, and highdicom's and
    pydicom's tables, by building and encoding the SR and PDF of a made-up MR instance. On
    this machine, 0.5-1 s of CPU the first study's SR would otherwise wait for."""
    from pydicom.uid import MRImageStorage, generate_uid

    from evaluation.review import ReportContent
    from evaluation.scoring import default_lexicon

    default_lexicon()
    ds = Dataset()
    ds.SOPClassUID, ds.SOPInstanceUID = MRImageStorage, generate_uid()
    ds.StudyInstanceUID, ds.SeriesInstanceUID = generate_uid(), generate_uid()
    ds.PatientID, ds.PatientName, ds.Modality = "WARM-UP", "Warm^Up", "MR"
    ref = Dataset()
    ref.SOPClassUID, ref.SOPInstanceUID = MRImageStorage, generate_uid()
    ref.SeriesInstanceUID, ref.StudyInstanceUID = ds.SeriesInstanceUID, ds.StudyInstanceUID
    headers = [ds, ref]
    encode(build_sr(headers, ReportContent(no_findings=True), "warm-up", "0", 1))
    encode(build_pdf(ds, b"%PDF-1.4\n%%EOF\n", PDF_TITLE, 1))
    evidence_refs(headers)


def checklist_pdf(headers: list[Dataset], pdf: bytes | None, version: int) -> Dataset | None:
    """The checklist (Chromium's print of the report bundle's case page) as Encapsulated PDF;
    None when it could not be printed."""
    return build_pdf(headers[0], pdf, PDF_TITLE, version) if pdf else None


class WritebackError(RuntimeError):
    """An object was not stored; the message says which and why."""


def store(
    target: OrthancClient | PacsClient,
    objects: Iterable[Dataset],
    on_stored: Callable[[Dataset], None] = lambda ds: None,
) -> None:
    """Store each object, in order (Orthanc's REST API, or any configured PACS);
    ``on_stored`` hears each once stored. Raises on the first object not stored."""
    if isinstance(target, OrthancClient):
        for ds in objects:
            target.upload(encode(ds))
            on_stored(ds)
        return
    items = list(objects)
    for ds, result in zip(items, target.store(items), strict=True):
        if not result.stored:
            raise WritebackError(
                f"{target.name}: {result.sop_instance_uid} not stored: {result.detail}"
            )
        on_stored(ds)


# ---------------------------------------------------------------------------- pending objects

KEPT_DIR = "writeback"  # DATA_DIR/writeback/<run id>/<SOP Instance UID>.dcm: kept until stored
QUICK_TRIES = 3  # tries of one delivery before the object waits for the retry loop
MAX_ERROR = 300


def retry_delay_s(attempts: int, base_s: float = 30.0, max_s: float = 3600.0) -> float:
    """How long a pending object waits after its ``attempts``-th failed delivery."""
    return float(min(max_s, base_s * 2 ** max(0, attempts - 1)))


@dataclass
class Delivery:
    """What one delivery did: the objects stored, and those still pending (with why)."""

    done: list[WriteBack] = field(default_factory=list)
    pending: list[WriteBack] = field(default_factory=list)


def keep(kept_root: Path, run_id: str, ds: Dataset) -> Path:
    """The object's file under ``kept_root/<run id>/``, written whole before any store."""
    folder = kept_root / run_id
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{check_uid(str(ds.SOPInstanceUID))}.dcm"
    with atomic_write(path) as fh:
        fh.write(encode(ds))
    return path


def deliver(
    dest: PacsClient,
    items: Sequence[tuple[WriteBack, Dataset]],
    now: Callable[[], float],
    quick_tries: int = QUICK_TRIES,
    quick_wait_s: float = 0.5,
    base_delay_s: float = 30.0,
) -> Delivery:
    """Store the objects in order on ``dest``, trying a few times at once when the PACS
    cannot be reached; an object stored loses its kept file, one not stored stays pending
    with its attempts, the reason and when to try again. Never raises for the PACS."""
    import datetime as dt

    out = Delivery()
    results: dict[str, StoreResult] = {}
    error = ""
    for attempt in range(quick_tries):
        try:
            got = dest.store([ds for _, ds in items])
        except PacsRequestError as exc:
            error = str(exc)
            if attempt + 1 < quick_tries:
                time.sleep(quick_wait_s * 2**attempt)
            continue
        results = {r.sop_instance_uid: r for r in got}
        break
    stamp = dt.datetime.fromtimestamp(now(), dt.UTC)
    for wb, ds in items:
        uid = str(ds.SOPInstanceUID)
        r = results.get(uid)
        if r is not None and r.stored:
            if wb.kept:
                Path(wb.kept).unlink(missing_ok=True)
            out.done.append(wb.model_copy(update={
                "at": stamp.isoformat(timespec="seconds"), "destination": dest.name,
                "attempts": wb.attempts + 1, "last_error": None, "next_at": None, "kept": None,
            }))  # fmt: skip
            continue
        attempts = wb.attempts + 1
        why = (r.detail if r is not None else error) or "not stored"
        retry = stamp + dt.timedelta(seconds=retry_delay_s(attempts, base_delay_s))
        out.pending.append(wb.model_copy(update={
            "destination": dest.name, "attempts": attempts,
            "last_error": "".join(c for c in why if c.isprintable())[:MAX_ERROR],
            "next_at": retry.isoformat(timespec="seconds"),
        }))  # fmt: skip
    return out


def load_kept(wb: WriteBack) -> Dataset | None:
    """The kept file of a pending object (None when it is gone: nothing can be sent)."""
    import pydicom

    if not wb.kept or not Path(wb.kept).is_file():
        return None
    return pydicom.dcmread(wb.kept)


def due(wb: WriteBack, now: float) -> bool:
    """Whether a pending object is to be tried again at ``now`` (epoch seconds)."""
    import datetime as dt

    if not wb.next_at:
        return True
    try:
        return dt.datetime.fromisoformat(wb.next_at).timestamp() <= now
    except ValueError:
        return True
