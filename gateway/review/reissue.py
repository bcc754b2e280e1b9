"""Re-issue a signed-off case to PACS: per model, a VERIFIED SR of exactly what the clinicians
verified (its review block with rejected items dropped, corrected ones carrying the correction,
their diagnoses and comments as text), and one VERIFIED checklist PDF saying by whom and when.

The SR goes into the study's "(VERIFIED)" series, names the model's UNVERIFIED SR (written back
by the gateway or the demo) and any earlier VERIFIED one as predecessors, and carries every
signing reviewer (and the adjudicating admin) as Verifying Observer. What is verified comes from
:func:`evaluation.case_verification`; nothing is issued while reviewers disagree unadjudicated.

What the SR and PDF are attached to (the source instances, the patient and study attributes):

- a gateway run (the demo's included) records it at write-back in its ``GatewayRun``
  (``evidence``, from the study's one index; ``StudyRunStore.evidence`` reads it back): the
  VERIFIED SR names exactly the instances the UNVERIFIED one did, and the PACS is asked only
  for the NeuroSandbox SRs already stored (the predecessors), never for source headers.
  Evidence that does not hold is refused, not re-read from the PACS. A report bundle handed in
  from an older gateway has it as ``evidence.json`` (read the same way);
- a run without it (``neurosandbox eval`` + ``report``) reads the headers of the case's source
  series from the PACS (``_source_headers``).
"""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from pydicom.dataset import Dataset

from dicom import display_name
from evaluation import Case
from evaluation.log import RunData, VerifiedBy, WriteBack
from evaluation.reports import PdfError, pdf_bytes, render_verified
from evaluation.review import Verification
from gateway.orthanc import OrthancClient, OrthancError, StudySummary
from gateway.pacs import LOCAL, PacsClient
from gateway.runs import StudyRunStore
from gateway.runs.reading import gateway_info
from gateway.sr import (
    ReportBuildError,
    Verifier,
    build_pdf,
    build_sr,
    model_of,
    series_uid_for,
)
from gateway.writeback import (
    EVIDENCE_FILE,
    NoEvidenceError,
    deliver,
    keep,
    load_evidence,
    store,
)
from gateway.writeback_retry import record

MAX_SOURCE_HEADERS = 500
IN_FLIGHT_S = 600.0  # a VERIFIED object being sent is not the retry loop's until then
# reads the evidence a gateway run recorded (``StudyRunStore.evidence``); None: not a gateway run
Recorded = Callable[[], list[Dataset]] | None


class ReissueError(RuntimeError):
    """The case cannot be re-issued (no source study in PACS, nothing signed off)."""


class NotInPacsError(ReissueError):
    """The case's study is in no PACS the gateway reaches (a CLI evaluation of local files, a
    phantom suite): there is nothing to attach a VERIFIED report to, and nothing is sent."""


@dataclass
class Destination:
    """Where the VERIFIED report of a case goes: the study, and whether it is in the PACS
    (``why`` says why not)."""

    study_uid: str
    in_pacs: bool
    why: str = ""


def _find_source(orthanc: OrthancClient, case: Case) -> StudySummary:
    """The case's source study in the PACS (``NotInPacsError`` when there is none)."""
    if not case.provenance.study_uids:
        raise NotInPacsError(
            f"case {case.case_id!r} names no source study (StudyInstanceUID): an evaluation "
            "outside the gateway, of images that are not in a PACS"
        )
    study_uid = case.provenance.study_uids[0]
    # a UID is not an identity: the study of the patient the case's headers name (its
    # patient_id may be a pseudonym), and only one
    ident = case.provenance.identity
    patient_id = ident.patient_id if ident is not None else ""
    try:
        found = orthanc.studies_by_uid(study_uid)
    except OrthancError as exc:
        if exc.status is not None:
            raise
        raise NotInPacsError(
            f"no PACS answered for study {study_uid} of case {case.case_id!r} ({exc})"
        ) from None
    if patient_id:
        found = [s for s in found if s.patient_id == patient_id]
    if not found:
        raise NotInPacsError(
            f"the source study {study_uid} of case {case.case_id!r} is not in the PACS"
        )
    if len(found) > 1:
        raise ReissueError(
            f"the source study of case {case.case_id!r}: {len(found)} patients' studies in PACS "
            "share its StudyInstanceUID and the case names no patient to tell them apart"
        )
    return found[0]


def destination(
    orthanc: OrthancClient,
    run: RunData,
    case_id: str,
    bundle: Path | None,
    recorded: Recorded = None,
) -> Destination:
    """Where a sign-off of the case sends its VERIFIED report, by the rule ``reissue_case``
    follows: a gateway run's study (its evidence recorded: ``recorded``, or in an old
    ``bundle``) is in the PACS, the gateway wrote its UNVERIFIED report there; another run's
    study only if the PACS has it."""
    case = run.case(case_id)
    uids = case.provenance.study_uids
    if recorded is not None or (bundle is not None and os.path.lexists(bundle / EVIDENCE_FILE)):
        return Destination(study_uid=uids[0] if uids else "", in_pacs=True)
    try:
        return Destination(study_uid=_find_source(orthanc, case).study_uid, in_pacs=True)
    except NotInPacsError as exc:
        return Destination(study_uid=uids[0] if uids else "", in_pacs=False, why=str(exc))
    except (ReissueError, OrthancError) as exc:  # there, but not to be told apart, or refused
        return Destination(study_uid=uids[0] if uids else "", in_pacs=True, why=str(exc))


def _source_headers(orthanc: OrthancClient, case: Case) -> list[Dataset]:
    found = _find_source(orthanc, case)
    study_uid, study_id = case.provenance.study_uids[0], found.orthanc_id
    wanted = {i.series_uid for i in case.images if i.series_uid}
    series = [
        s for s in orthanc.list_series(study_id, classify=False) if s.modality in ("MR", "CT")
    ]
    series.sort(key=lambda s: s.series_uid not in wanted)
    if not series:
        raise ReissueError(f"the source study of case {case.case_id!r} has no MR or CT series")
    # by the series' Orthanc id (its patient with its UIDs), not its UIDs alone
    chosen = series[0]
    headers = orthanc.series_headers(chosen.orthanc_id, study_uid, chosen.series_uid)
    headers = headers[:MAX_SOURCE_HEADERS]
    if not headers:
        raise ReissueError("the source series has no readable instance header")
    return headers


def _recorded_headers(bundle: Path | None, case: Case, recorded: Recorded = None) -> list[Dataset]:
    """The evidence recorded at write-back: in the run's record (``recorded`` reads it), else
    in an old report bundle's ``evidence.json``."""
    where = "its run's record" if recorded is not None else str(bundle and bundle / EVIDENCE_FILE)
    try:
        if recorded is not None:
            headers = recorded()
        else:
            assert bundle is not None
            headers = load_evidence(bundle)
    except NoEvidenceError as exc:
        raise ReissueError(f"case {case.case_id!r} cannot be re-issued: {exc}") from None
    study_uid = str(headers[0].StudyInstanceUID)
    # a registered case may name several studies (baseline, follow-up): the gateway evaluated
    # and wrote back to the one it received, whichever it was
    if case.provenance.study_uids and study_uid not in case.provenance.study_uids:
        names = ", ".join(case.provenance.study_uids)
        raise ReissueError(
            f"the evidence recorded for case {case.case_id!r} ({where}) is of "
            f"study {study_uid}, not of a study the case names ({names})"
        )
    return headers


def _number(ds: Dataset) -> int:
    try:
        return int(ds.get("InstanceNumber") or 0)
    except (TypeError, ValueError):
        return 0


def stored_srs(orthanc: OrthancClient, study_uid: str, kind: str = "sr") -> list[Dataset]:
    """Headers of the SRs in the study's NeuroSandbox SR series (``kind``: "sr" UNVERIFIED,
    "sr-verified" VERIFIED), newest first."""
    try:
        items = orthanc.series_metadata(study_uid, series_uid_for(study_uid, kind))
    except OrthancError as exc:
        if exc.status == 404:  # nothing written back yet
            return []
        raise
    return sorted(items, key=lambda d: -_number(d))


def predecessor(srs: list[Dataset], model: str, named: str | None) -> Dataset | None:
    """The UNVERIFIED SR the run wrote for ``model`` (``named``), else that model's newest."""
    of_model = [
        d for d in srs if d.get("VerificationFlag") == "UNVERIFIED" and model_of(d) == model
    ]
    exact = next((d for d in of_model if str(d.SOPInstanceUID) == named), None)
    return exact or (of_model[0] if of_model else None)


@dataclass
class Reissued:
    sr_uids: list[str] = field(default_factory=list)
    pdf_uid: str | None = None
    warnings: list[str] = field(default_factory=list)
    # objects the PACS did not take: kept in the gateway run's record, tried again by the loop
    pending: list[WriteBack] = field(default_factory=list)


@dataclass
class Keeper:
    """Where the VERIFIED objects of a gateway run's case wait when the PACS does not take
    them: the run's record (its pending write-backs) and its folder of kept files."""

    runs: StudyRunStore
    run_id: str  # the gateway run whose record holds them
    kept_root: Path
    by: VerifiedBy  # the sign-off they carry

    def unverified(self) -> list[Dataset]:
        """The run's UNVERIFIED SRs as it wrote them back (its local copies), newest first:
        a PACS other than the local Orthanc is not asked for them."""
        import pydicom

        out = []
        for path in self.runs.get(self.run_id).sr_paths:
            try:
                out.append(pydicom.dcmread(path, stop_before_pixels=True))
            except (OSError, ValueError):  # purged or unreadable: not named
                continue
        return sorted(out, key=lambda d: -_number(d))

    def mine(self, wb: WriteBack) -> bool:
        """Whether a pending object is a VERIFIED object of this case."""
        v = wb.verified
        return v is not None and (v.review_run_id, v.case_id) == (self.by.review_run_id,
                                                                  self.by.case_id)  # fmt: skip


def _when(iso: str) -> datetime:
    """An ISO time from the review log as the local wall-clock time DICOM DT values use."""
    try:
        return datetime.fromisoformat(iso).astimezone().replace(tzinfo=None)
    except ValueError:
        return datetime.now()


def verifiers(verification: Verification, organization: str) -> list[Verifier]:
    out = []
    for s in verification.verifiers:
        if not s.person:
            raise ReissueError(
                f"{s.reviewer} has no person name (family^given) on record: a VERIFIED report "
                "names its verifying observers; create their token with --person"
            )
        out.append(Verifier(person=s.person, organization=organization, at=_when(s.at)))
    return out


def reissue_case(
    orthanc: OrthancClient,
    run: RunData,
    case_id: str,
    verification: Verification,
    organization: str,
    on_stored: Callable[[str], None] = lambda uid: None,
    bundle: Path | None = None,
    note: str = "",
    recorded: Recorded = None,
    to: PacsClient | None = None,
    keeper: Keeper | None = None,
) -> Reissued:
    """Store one VERIFIED SR per model and the VERIFIED checklist PDF of a verified case. Every
    object is built before the first is stored (one that cannot be built stores none);
    ``on_stored`` hears each SOP Instance UID as it is stored. ``bundle``: the report bundle of
    ``run``; ``recorded``: reads the SR's evidence the gateway recorded for the run (else an
    old bundle's ``evidence.json``; else the PACS is asked for the source headers).
    ``note``: said in every SR and the PDF after the clinicians' comments (a superseded
    report version verified knowingly names the newer version). ``to``: the PACS the objects
    are stored in (the PACS file's ``writeback:``); None: ``orthanc``. ``keeper``: a gateway
    run's record and folder, where the objects the PACS does not take are kept and wait for
    the retry loop (``Reissued.pending``); None: the first object not stored raises."""
    if not verification.complete:
        raise ReissueError(f"case {case_id!r} cannot be re-issued: {verification.why_not}")
    if not verification.blocks:
        raise ReissueError(f"case {case_id!r} has no diagnostic answer to report")
    if note:
        verification = _with_note(verification, note)
    case = run.case(case_id)
    signed = verifiers(verification, organization)
    if recorded is not None or (bundle is not None and os.path.lexists(bundle / EVIDENCE_FILE)):
        headers = _recorded_headers(bundle, case, recorded)
        study_uid = str(headers[0].StudyInstanceUID)
    else:
        headers = _source_headers(orthanc, case)
        study_uid = case.provenance.study_uids[0]
    if keeper is not None and to is not None and to.name != LOCAL:  # another PACS holds them
        unverified, earlier = keeper.unverified(), []
    else:
        unverified = stored_srs(orthanc, study_uid)
        earlier = stored_srs(orthanc, study_uid, "sr-verified")
    named = gateway_info(run).get("unverified_sr") or {}
    number = max((_number(d) for d in earlier), default=0) + 1  # next in the VERIFIED series
    out = Reissued()
    srs, models = [], []
    for block in verification.blocks:
        prior = predecessor(unverified, block.model, named.get(block.model))
        replaces = [d for d in (prior, _newest(earlier, block.model)) if d is not None]
        try:
            srs.append(
                build_sr(
                    headers, block.content, block.model, "clinician-verified", number, replaces,
                    verifiers=signed, tracking=run.run_id,
                )
            )  # fmt: skip
        except ReportBuildError as exc:
            raise ReissueError(f"{block.model}: {exc}") from exc
        models.append(block.model)
        number += 1
    pdf = None
    try:
        page = render_verified(run, case_id, verification, organization)
        pdf = build_pdf(headers[0], pdf_bytes(page), _title(verification), number, verified=True)
    except (PdfError, ReportBuildError) as exc:
        out.warnings.append(f"the VERIFIED checklist PDF was not written: {exc}")

    def sr_stored(ds: Dataset) -> None:
        out.sr_uids.append(str(ds.SOPInstanceUID))
        on_stored(str(ds.SOPInstanceUID))

    def pdf_stored(ds: Dataset) -> None:
        out.pdf_uid = str(ds.SOPInstanceUID)
        on_stored(out.pdf_uid)

    target = to if to is not None else orthanc  # ``to``: the configured write-back PACS
    if keeper is not None:  # a gateway run: what the PACS does not take waits in its record
        dest = to if to is not None else local_pacs(orthanc)
        kinds = [*(("verified-sr", m, d) for m, d in zip(models, srs, strict=True)),
                 *((("verified-pdf", None, pdf),) if pdf is not None else ())]  # fmt: skip
        out.pending = _keep_and_deliver(keeper, dest, kinds, sr_stored, pdf_stored)
        return out
    store(target, srs, sr_stored)  # the SRs, then the PDF
    if pdf is not None:
        store(target, [pdf], pdf_stored)
    return out


def local_pacs(orthanc: OrthancClient) -> PacsClient:
    """The local Orthanc as a PACS client (the write-back's default destination)."""
    from gateway.pacs.orthanc_rest import OrthancRestClient

    return OrthancRestClient(LOCAL, orthanc)


def _keep_and_deliver(
    keeper: Keeper,
    dest: PacsClient,
    objects: list[tuple[str, str | None, Dataset]],
    sr_stored: Callable[[Dataset], None],
    pdf_stored: Callable[[Dataset], None],
) -> list[WriteBack]:
    """Each object's file kept and recorded pending in the gateway run before the first store
    (a sign-off's new objects replace the case's earlier ones never stored), then stored with
    a few quick tries; those not stored stay pending for the retry loop. What is pending."""
    hold = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=IN_FLIGHT_S)
    items = [
        (WriteBack(kind=kind, sop_instance_uid=str(ds.SOPInstanceUID), model=model,
                   destination=dest.name, kept=str(keep(keeper.kept_root, keeper.run_id, ds)),
                   verified=keeper.by, next_at=hold.isoformat(timespec="seconds")), ds)
        for kind, model, ds in objects
    ]  # fmt: skip
    new = {wb.sop_instance_uid for wb, _ in items}
    record(keeper.runs, keeper.run_id, pending=[wb for wb, _ in items],
           drop=lambda wb: keeper.mine(wb) and wb.sop_instance_uid not in new)  # fmt: skip
    got = deliver(dest, items, time.time)
    record(keeper.runs, keeper.run_id, done=got.done, pending=got.pending)
    by_uid = {str(ds.SOPInstanceUID): ds for _, ds in items}
    for wb in got.done:
        (pdf_stored if wb.kind == "verified-pdf" else sr_stored)(by_uid[wb.sop_instance_uid])
    return got.pending


def _with_note(v: Verification, note: str) -> Verification:
    blocks = [
        b.model_copy(
            update={
                "content": b.content.model_copy(update={"comments": [*b.content.comments, note]})
            }
        )
        for b in v.blocks
    ]
    return v.model_copy(update={"blocks": blocks})


def _newest(srs: list[Dataset], model: str) -> Dataset | None:
    return next((d for d in srs if model_of(d) == model), None)


def _title(v: Verification) -> str:
    names = ", ".join(display_name(s.person) for s in v.signers)
    when = _when(v.signers[-1].at).strftime("%Y-%m-%d") if v.signers else ""
    return f"NeuroSandbox checklist VERIFIED by {names} {when}"[:64]
