"""What the viewer reads from the PACS: the DICOMweb paths a reviewer may read through the
gateway, Orthanc's URLs in DICOMweb JSON moved behind the gateway, and the instance of a series
at a position a montage tile names."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np
from pydicom.dataset import Dataset

from dicom import slice_centre, valid_uid
from gateway.orthanc import SeriesSummary
from gateway.viewer import DICOMWEB_ROOT, PLANES

_UID = r"[0-9]+(?:\.[0-9]+)*"
_LEVELS = rf"studies/{_UID}(?:/series/{_UID}(?:/instances/{_UID})?)?"
_LEVEL_UIDS = re.compile(r"(?:studies|series|instances)/([^/]+)")  # each one valid_uid
_FRAMES = r"frames/[0-9]{1,6}(?:,[0-9]{1,6}){0,63}"
# Reads only (QIDO searches, metadata, frames, rendered images, thumbnails, bulk data, one
# instance): no STOW, no deletion, no whole-study or whole-series archive.
_READ = re.compile(
    "^(?:"
    + "|".join(
        [
            "studies",  # QIDO: studies
            rf"studies/{_UID}/series",  # QIDO: series of a study
            rf"studies/{_UID}/series/{_UID}/instances",  # QIDO: instances of a series
            rf"{_LEVELS}/metadata",
            rf"studies/{_UID}/series/{_UID}/instances/{_UID}",  # one instance (SR, PDF, SEG)
            rf"studies/{_UID}/series/{_UID}/instances/{_UID}/{_FRAMES}",
            rf"{_LEVELS}(?:/{_FRAMES})?/(?:rendered|thumbnail)",
            rf"studies/{_UID}/series/{_UID}/instances/{_UID}/bulk/[0-9a-fA-F]{{8}}(?:/[0-9]{{1,6}}/[0-9a-fA-F]{{8}}){{0,8}}",
        ]
    )
    + ")$"
)
_STUDY_OF_PATH = re.compile(rf"^studies/({_UID})(?:/|$)")
# OHIF (and DICOMweb) find a study by its StudyInstanceUID alone: one the PACS holds under more
# than one patient is not shown (a UID is not an identity).
SHARED_STUDY_UID = (
    "the PACS holds this StudyInstanceUID under more than one patient: the viewer finds a study "
    "by its UID alone and would show their images together, so it shows neither; open each "
    "patient's study in the PACS's own viewer, by patient"
)
VIEWER_UID_TTL_S = 2.0  # how long the proxy remembers how many patients hold a study UID
# Orthanc writes absolute URLs of itself into DICOMweb JSON (RetrieveURL, BulkDataURI) and
# into the part headers of multipart answers (Content-Location); matches are at most _SPAN long.
_ORTHANC_URL = re.compile(
    rb'(?P<lead>"|(?i:content-location): ?)https?://[^"\s/]{1,255}(?:/[^"\s]{0,500}?)?/dicom-web/'
)
_SPAN = 800
# The series a study opens on, by class: the anatomy a reader looks at first, then the rest of
# what a model is shown (dicom's CLINICAL_CLASSES); localisers, maps, masks, fMRI, documents
# and SRs never, unless nothing else has pixels.
OPENING_ORDER = ("FLAIR", "T2", "T1C", "T1", "CT", "DWI", "TRACE", "SWI", "T2STAR", "PD", "ADC")
_NEVER_FIRST = frozenset({"LOCALIZER", "NON_IMAGE", "MASK"})
MIN_OPENING_SLICES = 3  # fewer: a localiser or a single image, not a stack to scroll


def dicomweb_read_path(path: str) -> bool:
    """True when ``path`` (after the DICOMweb root) is a read the viewer may make."""
    return (
        len(path) <= 1000
        and _READ.match(path) is not None
        and all(valid_uid(u) for u in _LEVEL_UIDS.findall(path))
    )


def behind_gateway(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """A DICOMweb answer (JSON or multipart) with Orthanc's URLs of itself replaced by the
    gateway's proxy, streamed: only the last _SPAN bytes are held back between chunks."""
    root = DICOMWEB_ROOT.encode() + b"/"
    carry = b""
    for chunk in chunks:
        buf = carry + chunk
        cut = len(buf) - _SPAN
        if cut <= 0:
            carry = buf
            continue
        out, pos = [], 0
        for m in _ORTHANC_URL.finditer(buf):
            if m.start() >= cut:
                break  # may be incomplete: decided with the next chunk
            out += [buf[pos : m.start()], m.group("lead"), root]
            pos = m.end()
        keep = max(pos, cut)
        out.append(buf[pos:keep])
        carry = buf[keep:]
        yield b"".join(out)
    if carry:
        yield _ORTHANC_URL.sub(lambda m: m.group("lead") + root, carry)


def plane_axis(plane: str | None) -> int | None:
    """The RAS axis (0 R, 1 A, 2 S) along the normal of slices in ``plane``."""
    return PLANES.index(plane) if plane in PLANES else None


def _floats(ds: Dataset, keyword: str, n: int) -> np.ndarray | None:
    try:
        value = [float(v) for v in ds.get(keyword) or ()]
    except (TypeError, ValueError):
        return None
    return np.array(value) if len(value) == n else None


def _centre_ras(ds: Dataset) -> tuple[np.ndarray, np.ndarray] | None:
    """(slice centre in RAS mm, unit slice normal in RAS) of a single-frame image."""
    ipp = _floats(ds, "ImagePositionPatient", 3)
    iop = _floats(ds, "ImageOrientationPatient", 6)
    spacing = _floats(ds, "PixelSpacing", 2)
    rows, cols = ds.get("Rows"), ds.get("Columns")
    if ipp is None or iop is None or spacing is None or not rows or not cols:
        return None
    return slice_centre(iop, ipp, spacing, int(rows), int(cols))


def _number(ds: Dataset) -> int:
    try:
        return int(ds.get("InstanceNumber") or 0)
    except (TypeError, ValueError):
        return 0


def instance_at(
    datasets: Sequence[Dataset], z_mm: float | None = None, plane: str | None = None
) -> str:
    """SOPInstanceUID of the image of a series nearest ``z_mm`` (see ``viewer_open_url``).

    ``z_mm`` is compared with the RAS coordinate of each slice's centre along the axis of
    ``plane`` (the series' own slice axis when None), as dicom's renderer labels montage tiles.
    The middle slice when ``z_mm`` is None, when the images have no patient geometry, or when
    the tile was resliced into a plane the series was not acquired in (no slice of the series
    lies at a position along that axis).
    """
    images = [ds for ds in datasets if ds.get("SOPInstanceUID") and ds.get("Rows")]
    if not images:
        images = [ds for ds in datasets if ds.get("SOPInstanceUID")]
    if not images:
        raise LookupError("the series has no instances")
    geometry = [_centre_ras(ds) for ds in images]
    located = [(ds, g) for ds, g in zip(images, geometry, strict=True) if g is not None]
    if len(located) < len(images):  # no geometry for some: InstanceNumber order, middle one
        by_number = sorted(images, key=_number)
        return str(by_number[(len(by_number) - 1) // 2].SOPInstanceUID)
    normal = located[0][1][1]
    native = int(np.argmax(np.abs(normal)))
    axis = plane_axis(plane)
    axis = native if axis is None else axis
    if z_mm is None or axis != native:
        along = sorted(located, key=lambda dg: (float(dg[1][0] @ normal), _number(dg[0])))
        return str(along[(len(along) - 1) // 2][0].SOPInstanceUID)
    best = min(located, key=lambda dg: (abs(float(dg[1][0][axis]) - z_mm), _number(dg[0])))
    return str(best[0].SOPInstanceUID)


def opening_series(series: Sequence[SeriesSummary]) -> SeriesSummary | None:
    """The series a study opens on in the viewer: the first class of OPENING_ORDER the study
    has as a stack (at least MIN_OPENING_SLICES images; the lowest series number), else its
    largest series with pixels; None when it has none (only SRs and documents)."""

    def rank(s: SeriesSummary) -> tuple[int, int, int]:
        order = OPENING_ORDER.index(s.series_class) if s.series_class in OPENING_ORDER else len(OPENING_ORDER)  # fmt: skip
        return (order, s.series_number if s.series_number is not None else 1 << 30, -s.n_instances)

    stacks = [s for s in series if s.n_instances >= MIN_OPENING_SLICES and s.series_class in OPENING_ORDER]  # fmt: skip
    if stacks:
        return min(stacks, key=rank)
    images = [s for s in series if s.series_class not in _NEVER_FIRST and s.series_uid]
    return max(images, key=lambda s: s.n_instances) if images else None


def study_of_path(path: str) -> str | None:
    """The StudyInstanceUID a DICOMweb read names (``studies/{uid}/...``), None for a search."""
    m = _STUDY_OF_PATH.match(path)
    return m.group(1) if m else None


class StudyOwners:
    """The PACS's studies holding a StudyInstanceUID (one per patient), remembered for
    VIEWER_UID_TTL_S (a viewer makes dozens of reads of one study a second) and for at most
    ``most`` UIDs."""

    def __init__(self, ttl_s: float = VIEWER_UID_TTL_S, most: int = 1024) -> None:
        self.ttl_s, self.most = ttl_s, most
        self._seen: dict[str, tuple[float, list[str]]] = {}
        self._lock = threading.Lock()

    def studies(self, study_uid: str, studies_with_uid: Callable[[str], list[str]]) -> list[str]:
        """The PACS's ids of the studies holding the UID (``studies_with_uid`` asks it)."""
        now = time.monotonic()
        with self._lock:
            hit = self._seen.get(study_uid)
        if hit is not None and now - hit[0] < self.ttl_s:
            return hit[1]
        ids = studies_with_uid(study_uid)
        with self._lock:
            if len(self._seen) >= self.most:
                self._seen.clear()
            self._seen[study_uid] = (now, ids)
        return ids

    def shared(self, study_uid: str, studies_with_uid: Callable[[str], list[str]]) -> bool:
        """True when more than one of the PACS's studies (patients) holds the UID."""
        return len(self.studies(study_uid, studies_with_uid)) > 1
