"""Orthanc client on pyorthanc: list, classify, fetch (streamed, cached) and store instances.

Timeouts suit long calls (archives, moves, uploads of big studies); idempotent requests are
retried (tenacity: ``retries`` more attempts, waits of 0.5 s doubling) on transport errors
and 502/503/504; failed connects are also retried by the httpx transport. Series classes come
from the imaging core (``dicom.index``) run on header-only copies built from the DICOMweb
metadata, so no pixel data crosses the network to classify a series.
"""

from __future__ import annotations

import io
import logging
import os
import ssl
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pydicom
from pydantic import BaseModel, Field
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian
from pyorthanc import Orthanc
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

from dicom import SeriesInfo, atomic_write, check_uid, index_path
from gateway.cache import CacheKey, InstanceCache
from gateway.study_key import orthanc_id

log = logging.getLogger(__name__)
# A series read instance by instance (its UID is in the PACS more than once): at most this many
# instances' headers (classification needs a sample, not thousands), each from at most this
# many bytes of its file (a header longer than that is not a scanner's).
MAX_SERIES_HEADERS = 2000
HEADER_BYTES = 8 << 20
T = TypeVar("T")
RETRY_STATUS = {502, 503, 504}
BACKOFF_S = 0.5  # wait before the first retry; doubles before each next one


def _retryable(exc: BaseException) -> bool:
    """A failure worth another try of an idempotent call: the transport, or 502/503/504."""
    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code in RETRY_STATUS
    return isinstance(exc, httpx.TransportError)


def _failure(exc: BaseException | None) -> str:
    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code}"
    return type(exc).__name__


def _body(response: httpx.Response) -> str:
    """The start of an error answer's body; "" for a streamed answer (its body was not read:
    reading ``.text`` would raise ResponseNotRead instead of the error)."""
    try:
        return response.text[:200]
    except httpx.ResponseNotRead:
        return ""


class OrthancError(RuntimeError):
    """Orthanc refused or failed a request (message says which, without credentials)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status  # HTTP status from Orthanc; None when it could not be reached


class StackClass(BaseModel):
    series_class: str
    detail: str = ""
    reason: str = ""
    confidence: float = 0.0
    plane: str | None = None
    n_files: int = 0


class SeriesSummary(BaseModel):
    orthanc_id: str
    series_uid: str
    series_number: int | None = None
    modality: str = ""
    description: str = ""
    n_instances: int = 0
    series_class: str = "UNKNOWN"  # class of the largest stack
    stacks: list[StackClass] = Field(default_factory=list)


class StudySummary(BaseModel):
    orthanc_id: str
    study_uid: str
    patient_orthanc_id: str = ""
    patient_id: str = ""
    patient_name: str = ""
    study_date: str = ""
    description: str = ""
    accession_number: str = ""
    n_series: int = 0
    is_stable: bool = False
    last_update: str = ""


class PatientSummary(BaseModel):
    orthanc_id: str
    patient_id: str = ""
    patient_name: str = ""
    birth_date: str = ""
    sex: str = ""
    n_studies: int = 0


def _int(v: Any) -> int | None:
    try:
        return int(str(v).strip())
    except (TypeError, ValueError):
        return None


class OrthancClient:
    """One Orthanc server. ``api`` is the underlying ``pyorthanc.Orthanc`` (an httpx.Client)."""

    def __init__(
        self,
        url: str,
        username: str | None,
        password: str | None,
        timeout_s: float = 600.0,
        retries: int = 3,
        backoff_s: float = BACKOFF_S,
        verify: ssl.SSLContext | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.retries = retries  # further attempts of an idempotent call after the first
        self.backoff_s = backoff_s
        self.api = Orthanc(
            self.url,
            username=username,
            password=password,
            timeout=httpx.Timeout(timeout_s, connect=10.0, pool=60.0),
            # connection errors only; ``verify``: the hospital's CA for https (None: the system's)
            transport=httpx.HTTPTransport(retries=retries, verify=verify or True),
        )
        self._class_cache: dict[tuple[str, str], list[StackClass]] = {}

    @classmethod
    def from_settings(cls, settings: Any) -> OrthancClient:
        from gateway.pacs_local import orthanc_password, resolve_endpoints

        ep = resolve_endpoints(settings)
        return cls(
            ep.orthanc_url,
            ep.username,
            orthanc_password(settings, ep),
            timeout_s=settings.orthanc_timeout_s,
        )

    def close(self) -> None:
        self.api.close()

    # ----------------------------------------------------------------- plumbing

    def _retry(self, what: str, fn: Callable[[], T], idempotent: bool = True) -> T:
        """Call ``fn``; an idempotent call is tried again (up to ``retries`` times, waiting
        ``backoff_s``, then twice as long each time) on a transport error or 502/503/504.
        Any HTTP or transport failure left over is an OrthancError saying which."""

        def warn(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            log.warning(
                "orthanc %s failed (%s, attempt %d), retrying",
                what,
                _failure(exc),
                state.attempt_number,
            )

        retrying = Retrying(
            stop=stop_after_attempt(self.retries + 1 if idempotent else 1),
            wait=wait_exponential(multiplier=self.backoff_s, exp_base=2),
            retry=retry_if_exception(_retryable),
            before_sleep=warn,
            reraise=True,  # the last error itself, not tenacity's RetryError
        )
        try:
            return retrying(fn)
        except httpx.HTTPStatusError as exc:
            code = exc.response.status_code
            raise OrthancError(f"Orthanc {what}: HTTP {code} {_body(exc.response)}", code) from None
        except httpx.TransportError as exc:
            raise OrthancError(
                f"Orthanc {what}: {type(exc).__name__} talking to {self.url}"
            ) from None

    def get_json(self, path: str, params: dict[str, Any] | None = None) -> Any:
        def call() -> Any:
            r = self.api.get(f"{self.url}{path}", params=params)
            r.raise_for_status()
            return r.json()

        return self._retry(f"GET {path.split('?')[0]}", call)

    def post_json(self, path: str, body: Any) -> Any:
        """POST a JSON body and read the JSON reply (for queries such as /tools/find: retried)."""

        def call() -> Any:
            r = self.api.post(f"{self.url}{path}", json=body)
            r.raise_for_status()
            return r.json()

        return self._retry(f"POST {path}", call)

    def download_instance(self, instance_id: str, target: Path, max_bytes: int) -> None:
        """Stream one instance's file to ``target`` (written whole or not at all); an instance
        over ``max_bytes`` is an OrthancError."""

        def call() -> None:
            with (
                self.api.stream("GET", f"{self.url}/instances/{instance_id}/file") as r,
                atomic_write(target, fsync=False) as fh,
            ):
                r.raise_for_status()
                size = 0
                for chunk in r.iter_bytes(1 << 20):
                    size += len(chunk)
                    if size > max_bytes:
                        raise OrthancError(f"instance {instance_id}: over {max_bytes} bytes")
                    fh.write(chunk)

        self._retry("GET instance file", call)

    def open_stream(
        self, path: str, query: str, headers: dict[str, str], timeout: httpx.Timeout
    ) -> httpx.Response:
        """GET ``path?query`` with the body left unread: the caller streams it, then closes the
        response. Not retried (a browser retries); transport failures raise OrthancError."""
        url = f"{self.url}{path}" + (f"?{query}" if query else "")
        request = self.api.build_request("GET", url, headers=headers, timeout=timeout)
        try:
            return self.api.send(request, stream=True)
        except httpx.TransportError as exc:
            raise OrthancError(f"Orthanc GET: {type(exc).__name__} talking to {self.url}") from None

    def system(self) -> dict[str, Any]:
        return dict(self.get_json("/system"))

    # ----------------------------------------------------------------- listing

    def list_patients(self) -> list[PatientSummary]:
        out = []
        for p in self.get_json("/patients", {"expand": ""}):
            t = p.get("MainDicomTags", {})
            out.append(
                PatientSummary(
                    orthanc_id=p["ID"],
                    patient_id=t.get("PatientID", ""),
                    patient_name=t.get("PatientName", ""),
                    birth_date=t.get("PatientBirthDate", ""),
                    sex=t.get("PatientSex", ""),
                    n_studies=len(p.get("Studies", [])),
                )
            )
        return out

    @staticmethod
    def _study(s: dict[str, Any]) -> StudySummary:
        t, pt = s.get("MainDicomTags", {}), s.get("PatientMainDicomTags", {})
        return StudySummary(
            orthanc_id=s["ID"],
            study_uid=t.get("StudyInstanceUID", ""),
            patient_orthanc_id=s.get("ParentPatient", ""),
            patient_id=pt.get("PatientID", ""),
            patient_name=pt.get("PatientName", ""),
            study_date=t.get("StudyDate", ""),
            description=t.get("StudyDescription", ""),
            accession_number=t.get("AccessionNumber", ""),
            n_series=len(s.get("Series", [])),
            is_stable=bool(s.get("IsStable", False)),
            last_update=s.get("LastUpdate", ""),
        )

    def list_studies(self, patient_orthanc_id: str | None = None) -> list[StudySummary]:
        path = f"/patients/{patient_orthanc_id}/studies" if patient_orthanc_id else "/studies"
        return [self._study(s) for s in self.get_json(path, {"expand": ""})]

    def study(self, study_id: str) -> StudySummary:
        return self._study(self.get_json(f"/studies/{study_id}"))

    def find_study(self, study_uid: str) -> str | None:
        """Orthanc ID of a study with this StudyInstanceUID (any patient's: for tools and tests;
        what the sandbox evaluates or writes to is found by ``find_study_of``), or None."""
        return self._lookup(study_uid, "Study")

    def studies_with_uid(self, study_uid: str) -> list[str]:
        """Orthanc IDs of every study holding this StudyInstanceUID (one per patient)."""
        return self._lookup_all(study_uid, "Study")

    def find_series(self, series_uid: str) -> str | None:
        """Orthanc ID of the series with this SeriesInstanceUID, or None."""
        return self._lookup(series_uid, "Series")

    def find_instance(self, sop_uid: str) -> str | None:
        """Orthanc ID of the instance with this SOPInstanceUID, or None."""
        return self._lookup(sop_uid, "Instance")

    def _lookup(self, dicom_uid: str, level: str) -> str | None:
        return next(iter(self._lookup_all(dicom_uid, level)), None)

    def _lookup_all(self, dicom_uid: str, level: str) -> list[str]:
        """Orthanc ids of every resource of ``level`` with this UID (several patients' studies
        may hold one UID)."""
        uid = check_uid(dicom_uid)

        def call() -> Any:
            r = self.api.post(f"{self.url}/tools/lookup", content=uid)
            r.raise_for_status()
            return r.json()

        hits = self._retry("lookup", call)
        return [str(h["ID"]) for h in hits if h.get("Type") == level]

    def list_series(self, study_id: str, classify: bool = True) -> list[SeriesSummary]:
        study = self.get_json(f"/studies/{study_id}")
        study_uid = study.get("MainDicomTags", {}).get("StudyInstanceUID", "")
        out = []
        for s in self.get_json(f"/studies/{study_id}/series", {"expand": ""}):
            t = s.get("MainDicomTags", {})
            summary = SeriesSummary(
                orthanc_id=s["ID"],
                series_uid=t.get("SeriesInstanceUID", ""),
                series_number=_int(t.get("SeriesNumber")),
                modality=t.get("Modality", ""),
                description=t.get("SeriesDescription", ""),
                n_instances=len(s.get("Instances", [])),
            )
            if classify and study_uid and summary.series_uid:
                key = (s["ID"], s.get("LastUpdate", ""))
                if key not in self._class_cache:
                    self._class_cache[key] = self.classify_series(
                        s["ID"], study_uid, summary.series_uid, s.get("Instances", [])
                    )
                summary.stacks = self._class_cache[key]
                if summary.stacks:
                    summary.series_class = max(summary.stacks, key=lambda c: c.n_files).series_class
            out.append(summary)
        out.sort(key=lambda s: (s.series_number is None, s.series_number or 0, s.series_uid))
        return out

    def series_metadata(self, study_uid: str, series_uid: str) -> list[Dataset]:
        """Header of every instance of a series (DICOMweb, no bulk data), as pydicom datasets."""
        path = f"/dicom-web/studies/{check_uid(study_uid)}/series/{check_uid(series_uid)}/metadata"
        items = self.get_json(path)
        out = []
        for item in items:
            try:
                out.append(Dataset.from_json(item, bulk_data_uri_handler=lambda *_: b""))
            except Exception as exc:  # a hostile header: skip it, say so
                log.warning("series metadata: unreadable instance header skipped (%s)", exc)
        return out

    def classify_series(
        self, series_id: str, study_uid: str, series_uid: str, instances: list[str]
    ) -> list[StackClass]:
        """Classes of the stacks of the Orthanc series ``series_id`` (its ``instances``), from
        headers only."""
        datasets = self.series_headers(series_id, study_uid, series_uid, instances)
        return [_stack_class(s) for s in classify_headers(datasets)]

    def series_headers(
        self, series_id: str, study_uid: str, series_uid: str, instances: list[str] | None = None
    ) -> list[Dataset]:
        """The headers of the instances of the Orthanc series ``series_id``. DICOMweb finds a
        series by its UIDs alone: when the PACS holds another series under the same
        SeriesInstanceUID (another patient's study, or a copy), DICOMweb may answer with that
        one or with nothing, so the instances are then read by their Orthanc ids (which hash
        the patient with the UIDs), each file's header only."""
        if self._lookup_all(series_uid, "Series") == [series_id]:
            return self.series_metadata(study_uid, series_uid)
        log.info("series %s is in the PACS more than once: headers read by instance", series_id)
        if instances is None:
            instances = list(self.get_json(f"/series/{series_id}").get("Instances", []))
        out = []
        for iid in instances[:MAX_SERIES_HEADERS]:
            ds = self._instance_header(str(iid))
            if ds is not None:
                out.append(ds)
        return out

    def _instance_header(self, instance_id: str) -> Dataset | None:
        """One stored instance's header (its file read up to HEADER_BYTES; no pixels), or None
        with a warning when it cannot be read from that much."""
        url = f"{self.url}/instances/{instance_id}/file"

        def call() -> bytes:
            buf = bytearray()
            with self.api.stream("GET", url) as r:
                r.raise_for_status()
                for chunk in r.iter_bytes():
                    buf += chunk
                    if len(buf) >= HEADER_BYTES:
                        break
            return bytes(buf[:HEADER_BYTES])

        data = self._retry("GET /instances/{id}/file", call)
        try:
            return pydicom.dcmread(io.BytesIO(data), stop_before_pixels=True)
        except Exception as exc:  # a hostile or truncated header: skipped, said
            log.warning("instance header unreadable, skipped (%s)", type(exc).__name__)
            return None

    # ----------------------------------------------------------------- fetch / store

    def series_instances(self, series_id: str) -> list[CacheKey]:
        """Every instance of a series, as the cache finds it: Orthanc's instance id (patient,
        study, series and SOP UIDs), its stored file's UUID (a re-stored instance has
        another) and its SOPInstanceUID. Raises ``OrthancError`` for an entry that is not."""
        out = []
        for i in self.get_json(f"/series/{series_id}/instances"):
            try:
                out.append(
                    CacheKey(
                        instance_id=str(i["ID"]),
                        content_id=str(i.get("FileUuid") or ""),
                        sop_uid=str(i.get("MainDicomTags", {}).get("SOPInstanceUID", "")),
                    )
                )
            except (KeyError, ValueError) as exc:
                raise OrthancError(
                    f"series {series_id}: an instance Orthanc lists is unusable ({exc})"
                ) from None
        return out

    def fetch_instance(self, key: CacheKey, cache: InstanceCache) -> Path:
        """Stream one instance into the cache (no-op when this content is cached)."""
        if cache.has(key):
            return cache.path(key)

        def call() -> Path:
            with self.api.stream("GET", f"{self.url}/instances/{key.instance_id}/file") as r:
                r.raise_for_status()
                return cache.put_stream(key, r.iter_bytes(1 << 20))

        return self._retry("GET instance file", call)

    def studies_by_uid(self, study_uid: str) -> list[StudySummary]:
        """Every study Orthanc holds under this StudyInstanceUID: one per patient (Orthanc
        keys a study by PatientID and UID), so more than one is a shared UID."""
        uid = check_uid(study_uid)

        def call() -> Any:
            r = self.api.post(
                f"{self.url}/tools/find",
                json={"Level": "Study", "Query": {"StudyInstanceUID": uid}, "Expand": True},
            )
            r.raise_for_status()
            return r.json()

        return [self._study(s) for s in self._retry("find", call)[:100]]

    def find_study_of(self, study_uid: str, patient_id: str) -> str | None:
        """Orthanc ID of this patient's study with this StudyInstanceUID, or None."""
        sid = orthanc_id(patient_id, check_uid(study_uid))
        try:
            self.get_json(f"/studies/{sid}")
        except OrthancError as exc:
            if exc.status == 404:
                return None
            raise
        return sid

    def fetch_series(
        self, series_id: str, cache: InstanceCache, folder: Path | None = None
    ) -> list[Path]:
        """Fetch a series into the cache; optionally hard-link it into ``folder``."""
        keys = self.series_instances(series_id)
        for key in keys:
            self.fetch_instance(key, cache)
        return (
            cache.link_into(keys, folder) if folder is not None else [cache.path(k) for k in keys]
        )

    def fetch_study(
        self,
        study_id: str,
        cache: InstanceCache,
        folder: Path,
        series_filter: Callable[[SeriesSummary], bool] | None = None,
    ) -> list[Path]:
        """Fetch the series of a study a task needs (all by default) into ``folder``."""
        paths: list[Path] = []
        for s in self.list_series(study_id, classify=series_filter is not None):
            if series_filter is None or series_filter(s):
                paths += self.fetch_series(s.orthanc_id, cache, folder / s.orthanc_id)
        return paths

    def upload(self, data: bytes | Path) -> str:
        """Store one instance (POST /instances); returns its Orthanc ID. Idempotent in Orthanc."""
        return self.store_instance(data)[0]

    def store_instance(self, data: bytes | Path) -> tuple[str, bool]:
        """Store one instance; its Orthanc ID, and whether it is new (not AlreadyStored)."""

        def call() -> Any:
            if isinstance(data, Path):
                with open(data, "rb") as fh:
                    size = str(data.stat().st_size)
                    r = self.api.post(
                        f"{self.url}/instances",
                        content=fh,
                        headers={"Content-Type": "application/dicom", "Content-Length": size},
                    )
            else:
                r = self.api.post(
                    f"{self.url}/instances",
                    content=data,
                    headers={"Content-Type": "application/dicom"},
                )
            r.raise_for_status()
            return r.json()

        res = self._retry("POST /instances", call)
        if isinstance(res, list):  # a zip upload answers a list; we send single instances
            res = res[0]
        return str(res["ID"]), res.get("Status") != "AlreadyStored"

    def upload_many(self, paths: Iterable[Path]) -> list[str]:
        return [self.upload(p) for p in paths]

    def delete_instance(self, instance_id: str) -> None:
        def call() -> None:
            self.api.delete(f"{self.url}/instances/{instance_id}").raise_for_status()

        self._retry("DELETE instance", call)

    def changes(self, since: int, limit: int = 100) -> tuple[list[dict[str, Any]], int, bool]:
        """A page of Orthanc's /changes feed: (changes, last sequence number, done)."""
        res = self.get_json("/changes", {"since": since, "limit": limit})
        return list(res.get("Changes", [])), int(res.get("Last", since)), bool(res.get("Done"))

    def instance_metadata(self, instance_id: str) -> dict[str, str]:
        return dict(self.get_json(f"/instances/{instance_id}/metadata", {"expand": ""}))

    def study_instances(self, study_id: str) -> list[dict[str, Any]]:
        """Every instance of a study (ID, SOPInstanceUID, series ID)."""
        return list(self.get_json(f"/studies/{study_id}/instances"))


def classify_headers(datasets: list[Dataset]) -> list[SeriesInfo]:
    """Run the imaging core's index on header-only copies of ``datasets``."""
    with tempfile.TemporaryDirectory(prefix="nsbx-headers-") as tmp:
        for n, ds in enumerate(datasets):
            ds = _header_only(ds)
            path = Path(tmp) / f"{n:06d}.dcm"
            ds.save_as(path, enforce_file_format=True)
            _hole_for_pixels(path, ds)
        return index_path(tmp, workers=1).series


def _hole_for_pixels(path: Path, ds: Dataset) -> None:
    """Give the empty Pixel Data element (the file's last) the length its header describes,
    as a hole in the file: the index checks the length, never reads the zeros, and no disk
    block is written."""
    if "PixelData" not in ds:
        return
    try:
        frames = int(ds.get("NumberOfFrames", 1) or 1)
        n = int(ds.Rows) * int(ds.Columns) * frames * int(ds.get("SamplesPerPixel", 1) or 1)
        bits = int(ds.get("BitsAllocated", 16) or 16)
    except (TypeError, ValueError):
        return  # the index reports the header itself
    needed = -(-n // 8) if bits == 1 else n * max(bits // 8, 1)
    needed += needed % 2
    if not 0 < needed < 1 << 32:
        return
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        fh.seek(size - 4)
        fh.write(needed.to_bytes(4, "little"))
    os.truncate(path, size + needed)


def _header_only(ds: Dataset) -> Dataset:
    """A dataset the index can read: file meta, and an empty Pixel Data element for images."""
    ds = ds.copy()
    for tag in [e.tag for e in ds if e.tag.group >= 0x7FE0 or e.tag.element == 0x0000]:
        del ds[tag]
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = ds.get("SOPClassUID", "1.2.840.10008.5.1.4.1.1.7")
    meta.MediaStorageSOPInstanceUID = ds.get("SOPInstanceUID", "1.2.3")
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta = meta
    if "Rows" in ds and "Columns" in ds:
        ds.add_new(0x7FE00010, "OW", b"")
    return ds


def _stack_class(s: SeriesInfo) -> StackClass:
    return StackClass(
        series_class=s.series_class.value,
        detail=s.detail,
        reason=s.reason,
        confidence=s.confidence,
        plane=s.plane.value if s.plane else None,
        n_files=s.n_files,
    )
