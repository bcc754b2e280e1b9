"""The one write-back: what goes back into the PACS for a run, built and stored one way.

The pipeline (every study it evaluates, the demo's included) and the re-issue of a verified
case both come here:

- ``evidence``: the SR's evidence from the study's one index (the first header of each
  evaluated series, kept by ``dicom.index_path(keep_headers=True)``, and the SOP Instance UIDs
  the spool and the PACS download name their files by): no file is read again;
- ``build_unverified``: one UNVERIFIED Comprehensive 3D SR per model that answered (its review
  block, ``evaluation.unverified_content``); ``checklist_pdf``: the checklist as Encapsulated
  PDF;
- ``store``: every object built before the first is stored; each stored in Orthanc, in order.

``gateway.reissue`` builds the VERIFIED objects of a signed-off case and stores them through
``store`` too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydicom.dataset import Dataset

from dicom import IndexResult
from evaluation import RunData, report_blocks, unverified_content
from gateway.cache import InvalidUIDError, check_uid
from gateway.orthanc import OrthancClient
from gateway.sr import build_pdf, build_sr, encode, header_warnings, model_of

PDF_TITLE = "NeuroSandbox AI checklist"


class NoEvidenceError(RuntimeError):
    """No readable source instance to attach the report to."""


def evidence(index: IndexResult, series_uids: Iterable[str]) -> list[Dataset]:
    """The SR's evidence: per evaluated series, its kept first header, then one reference per
    other instance (SOP class from that header, SOP Instance UID from the file's name)."""
    wanted = set(series_uids)
    paths: dict[str, set[str]] = {}  # series UID -> its files (a series may be several stacks)
    for s in index.series:
        if not wanted or s.series_uid in wanted:
            paths.setdefault(s.series_uid, set()).update(f.path for v in s.volumes for f in v)
    out: list[Dataset] = []
    for uid, files in paths.items():
        first = index.series_headers.get(uid)
        if first is None or str(first.get("SeriesInstanceUID", "")) != uid:
            continue
        out.append(first)
        for p in sorted(files):
            name = Path(p).name.removesuffix(".dcm")
            if name == str(first.SOPInstanceUID):
                continue
            try:
                sop = check_uid(name)
            except InvalidUIDError:
                continue
            ref = Dataset()
            ref.SOPClassUID = first.SOPClassUID
            ref.SOPInstanceUID = sop
            ref.SeriesInstanceUID = uid
            ref.StudyInstanceUID = first.StudyInstanceUID
            out.append(ref)
    if not out:
        raise NoEvidenceError("no readable source instance to attach the report to")
    return out


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
    modality: str,
    previous: Sequence[Dataset] = (),
    no_answer: Callable[[str], str] = lambda model: "no answer",
) -> Unverified:
    """The UNVERIFIED SR of every model that answered. ``previous``: earlier SRs of the study
    (each model's is named as predecessor); ``no_answer(model)`` says why a model without an
    answer has no SR."""
    out = Unverified()
    # header values outside the standard are left out of the SR and PDF, and said so
    out.left_out = [f"SR/PDF: {w}" for w in header_warnings(headers[0])]
    blocks = {b.model: b for b in report_blocks(run.samples)}
    for model in models:
        if model not in blocks:
            out.no_sr.append(f"no SR for {model}: no answer to report ({no_answer(model)})")
            continue
        prev = [d for d in previous if model_of(d) == model]
        content = unverified_content(blocks[model])
        out.srs[model] = build_sr(headers, content, model, evaluator, version, prev, modality)
    return out


def checklist_pdf(headers: list[Dataset], pdf: bytes | None, version: int) -> Dataset | None:
    """The checklist (Chromium's print of the report bundle's case page) as Encapsulated PDF;
    None when it could not be printed."""
    return build_pdf(headers[0], pdf, PDF_TITLE, version) if pdf else None


def store(
    orthanc: OrthancClient,
    objects: Iterable[Dataset],
    on_stored: Callable[[Dataset], None] = lambda ds: None,
) -> None:
    """Store each object in Orthanc, in order; ``on_stored`` hears each once stored."""
    for ds in objects:
        orthanc.upload(encode(ds))
        on_stored(ds)
