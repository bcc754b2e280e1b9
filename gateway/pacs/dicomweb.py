"""A DICOMweb server as a ``PacsClient``: QIDO-RS to find, WADO-RS to pull, STOW-RS to store.

- QIDO-RS ``GET {qido}/studies``: one request per listed accession number or patient ID, study
  UIDs as short comma lists, the counts asked by ``includefield``; paged from where the server
  stopped (PS3.18 8.3.4.4), bounded; the DICOM JSON answer is read by ``dicom_json`` (every
  value checked) and filtered again by the query (the description is matched here).
- WADO-RS ``GET {wado}/studies/{uid}/series/{uid}``, series by series (an archive may hold one
  study UID under two patients: only the match's patient's series are asked for), instances as
  stored (``transfer-syntax=*``), streamed part by part (``multipart``) into files named by the
  hash of their bytes; ``keep_the_study`` then keeps the study's and patient's files.
- STOW-RS ``POST {stow}/studies``: the objects as one multipart/related body; the answer's
  ReferencedSOPSequence and FailedSOPSequence become one ``StoreResult`` per object.
- Authentication from the variables the configuration names (basic, or a bearer token); HTTPS
  always verified (``tls``: the hospital's CA, a client certificate, the server name); GETs
  tried again on a connection error and on 502/503/504, never a POST nor a TLS refusal.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, cast

import httpx
import pydicom
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from dicom import pacs_credential
from gateway.pacs import dicom_json as dj
from gateway.pacs.client import (
    MAX_MATCHES,
    PacsRequestError,
    Progress,
    RetrievedStudy,
    StoreResult,
    StudyMatch,
    StudyQuery,
    keep_the_study,
    pacs_text,
)
from gateway.pacs.config import DicomwebPacs, PacsConfigError
from gateway.pacs.multipart import (
    MultipartError,
    MultipartReader,
    encode_related,
    related_boundary,
)
from gateway.pacs.tls import client_context, describe_tls_error

DICOM_JSON = "application/dicom+json"
MULTIPART_DICOM = 'multipart/related; type="application/dicom"'
# the instances as the archive stores them (PS3.18 8.7.3.5.2); without it a server must
# transcode every compressed image to Explicit VR Little Endian (and may fail or refuse)
MULTIPART_AS_STORED = MULTIPART_DICOM + "; transfer-syntax=*"
MAX_JSON_BYTES = 64 * 1024 * 1024  # one QIDO page or STOW answer
MAX_INSTANCE_BYTES = 2 * 1024**3
MAX_INSTANCES = 200_000  # parts of one WADO-RS answer
MAX_STUDY_BYTES = 64 * 1024**3  # received for one study (a neuro study is rarely over a few GB)
PAGE = 200
MAX_SCANNED = 20_000  # studies one find may page through
MAX_SERIES = 10_000  # series of one study
_BEARER = re.compile(r"[A-Za-z0-9\-._~+/]+=*")  # RFC 6750 b64token
UID_LIST_CHARS = 1800  # characters of a StudyInstanceUID list in one QIDO-RS URL
RETRY_WAIT_S = 0.5  # the first wait before a GET is tried again (then doubled, 3 tries)
# PS3.18 8.3.4.4: a server that caps its answers says more can be asked in a Warning
_MORE = re.compile(r"\b299\b.*additional results", re.IGNORECASE)
_UID = re.compile(r"[0-9.]{1,64}")


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, httpx.TransportError):  # a TLS refusal stays one: never tried again
        return describe_tls_error_of(exc) is None
    return isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code in (502, 503, 504)


def describe_tls_error_of(exc: BaseException) -> str | None:
    """The TLS sentence for an httpx error caused by a TLS failure, None otherwise."""
    seen: BaseException | None = exc
    while seen is not None:
        why = describe_tls_error(seen)
        if why:
            return why
        seen = seen.__cause__ or seen.__context__
    text = str(exc)
    if "CERTIFICATE_VERIFY_FAILED" in text:
        return f"TLS: the PACS's certificate is not trusted ({text[:160]}); check tls.ca_file"
    return None


def _named(env_name: str | None) -> str:
    """The credential a configured variable holds; PacsConfigError when it is not set (an
    unset secret would send the requests without it and fail as a puzzling 401)."""
    value = pacs_credential(env_name)
    if env_name and value is None:
        raise PacsConfigError(
            f"{env_name} is not set: the PACS file names it for this PACS's credentials"
        )
    return value or ""


def _batches(uids: list[str], max_chars: int = UID_LIST_CHARS) -> list[list[str]]:
    """UIDs in lists whose comma-joined length stays within ``max_chars``."""
    out: list[list[str]] = [[]]
    size = 0
    for uid in uids:
        if out[-1] and size + 1 + len(uid) > max_chars:
            out.append([])
            size = 0
        size += len(uid) + (1 if out[-1] else 0)
        out[-1].append(uid)
    return out


def _part10(ds: Dataset) -> bytes:
    """The object as a DICOM file: with its own file meta, or, when it has none (a dataset
    built in memory), Explicit VR Little Endian (STOW-RS's default). The caller's dataset is
    not changed."""
    buf = io.BytesIO()
    meta = getattr(ds, "file_meta", None)
    if meta is not None and meta.get("TransferSyntaxUID"):
        pydicom.dcmwrite(buf, ds, enforce_file_format=True)
        return buf.getvalue()
    mine = copy.copy(ds)
    mine.file_meta = FileMetaDataset(meta) if meta is not None else FileMetaDataset()
    mine.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    mine.file_meta.MediaStorageSOPClassUID = ds.SOPClassUID
    mine.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    pydicom.dcmwrite(buf, mine, enforce_file_format=True)
    return buf.getvalue()


class _StudyTooLarge(Exception):
    """A WADO-RS answer brought more than one study may take."""


class _Part:
    """One instance as it streams in: written to a hidden temporary file and hashed on the
    way, then named by the hash of its bytes (``keep``) or removed (``drop``)."""

    def __init__(self, folder: Path, budget: list[int]) -> None:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".part-")
        self.fh = os.fdopen(fd, "wb")
        self.tmp = Path(tmp)
        self.folder = folder
        self.sha = hashlib.sha256()
        self.budget = budget  # [bytes the study may still take]

    def write(self, data: bytes) -> int:
        self.budget[0] -= len(data)
        if self.budget[0] < 0:
            raise _StudyTooLarge(f"over {MAX_STUDY_BYTES} bytes")
        self.sha.update(data)
        return self.fh.write(data)

    def keep(self) -> Path:
        self.fh.close()
        final = self.folder / f"{self.sha.hexdigest()[:32]}.dcm"
        os.replace(self.tmp, final)
        return final

    def drop(self) -> None:
        self.fh.close()
        self.tmp.unlink(missing_ok=True)


class DicomwebClient:
    """Find, pull and store on a DICOMweb server."""

    def __init__(self, name: str, cfg: DicomwebPacs) -> None:
        self.name = name
        self.cfg = cfg
        headers = {}
        auth: httpx.BasicAuth | None = None
        if cfg.token_env:
            token = _named(cfg.token_env)
            if not _BEARER.fullmatch(token):  # never quote it: it is a secret
                raise PacsConfigError(
                    f"{cfg.token_env} does not hold a bearer token (RFC 6750: letters, digits "
                    "and -._~+/ then = padding; no spaces or line breaks)"
                )
            headers["Authorization"] = f"Bearer {token}"
        elif cfg.username_env or cfg.password_env:
            user, password = _named(cfg.username_env), _named(cfg.password_env)
            if ":" in user or any(not c.isprintable() for c in user + password):
                raise PacsConfigError(
                    f"{cfg.username_env or cfg.password_env}: a user name with ':' or a "
                    "credential with control characters cannot be sent by HTTP basic auth"
                )
            auth = httpx.BasicAuth(user, password)
        self.http = httpx.Client(
            auth=auth,
            headers=headers,
            verify=client_context(cfg.tls) or True,
            timeout=httpx.Timeout(cfg.timeout_s, connect=min(cfg.timeout_s, 30.0)),
            follow_redirects=False,
        )
        # TLS: the name the certificate must carry, when it is not the URL's host
        server_name = cfg.tls.server_name if cfg.tls else None
        self._ext = {"sni_hostname": server_name} if server_name else {}
        self._wado_accept = MULTIPART_AS_STORED

    def close(self) -> None:
        self.http.close()

    def _where(self) -> str:
        return f"PACS {self.name!r} (DICOMweb {self.cfg.url or self.cfg.qido_url})"

    def _fail(self, what: str, exc: BaseException) -> PacsRequestError:
        why = describe_tls_error_of(exc)
        if why is None and isinstance(exc, httpx.HTTPStatusError):
            r = exc.response
            why = f"HTTP {r.status_code}"
            if r.status_code in (401, 403):
                why += " (check the PACS's username_env/password_env or token_env)"
            elif r.is_redirect:
                where = pacs_text(r.headers.get("location", ""))[:200]
                why += (
                    f" redirected to {where!r}: put that URL in the PACS file (redirects are "
                    "not followed, so credentials go only where the file says)"
                )
        if why is None:
            why = f"{type(exc).__name__}: {str(exc)[:200]}"
        return PacsRequestError(f"{self._where()}: {what}: {why}")

    def _retrying(self) -> Retrying:
        return Retrying(
            stop=stop_after_attempt(3),
            wait=wait_exponential(multiplier=RETRY_WAIT_S, max=5),
            retry=retry_if_exception(_retryable),
            reraise=True,
        )

    def _get_json(self, url: str, params: list[tuple[str, str]]) -> list[Any]:
        return self._get_page(url, params)[0]

    def _get_page(self, url: str, params: list[tuple[str, str]]) -> tuple[list[Any], bool]:
        """One QIDO-RS answer (a JSON array, bounded) and whether the server says, by a
        Warning header, that it holds more than it answered."""

        def call() -> tuple[list[Any], bool]:
            with self.http.stream("GET", url, params=tuple(params),
                                  headers={"Accept": DICOM_JSON}, extensions=self._ext) as r:  # fmt: skip
                r.raise_for_status()
                more = any(_MORE.search(w) for w in r.headers.get_list("warning"))
                if r.status_code == 204:
                    return [], False
                body = bytearray()
                for chunk in r.iter_bytes():
                    body += chunk
                    if len(body) > MAX_JSON_BYTES:
                        raise PacsRequestError(
                            f"{self._where()}: an answer over {MAX_JSON_BYTES} bytes"
                        )
            try:
                data = json.loads(bytes(body)) if body.strip() else []
            except ValueError:
                raise PacsRequestError(f"{self._where()}: QIDO-RS answered no JSON") from None
            if not isinstance(data, list):
                raise PacsRequestError(
                    f"{self._where()}: QIDO-RS answered {type(data).__name__}, not a JSON array "
                    f"of results ({pacs_text(json.dumps(data))[:160]})"
                )
            return data, more

        try:
            return self._retrying()(call)
        except httpx.HTTPError as exc:
            raise self._fail("QIDO-RS", exc) from None

    def _pages(
        self, url: str, params: list[tuple[str, str]], budget: list[int], what: str = "studies"
    ) -> Iterator[Any]:
        """Every item of a paged QIDO-RS query. The next page starts after what the server
        answered (it may cap a page below our limit, PS3.18 8.3.4.4); paging ends on a short
        page without a more-results warning, or on a page with nothing new (a server that
        ignores offset answers the same page again). ``budget``: [items left to scan, bound]."""
        offset = 0
        seen: set[bytes] = set()
        while True:
            page, more = self._get_page(url, [*params, ("limit", str(PAGE)),
                                                  ("offset", str(offset))])  # fmt: skip
            keys = {
                hashlib.sha256(json.dumps(item, sort_keys=True).encode()).digest() for item in page
            }
            if not page or keys <= seen:
                return
            seen |= keys
            budget[0] -= len(page)
            if budget[0] < 0:
                raise PacsRequestError(
                    f"{self._where()}: over {budget[1]} {what} match the keys the server "
                    "can filter on; narrow the query (a date range, a modality, IDs)"
                )
            yield from page
            if len(page) < PAGE and not more:
                return
            offset += len(page)

    # ----------------------------------------------------------------- finding

    def _param_sets(self, query: StudyQuery) -> list[list[tuple[str, str]]]:
        base: list[tuple[str, str]] = [("includefield", f) for f in dj.INCLUDE]
        if query.dicom_date_range():
            base.append(("StudyDate", query.dicom_date_range()))
        if len(query.modalities) == 1:
            base.append(("ModalitiesInStudy", query.modalities[0]))
        # the description is matched here, not by the server: servers differ (Orthanc 1.10's
        # plugin neither filters on StudyDescription nor returns it)
        out = [base]
        if query.study_uids:  # a UID list, in batches that keep the URL short (414 past ~8 KB)
            out = [[*base, ("StudyInstanceUID", ",".join(b))] for b in _batches(query.study_uids)]
        for key, values in (("AccessionNumber", query.accession_numbers),
                            ("PatientID", query.patient_ids)):  # fmt: skip
            if values:
                out = [[*ps, (key, v)] for ps in out for v in values]
        return out

    def find_studies(self, query: StudyQuery) -> list[StudyMatch]:
        url = self.cfg.service("qido") + "/studies"
        found: dict[tuple[str, str, str], StudyMatch] = {}
        budget = [MAX_SCANNED, MAX_SCANNED]
        for params in self._param_sets(query):
            for item in self._pages(url, params, budget):
                m = dj.study_match(item, self.name)
                if m is not None and query.description and not dj.has(item, dj.DESCRIPTION):
                    m = m.model_copy(update={"description": self._description_of(m)})
                if m is not None and query.matches(m):
                    found.setdefault((m.study_uid, m.patient_id, m.issuer), m)
                if len(found) >= MAX_MATCHES:
                    break
        done = sorted(found.values(), key=lambda m: (str(m.study_date or ""), m.study_uid))
        return done[: query.limit]

    def _description_of(self, m: StudyMatch) -> str:
        """StudyDescription from one instance's metadata, for a server whose study answers
        leave it out."""
        qido, wado = self.cfg.service("qido"), self.cfg.service("wado")
        one = self._get_json(f"{qido}/studies/{m.study_uid}/instances",
                             [("PatientID", m.patient_id), ("limit", "1")])  # fmt: skip
        if not one:
            return ""
        series, sop = dj.text(one[0], dj.SERIES_UID), dj.text(one[0], dj.SOP_UID)
        if not (_UID.fullmatch(series) and _UID.fullmatch(sop)):
            return ""
        meta = self._get_json(
            f"{wado}/studies/{m.study_uid}/series/{series}/instances/{sop}/metadata", []
        )
        return dj.text(meta[0], dj.DESCRIPTION) if meta else ""

    # ----------------------------------------------------------------- pulling

    def _series_of(self, match: StudyMatch) -> list[str]:
        """The series of the match's study, less those QIDO-RS lists under another patient (an
        archive may hold one study UID under two patients). PS3.18 does not ask a study's
        series answer to carry PatientID: a series listed without it is pulled, and
        ``keep_the_study`` judges its files."""
        url = f"{self.cfg.service('qido')}/studies/{match.study_uid}/series"
        params = [("includefield", "00100020"), ("includefield", "00100021")]
        want_pid, want_issuer = match.patient_id.strip(), match.issuer.strip()
        out: list[str] = []
        for item in self._pages(url, params, [MAX_SERIES, MAX_SERIES], "series"):
            uid = dj.text(item, dj.SERIES_UID)
            pid = dj.text(item, dj.PATIENT_ID).strip() if dj.has(item, dj.PATIENT_ID) else None
            issuer = dj.text(item, dj.ISSUER).strip()
            other_patient = pid is not None and pid != want_pid
            other_issuer = bool(issuer and want_issuer and issuer != want_issuer)
            if _UID.fullmatch(uid) and not other_patient and not other_issuer and uid not in out:
                out.append(uid)
        return out

    def retrieve(
        self, match: StudyMatch, dest: Path, progress: Progress | None = None
    ) -> RetrievedStudy:
        """Series by series (WADO-RS of a whole study fails or mixes patients on an archive
        that holds its UID twice), each streamed part by part into files named by the hash
        of their bytes; a series is tried again on a connection error or 502/503/504 (the
        names make a second pull of the same instance the same file)."""
        started = time.monotonic()
        dest.mkdir(parents=True, exist_ok=True)
        failed: list[str] = []
        done: set[str] = set()
        budget = [MAX_STUDY_BYTES]

        def kept(path: Path) -> None:
            done.add(path.name)  # a series tried again counts its instances once
            if progress:
                progress(len(done), match.n_instances)

        series = self._series_of(match)
        if not series:
            raise PacsRequestError(
                f"{self._where()}: no series of study {match.study_uid} for this patient"
            )
        base = f"{self.cfg.service('wado')}/studies/{match.study_uid}/series"
        try:
            for uid in series:
                try:
                    self._retrying()(self._pull_series, f"{base}/{uid}", dest, kept, budget)
                except httpx.HTTPStatusError as exc:
                    failed.append(f"series {uid}: HTTP {exc.response.status_code}")
                except MultipartError as exc:
                    failed.append(f"series {uid}: the WADO-RS answer is cut or malformed: {exc}")
        except httpx.HTTPError as exc:
            raise self._fail(f"WADO-RS of study {match.study_uid}", exc) from None
        except _StudyTooLarge as exc:  # an endless answer: nothing of it is kept
            for name in done:
                (dest / name).unlink(missing_ok=True)
            raise PacsRequestError(
                f"{self._where()}: WADO-RS of study {match.study_uid} brought {exc}; stopped"
            ) from None
        finally:
            for tmp in dest.glob(".part-*"):
                tmp.unlink(missing_ok=True)
        out = keep_the_study(match, dest, started)
        out.failed = failed[:50]
        return out

    def _pull_series(
        self, url: str, dest: Path, kept: Callable[[Path], None], budget: list[int]
    ) -> None:
        """One series by WADO-RS into ``dest``: each whole part kept as it ends, a part the
        answer cut is removed."""
        current: list[_Part] = []

        def on_part(headers: dict[str, str]) -> BinaryIO:
            finish()
            current.append(_Part(dest, budget))
            return cast(BinaryIO, current[-1])

        def finish() -> None:
            while current:
                kept(current.pop().keep())

        try:
            with self.http.stream("GET", url, headers={"Accept": self._wado_accept},
                                  extensions=self._ext) as r:  # fmt: skip
                if r.status_code in (400, 406) and self._wado_accept == MULTIPART_AS_STORED:
                    self._wado_accept = MULTIPART_DICOM  # a server without transfer-syntax=*
                    again = True
                else:
                    again = False
                    r.raise_for_status()
                    reader = MultipartReader(
                        related_boundary(r.headers.get("content-type", "")),
                        on_part,
                        max_part_bytes=MAX_INSTANCE_BYTES,
                        max_parts=MAX_INSTANCES,
                    )
                    for chunk in r.iter_bytes(1 << 20):
                        reader.feed(chunk)
                    reader.close()
                    finish()
        finally:
            for part in current:
                part.drop()
        if again:
            self._pull_series(url, dest, kept, budget)

    # ----------------------------------------------------------------- storing

    def store(self, objects: Sequence[Dataset]) -> list[StoreResult]:
        if not objects:
            return []
        uids = [pacs_text(ds.get("SOPInstanceUID", "")) for ds in objects]
        blobs: dict[int, bytes] = {}
        unusable: dict[int, StoreResult] = {}
        for i, ds in enumerate(objects):
            try:
                blobs[i] = _part10(ds)
            except (ValueError, AttributeError, TypeError, KeyError) as exc:
                unusable[i] = StoreResult(sop_instance_uid=uids[i], stored=False,
                    detail=f"not sent: not a storable DICOM object ({pacs_text(exc)[:160]})")  # fmt: skip
        if not blobs:
            return [unusable[i] for i in range(len(objects))]
        sent = [uids[i] for i in blobs]
        results = iter(self._post(list(blobs.values()), sent))
        return [unusable[i] if i in unusable else next(results) for i in range(len(objects))]

    def _post(self, blobs: list[bytes], uids: list[str]) -> list[StoreResult]:
        """One STOW-RS request of ``blobs``; one result per object."""
        content_type, body = encode_related(blobs)
        url = self.cfg.service("stow") + "/studies"
        try:
            with self.http.stream("POST", url, content=b"".join(body), extensions=self._ext,
                                  headers={"Content-Type": content_type,
                                           "Accept": DICOM_JSON}) as r:  # fmt: skip
                answer = bytearray()
                for chunk in r.iter_bytes():
                    answer += chunk
                    if len(answer) > MAX_JSON_BYTES:
                        raise PacsRequestError(
                            f"{self._where()}: a STOW-RS answer over {MAX_JSON_BYTES} bytes"
                        )
        except httpx.HTTPError as exc:
            raise self._fail("STOW-RS", exc) from None
        if r.status_code not in (200, 202, 409):
            shown = pacs_text(bytes(answer[:400]).decode("utf-8", "replace"))[:200]
            detail = f"STOW-RS: HTTP {r.status_code} {shown}".rstrip()
            if r.status_code in (401, 403):
                detail += " (check the PACS's username_env/password_env or token_env)"
            if r.status_code in (401, 403) or r.status_code >= 500:
                raise PacsRequestError(f"{self._where()}: {detail}")
            return [StoreResult(sop_instance_uid=u, stored=False, detail=detail) for u in uids]
        return dj.store_results(r.status_code, bytes(answer), uids)
