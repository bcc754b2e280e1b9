"""``neurosandbox export-case``: one benchmark case as a de-identified bundle for another site.

Composes ``dicom`` (the study through the PS3.15 basic profile, read back and checked) and
``evaluation`` (the record, note and ground truth through the PHI gate's scrub, written as a
one-case manifest, loaded back as the other site will). Everything is written into a hidden
folder beside the target and renamed into place only when every check has passed: a failed
export leaves nothing behind.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
import secrets
import shutil
import time
import warnings
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import BaseModel, Field
from rich.markup import escape

from dicom import (
    DeidentifiedStudy,
    DeidSummary,
    ExportedSeries,
    SkippedSeries,
    SourceIdentifiers,
    atomic_write,
)
from gateway.cli.console import console, fail

if TYPE_CHECKING:
    from evaluation import Case

DEFAULT_SALT_ENV = "NEUROSANDBOX_DEID_SALT"
REPORT_FILE = "deidentification.json"


class BundleCheck(BaseModel):
    """What reading the bundle back found (written into the bundle once it has passed)."""

    dicom_files_read_back: int = 0
    series_read_back: int = 0
    files_searched: int = 0  # every file of the bundle, bytes searched for the identifiers
    identifier_terms: int = 0  # how many strings were looked for (their values never written)
    original_uids: int = 0
    manifest_loads: bool = False
    images_rendered: int = 0
    problems: list[str] = Field(default_factory=list)


class ExportReport(BaseModel):
    """``deidentification.json``: what was done to the case (keywords and counts, no values)."""

    schema_version: int = 1
    case_id: str
    profile: str = "DICOM PS3.15 Annex E Basic Application Level Confidentiality Profile"
    dates: str
    descriptions: str
    burned_in: str
    pseudonymisation: str
    dicom: DeidSummary
    series: list[ExportedSeries]
    skipped: list[SkippedSeries]
    record_removed: dict[str, int]
    text_redactions: dict[str, int]
    record_dates: str
    check: BundleCheck


def export_case_command(
    suite: Annotated[
        Path,
        typer.Option(
            "--suite",
            help="dataset the case is in: a suite folder (one folder per case) or a case "
            "manifest (YAML/JSON)",
        ),
    ],
    case: Annotated[str, typer.Option("--case", help="id of the case to export")],
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            help="bundle to create: a folder, or a .zip archive of that folder; must not exist",
        ),
    ],
    kind: Annotated[
        str, typer.Option("--kind", help="dataset kind: auto, suite or manifest")
    ] = "auto",
    new_id: Annotated[
        str | None,
        typer.Option(
            "--new-id",
            help="case id in the bundle (default: the case's own; give one when the id itself "
            "names the patient or the study)",
        ),
    ] = None,
    dates: Annotated[
        str,
        typer.Option(
            "--dates",
            help="shift: every date moved by one secret per-patient offset, intervals kept "
            "(PS3.15 option 113107); remove: dates emptied (the record's age is lost)",
        ),
    ] = "shift",
    descriptions: Annotated[
        str,
        typer.Option(
            "--descriptions",
            help="clean: series/study descriptions and protocol names kept, cleaned of names "
            "and IDs (option 113105; the receiving site's classifier reads them); remove",
        ),
    ] = "clean",
    allow_burned_in: Annotated[
        bool,
        typer.Option(
            "--allow-burned-in",
            help="export series whose pixels may show text (burned-in annotation, secondary "
            "captures) and flag them, instead of leaving them out; only after the pixels were "
            "reviewed",
        ),
    ] = False,
    salt_env: Annotated[
        str,
        typer.Option(
            "--salt-env",
            help="environment variable holding the secret that keys pseudonyms, new UIDs and "
            "the date shift (same secret, same bundle); unset: a one-time random secret",
        ),
    ] = DEFAULT_SALT_ENV,
) -> None:
    """Write one case as a de-identified bundle to share with another site, and verify it.

    The bundle: the study through the PS3.15 basic profile (dicom/S01_MR/IM0001.dcm ...), the record (ehr.json) and note (note.txt) through the PHI gate's scrub, the ground truth, manifest.yaml (the other site runs `neurosandbox eval --suite BUNDLE/manifest.yaml`) and deidentification.json (what was done, no values).

    Every file is read back and searched for the source's identifiers, and the manifest is loaded, before the bundle appears. Exit 1, with nothing written, when a check fails; exit 2 on bad arguments.
    """
    from dicom import DeidPolicy, ImagingError, credential, deidentify_study
    from evaluation import EvaluationError
    from evaluation.datasets import find_case
    from gateway.settings import get_settings

    settings = get_settings()
    if dates not in ("shift", "remove"):
        raise fail(f"--dates is shift or remove, not {dates!r}", 2)
    if descriptions not in ("clean", "remove"):
        raise fail(f"--descriptions is clean or remove, not {descriptions!r}", 2)
    if kind not in ("auto", "suite", "manifest"):
        raise fail(f"--kind is auto, suite or manifest, not {kind!r}", 2)
    as_zip = out.suffix.lower() == ".zip"
    if out.exists() or out.is_symlink():
        raise fail(f"{out} exists: give a new bundle folder or .zip", 2)
    if not out.parent.is_dir():
        raise fail(f"{out.parent} is not a folder", 2)
    if new_id is not None and (not new_id.strip() or "/" in new_id or new_id.startswith(".")):
        raise fail(f"--new-id {new_id!r}: give a plain case id", 2)
    try:
        source = find_case(suite, case, settings.cache_dir.expanduser().resolve(), kind)
    except EvaluationError as exc:
        raise fail(str(exc), 2) from None
    if not source.study_path or not Path(source.study_path).exists():
        raise fail(f"case {case} has no DICOM study to export", 2)
    salt = credential(salt_env) or ""
    if not salt.strip():
        salt = secrets.token_hex(32)
        console.print(
            f"[yellow]note:[/yellow] ${escape(salt_env)} is not set: a one-time random secret "
            "keys this bundle (pseudonym, UIDs and date shift differ from any other export)"
        )
    policy = DeidPolicy(
        salt=salt,
        keep_dates=dates == "shift",
        keep_descriptions=descriptions == "clean",
        allow_burned_in=allow_burned_in,
    )
    t0 = time.perf_counter()
    work = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    try:
        try:
            with warnings.catch_warnings():
                # pydicom's complaints about the source's own values (an over-long LO...):
                # what the profile keeps is checked by reading the output back.
                warnings.simplefilter("ignore", UserWarning)
                study = deidentify_study(
                    Path(source.study_path),
                    work / "dicom",
                    policy,
                    memory_cap=settings.memory_cap,
                    workers=settings.workers,
                )
        except (ImagingError, OSError) as exc:
            raise fail(f"case {case}: the study could not be de-identified: {exc}") from None
        report = _compose(work, source, study, new_id or case, salt, settings.cache_dir)
        for skipped in study.skipped:
            detail = f" ({skipped.detail})" if skipped.detail else ""
            console.print(f"  [yellow]left out:[/yellow] {escape(_skipped_line(skipped) + detail)}")
        if report.check.problems:
            for problem in report.check.problems:
                console.print(f"  [red]check failed:[/red] {escape(problem)}")
            raise fail(
                f"case {case}: the bundle did not pass verification "
                f"({len(report.check.problems)} problem(s)); nothing was written"
            )
        try:
            _publish(work, out, as_zip)
        except OSError as exc:
            raise fail(f"{out}: the bundle could not be put in place: {exc}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _print_summary(out, report, time.perf_counter() - t0)


def _compose(
    work: Path, source: Case, study: DeidentifiedStudy, case_id: str, salt: str, cache_dir: Path
) -> ExportReport:
    """Write the record, note, ground truth and manifest beside the study; check everything."""
    from dicom import verify_deidentified_study
    from evaluation import EvaluationError
    from evaluation.datasets import load_shared_case, share_case, write_case_manifest

    shared = share_case(
        source,
        case_id=case_id,
        patient_id=study.pseudonym,
        terms=study.identifiers.terms(),
        date_shift_days=study.date_shift_days,
        salt=salt,
    )
    manifest = write_case_manifest(work, shared)
    identifiers = study.identifiers.with_terms(shared.terms, "the case's record")
    check = BundleCheck(
        identifier_terms=len(identifiers.values), original_uids=len(identifiers.uids)
    )
    report = ExportReport(
        case_id=case_id,
        dates=(
            "shifted by one secret per-patient offset (113107)"
            if study.date_shift_days is not None
            else "removed"
        ),
        descriptions="cleaned (113105)" if "113105" in study.summary.method_codes else "removed",
        burned_in="exported and flagged" if study.allow_burned_in else "left out",
        pseudonymisation="patient name and ID replaced by a keyed pseudonym; instance UIDs "
        "remapped to 2.25 UIDs under the same secret",
        dicom=study.summary,
        series=study.series,
        skipped=study.skipped,
        record_removed=shared.record_removed,
        text_redactions=shared.redactions,
        record_dates=shared.dates,
        check=check,
    )
    # Written before the search, so that the report itself is searched too.
    _write_report(work, report)
    dicom_check = verify_deidentified_study(work / "dicom", study, identifiers)
    check.dicom_files_read_back = dicom_check.files_checked
    check.series_read_back = dicom_check.series_checked
    check.problems.extend(f"dicom/{p}" for p in dicom_check.problems)
    dicom_files = {f"dicom/{f}" for f in study.files}
    for path in sorted(p for p in work.rglob("*") if p.is_file()):
        rel = str(path.relative_to(work))
        check.files_searched += 1
        if rel in dicom_files:
            continue  # searched with its pixel data set apart, above
        for keyword in _search_file(path, identifiers):
            check.problems.append(f"{rel}: the source's {keyword} value is in it")
    try:
        loaded = load_shared_case(manifest, shared, cache_dir.expanduser().resolve())
    except EvaluationError as exc:
        check.problems.append(f"{manifest.name}: does not load as a case: {exc}")
    else:
        check.manifest_loads = True
        check.images_rendered = len(loaded.images)
    _write_report(work, report)  # with the checks' results
    for keyword in identifiers.find((work / REPORT_FILE).read_bytes()):
        check.problems.append(f"{REPORT_FILE}: the source's {keyword} value is in it")
    check.problems = list(dict.fromkeys(check.problems))
    return report


def _write_report(work: Path, report: ExportReport) -> None:
    (work / REPORT_FILE).write_text(report.model_dump_json(indent=1) + "\n", encoding="utf-8")


def _search_file(path: Path, identifiers: SourceIdentifiers) -> list[str]:
    """Identifiers in a file's bytes, and in the decoded text attachments of a JSON record."""
    data = path.read_bytes()
    found = set(identifiers.find(data))
    if path.suffix == ".json":
        try:
            doc = json.loads(data)
        except ValueError:
            doc = None
        for blob in _attachments(doc):
            found.update(identifiers.find(blob))
    return sorted(found)


def _attachments(node: Any, depth: int = 0) -> list[bytes]:
    """Decoded base64 ``data`` of every attachment in a JSON document (the note lives there)."""
    if depth > 64:
        return []
    out: list[bytes] = []
    if isinstance(node, dict):
        data = node.get("data")
        if isinstance(data, str):
            with contextlib.suppress(binascii.Error, ValueError):
                out.append(base64.b64decode(data, validate=True))
        for value in node.values():
            out.extend(_attachments(value, depth + 1))
    elif isinstance(node, list):
        for value in node:
            out.extend(_attachments(value, depth + 1))
    return out


def _publish(work: Path, out: Path, as_zip: bool) -> None:
    """Rename the checked folder into place, or zip it (under the bundle's name) and rename the
    archive; refuses to replace anything that appeared meanwhile."""
    if not as_zip:
        os.rename(work, out)  # fails if `out` appeared meanwhile (a non-empty folder or a file)
        return
    top = out.stem
    with atomic_write(out, "w+b", fsync=False) as fh:
        with zipfile.ZipFile(fh, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            for path in sorted(p for p in work.rglob("*") if p.is_file()):
                zf.write(path, f"{top}/{path.relative_to(work)}")
        fh.seek(0)
        with zipfile.ZipFile(fh) as zf:
            if zf.testzip() is not None:
                raise OSError(f"{out}: the archive does not read back")
        if out.exists():
            raise OSError(f"{out} appeared while the bundle was written")


def _skipped_line(s: SkippedSeries) -> str:
    what = " ".join(
        v
        for v in (
            f"series {s.series_number}" if s.series_number is not None else "",
            s.modality,
            s.series_class,
        )
        if v
    )
    return f"{what or 'files'}: {s.n_files} file(s): {s.reason}"


def _print_summary(out: Path, report: ExportReport, seconds: float) -> None:
    n_files = sum(len(s.files) for s in report.series)
    console.print(
        f"exported case {escape(report.case_id)} to {escape(str(out))}: {n_files} DICOM file(s) "
        f"in {len(report.series)} series ({seconds:.1f} s)"
    )
    for s in report.series:
        flag = f"  [yellow]burned-in: {escape(s.burned_in)}[/yellow]" if s.burned_in else ""
        console.print(
            f"  {escape(s.folder)}: {escape(s.series_class)} {escape(s.description)} "
            f"({len(s.files)} files){flag}"
        )
    if report.skipped:
        console.print(f"  left out: {len(report.skipped)} group(s) of objects (see above)")
    d = report.dicom
    console.print(
        f"  DICOM: removed {len(d.removed)} attribute(s), emptied {len(d.emptied)}, replaced "
        f"{len(d.replaced)}, {len(d.uids_remapped)} UID attribute(s) remapped, dates "
        f"{escape(report.dates)}, {d.private_tags_removed} private tag(s) removed"
    )
    console.print(f"    removed: {escape(', '.join(d.removed) or '-')}")
    console.print(f"    emptied: {escape(', '.join(d.emptied) or '-')}")
    record = ", ".join(f"{k} ({v})" for k, v in sorted(report.record_removed.items()))
    if report.record_dates == "none":
        console.print("  record: none in the case")
    else:
        console.print(
            f"  record: removed {escape(record or 'nothing')}; dates {report.record_dates}"
        )
    redactions = ", ".join(f"{k} {v}" for k, v in sorted(report.text_redactions.items()))
    console.print(f"  text redactions: {escape(redactions or 'none')}")
    c = report.check
    console.print(
        f"  verified: {c.dicom_files_read_back} DICOM file(s) read back, {c.files_searched} "
        f"file(s) searched for {c.identifier_terms} identifying string(s) and {c.original_uids} "
        f"original UID(s): none found; the manifest loads ({c.images_rendered} image(s) render)"
    )
